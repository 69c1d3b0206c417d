"""Static SASS inventory of built candidates: opcodes per kernel, target families present."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ptxgym import paths, sass
from ptxgym.cli import main
from ptxgym.compiler import CompileResult, compile_source
from ptxgym.evaluator import CompileOnlyEvaluator
from ptxgym.feedback import render_feedback
from ptxgym.outcome import Status
from ptxgym.sass import SassInventory, parse_sass
from ptxgym.tasks import get_task

H100 = get_task("PTX-H100-GEMM")
B200 = get_task("PTX-B200-GEMM")
NAIVE_GEMM = paths.examples_dir() / "naive" / "gemm.cu"
ENTRY = (
    'extern "C" int gemm(const __nv_bfloat16* A, const __nv_bfloat16* B, __nv_bfloat16* C, '
    "int M, int N, int K, cudaStream_t stream)"
)

# One TMA tile load and one wgmma (fence, mma, commit, wait); the math need not be right.
WGMMA_TMA = (
    '#include "ptxgym_h100.cuh"\n'
    """
__global__ void __launch_bounds__(128, 1)
    wgmma_tma_kernel(const __grid_constant__ CUtensorMap tmap_a, __nv_bfloat16* C) {
  __shared__ __align__(1024) __nv_bfloat16 tile_a[64 * 64];
  __shared__ __align__(1024) __nv_bfloat16 tile_b[64 * 64];
  __shared__ __align__(8) uint64_t bar;
  if (threadIdx.x == 0) {
    ptx::mbar_init(&bar, 1);
    ptx::fence_mbarrier_init();
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    ptx::mbar_arrive_expect_tx(&bar, sizeof(tile_a));
    ptx::tma_load_2d(tile_a, &tmap_a, &bar, 0, static_cast<int32_t>(blockIdx.x) * 64);
  }
  ptx::mbar_wait(&bar, 0);
  float acc[32] = {};
  ptx::wgmma_fence();
  ptx::wgmma_m64n64k16_ss(acc, ptx::make_desc_kmajor_sw128(tile_a),
                          ptx::make_desc_kmajor_sw128(tile_b), 0);
  ptx::wgmma_commit();
  ptx::wgmma_wait<0>();
  C[threadIdx.x] = __float2bfloat16(acc[0] + acc[31]);
}
"""
    + ENTRY
    + """ {
  CUtensorMap tmap_a;
  if (ptx::make_tmap_2d(&tmap_a, A, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, K, M, K * 2, 64, 64,
                        CU_TENSOR_MAP_SWIZZLE_128B) != CUDA_SUCCESS) {
    return static_cast<int>(cudaErrorInvalidValue);
  }
  wgmma_tma_kernel<<<M / 64, 128, 0, stream>>>(tmap_a, C);
  return static_cast<int>(cudaGetLastError());
}
"""
)

# The wgmma sits on a branch no launch takes (M is never negative): it is still compiled in.
WGMMA_NEVER_TAKEN = (
    '#include "ptxgym_h100.cuh"\n'
    """
__global__ void __launch_bounds__(128, 1) guarded_kernel(__nv_bfloat16* C, int M) {
  __shared__ __align__(1024) __nv_bfloat16 tile[64 * 64];
  float acc[32] = {};
  if (M < 0) {
    ptx::wgmma_fence();
    ptx::wgmma_m64n64k16_ss(acc, ptx::make_desc_kmajor_sw128(tile),
                            ptx::make_desc_kmajor_sw128(tile), 0);
    ptx::wgmma_commit();
    ptx::wgmma_wait<0>();
  }
  C[threadIdx.x] = __float2bfloat16(acc[0]);
}
"""
    + ENTRY
    + """ {
  guarded_kernel<<<1, 128, 0, stream>>>(C, M);
  return static_cast<int>(cudaGetLastError());
}
"""
)

# TMEM allocation, one tcgen05.mma with its commit, and the tcgen05.ld readback.
TCGEN05 = (
    '#include "ptxgym_b200.cuh"\n'
    """
__global__ void __launch_bounds__(128, 1) tcgen05_kernel(__nv_bfloat16* C) {
  __shared__ __align__(1024) __nv_bfloat16 tile_a[128 * 64];
  __shared__ __align__(1024) __nv_bfloat16 tile_b[64 * 64];
  __shared__ __align__(8) uint64_t bar;
  __shared__ uint32_t tmem_base;
  if (ptx::warp_idx() == 0) ptx::tmem_alloc(&tmem_base, 64);
  if (threadIdx.x == 0) {
    ptx::mbar_init(&bar, 1);
    ptx::fence_mbarrier_init();
  }
  ptx::tc_fence_before_sync();
  __syncthreads();
  ptx::tc_fence_after_sync();
  const uint32_t base = tmem_base;
  if (threadIdx.x == 0) {
    ptx::umma_bf16_ss(base, ptx::make_desc_kmajor_sw128(tile_a),
                      ptx::make_desc_kmajor_sw128(tile_b), ptx::make_idesc_bf16_f32(128, 64), 0);
    ptx::umma_commit(&bar);
  }
  ptx::mbar_wait(&bar, 0);
  ptx::tc_fence_after_sync();
  uint32_t r[8];
  ptx::tmem_ld_32x32b_x8(ptx::tmem_addr(base, 32 * (ptx::warp_idx() % 4), 0), r);
  ptx::tmem_wait_ld();
  C[threadIdx.x] = __float2bfloat16(__uint_as_float(r[0]) + __uint_as_float(r[7]));
  ptx::tc_fence_before_sync();
  __syncthreads();
  if (ptx::warp_idx() == 0) ptx::tmem_dealloc(base, 64);
}
"""
    + ENTRY
    + """ {
  tcgen05_kernel<<<1, 128, 0, stream>>>(C);
  return static_cast<int>(cudaGetLastError());
}
"""
)


def _inventory(build: CompileResult) -> SassInventory:
    assert build.ok, build.log
    assert build.sass is not None and build.sass.error is None, build.sass
    return build.sass


def _only_kernel(inventory: SassInventory, name: str) -> dict[str, int]:
    assert [kernel.name for kernel in inventory.kernels] == [name]
    return inventory.kernels[0].opcodes


@pytest.mark.nvcc
def test_naive_gemm_has_ffma_and_no_target_family() -> None:
    inventory = _inventory(compile_source(NAIVE_GEMM.read_text(), H100))
    opcodes = _only_kernel(
        inventory,
        "(anonymous namespace)::gemm_tn_kernel(__nv_bfloat16 const*, __nv_bfloat16 const*, "
        "__nv_bfloat16*, int, int, int, bool, bool)",
    )
    assert opcodes["FFMA"] >= 8 * 8 * 16  # the unrolled 8x8 sub-tile over a 16-deep K step
    assert "HGMMA" not in opcodes and "UTMALDG" not in opcodes
    assert inventory.families_present == {"compute": False, "data_movement": False}
    assert "cuobjdump" in inventory.tool


@pytest.mark.nvcc
def test_wgmma_and_tma_candidate_shows_hgmma_and_utmaldg() -> None:
    build = compile_source(WGMMA_TMA, H100)
    inventory = _inventory(build)
    opcodes = _only_kernel(inventory, "wgmma_tma_kernel(CUtensorMap_st, __nv_bfloat16*)")
    assert opcodes["HGMMA"] == 1 and opcodes["UTMALDG"] == 1
    assert opcodes["WARPGROUP"] == 2  # wgmma.fence -> ARRIVE, wgmma.wait_group -> DEPBAR
    assert inventory.families_present == {"compute": True, "data_movement": True}

    # The inventory is cached with the build and comes back equal.
    cached = compile_source(WGMMA_TMA, H100)
    assert cached.cached and cached.sass == inventory


@pytest.mark.nvcc
def test_wgmma_on_a_branch_never_taken_is_still_present_statically() -> None:
    inventory = _inventory(compile_source(WGMMA_NEVER_TAKEN, H100))
    opcodes = _only_kernel(inventory, "guarded_kernel(__nv_bfloat16*, int)")
    assert opcodes["HGMMA"] == 1
    assert inventory.families_present == {"compute": True, "data_movement": False}


@pytest.mark.nvcc
def test_tcgen05_candidate_shows_utc_mma_and_ldtm() -> None:
    inventory = _inventory(compile_source(TCGEN05, B200))
    opcodes = _only_kernel(inventory, "tcgen05_kernel(__nv_bfloat16*)")
    assert opcodes["UTCHMMA"] == 1 and opcodes["LDTM"] == 1
    assert "UTMALDG" not in opcodes and "UBLKCP" not in opcodes
    assert inventory.families_present == {"compute": True, "data_movement": False}


@pytest.mark.nvcc
def test_feedback_and_json_report_the_inventory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    outcome = CompileOnlyEvaluator().evaluate(H100, WGMMA_NEVER_TAKEN)
    assert outcome.status is Status.COMPILED
    text = render_feedback(outcome, H100)
    assert "In SASS (static; presence alone does not qualify" in text
    assert (
        "- wgmma (HGMMA): present in guarded_kernel(__nv_bfloat16*, int) (1 static instruction)\n"
        in text
    )
    assert "- TMA (UTMALDG/UBLKCP): absent" in text

    candidate = tmp_path / "candidate.cu"
    candidate.write_text(WGMMA_NEVER_TAKEN)
    assert main(["compile", "PTX-H100-GEMM", str(candidate), "--json"]) == 0
    reported = json.loads(capsys.readouterr().out)["compile"]["sass"]
    assert reported["families_present"] == {"compute": True, "data_movement": False}
    assert reported["kernels"][0]["opcodes"]["HGMMA"] == 1


@pytest.mark.nvcc
def test_missing_or_failing_tool_is_reported_and_the_build_still_succeeds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(sass, "find_cuobjdump", lambda: None)
    outcome = CompileOnlyEvaluator().evaluate(H100, NAIVE_GEMM.read_text() + "\n// no tool\n")
    assert outcome.status is Status.COMPILED
    build = outcome.compile
    assert build is not None and build.library is not None
    assert build.sass is not None and build.sass.kernels == ()
    assert build.sass.error is not None and "cuobjdump was not found" in build.sass.error
    assert "In SASS: not inspected (cuobjdump was not found" in render_feedback(outcome, H100)

    monkeypatch.setattr(sass, "find_cuobjdump", lambda: Path("/bin/false"))
    failed = sass.inventory(Path(build.library), H100)
    assert failed.error is not None and failed.error.startswith("cuobjdump failed with exit code")
    assert failed.families_present == {}


def test_parse_sass_reads_mnemonics_of_the_target_arch_only() -> None:
    listing = """
Fatbin elf code:
================
arch = sm_90a

	code for sm_90a
		Function : _Z1kv
	.headerflags	@"EF_CUDA_ACCELERATORS EF_CUDA_SM90 EF_CUDA_VIRTUAL_SM(EF_CUDA_SM90)"
        /*0000*/                   HGMMA.64x64x16.F32.BF16 R24, gdesc[UR4], RZ, !UPT, gsb0 ;  /* 0x00e00000041879f0 */
                                                                                              /* 0x000fe20000000800 */
        /*0010*/              @!P0 BRA 0x2b0 ;    /* 0x0000000000940947 */
        /*0020*/                   @!UP0 SYNCS.EXCH.64 URZ, [UR6], UR4 ;   /* 0x00000004063f85b2 */
        /*0030*/                   EXIT ;   /* 0x000000000000794d */
        /*0040*/                   BRA 0x40;   /* 0xfffffffc00fc7947 */
		..........

Fatbin elf code:
================
arch = sm_100a

	code for sm_100a
		Function : _Z1kv
        /*0000*/                   UTCHMMA gdesc[UR4], gdesc[UR6], tmem[UR9], idesc[UR11], !UPT ;  /* 0x0 */
"""  # noqa: E501
    (kernel,) = parse_sass(listing, "sm_90a")
    assert kernel.name == "k()"
    assert kernel.opcodes == {"BRA": 2, "EXIT": 1, "HGMMA": 1, "SYNCS": 1}
    assert parse_sass(listing, "sm_89") == ()
