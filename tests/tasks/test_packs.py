"""Knowledge packs (packs/{h100,b200}/): files present, size budget, and wrappers.cuh compiling.

The compile test builds a tiny driver translation unit that includes the pack's wrappers.cuh and
calls every wrapper (and the host helpers) into a shared library with zero warnings, for the
pack's architecture. It needs nvcc but no GPU.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

PACKS_DIR = Path(__file__).resolve().parents[2] / "packs"
PACK_FILES = ("params.md", "wrappers.cuh", "contracts.md", "scheduling.md")
ARCH_FLAGS = {
    "h100": "arch=compute_90a,code=sm_90a",
    "b200": "arch=compute_100a,code=sm_100a",
}
TOKENS_MIN, TOKENS_MAX = 20_000, 30_000

# Shared host entry: encodes tensor maps through the driver entry point and launches `drive`.
_HOST_ENTRY = r"""
extern "C" int host_entry(void* gptr, float* out, uint32_t* uout, cudaStream_t stream) {
  CUtensorMap m2, m3;
  const uint64_t dims[2] = {128, 128};
  const uint64_t strides[1] = {256};
  const uint32_t box[2] = {64, 128};
  if (ptx::tmap_check(gptr, 2, dims, strides, box, 2, CU_TENSOR_MAP_SWIZZLE_128B) != nullptr) {
    return 1;
  }
  if (ptx::get_tensor_map_encoder() == nullptr) return 2;
  CUresult r = ptx::make_tmap_2d(&m2, gptr, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, 128, 128, 256,
                                 64, 128, CU_TENSOR_MAP_SWIZZLE_128B);
  if (r != CUDA_SUCCESS) return 3;
  r = ptx::make_tmap_3d(&m3, gptr, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, 64, 128, 2, 256, 128,
                        64, 128, 2, CU_TENSOR_MAP_SWIZZLE_128B);
  if (r != CUDA_SUCCESS) return 4;
  if (ptx::set_max_dynamic_smem(drive, 100000) != cudaSuccess) return 5;
  return static_cast<int>(ptx::launch_cluster(drive, dim3(2), dim3(THREADS), 100000, stream, 2,
                                              m2, out, uout, gptr));
}
"""

# Producer-side calls common to both architectures (one elected thread of warp 0).
_TMA_CALLS = r"""
    ptx::mbar_arrive_expect_tx(bar, 4 * 16384);
    ptx::tma_load_2d(smem, &tmap, bar, 0, 0);
    ptx::tma_load_3d(smem + 16384, &tmap, bar, 0, 0, 0);
    ptx::tma_load_2d_multicast(smem + 32768, &tmap, bar, 0, 0, 1);
    ptx::tma_load_2d_evict_last(smem + 49152, &tmap, bar, 0, 0);
    ptx::mbar_expect_tx(bar + 1, 16);
    ptx::bulk_copy_g2s(smem + 59904, gmem, 16, bar + 1);
    ptx::mbar_wait(bar, 0);
    ptx::mbar_wait_cluster(bar + 1, 0);
"""

_STORE_CALLS = r"""
    ptx::fence_proxy_async_smem();
    ptx::fence_proxy_async_global();
    ptx::fence_proxy_async();
    ptx::fence_acq_rel_cluster();
    ptx::tma_store_2d(&tmap, smem, 0, 0);
    ptx::tma_store_3d(&tmap, smem, 0, 0, 0);
    ptx::tma_reduce_add_2d(&tmap, smem, 0, 0);
    ptx::bulk_copy_s2g(gmem, smem, 16);
    ptx::bulk_commit_group();
    ptx::bulk_wait_group_read<0>();
    ptx::bulk_wait_group<0>();
    (void)ptx::mbar_arrive(bar + 1);
    ptx::mbar_arrive_cluster(bar + 1, ptx::cluster_ctarank());
    ptx::mbar_arrive_cluster_cta(bar + 1, ptx::cluster_ctarank());
    if (ptx::mbar_try_wait(bar + 1, 1)) acc_u += 1;
"""

_KERNEL_TAIL = r"""
  const uint32_t peer = ptx::mapa_shared(ptx::smem_u32(smem), ptx::cluster_nctarank() - 1);
  ptx::st_shared_cluster_u32(peer, acc_u);
  acc_u += ptx::ld_shared_cluster_u32(peer) + ptx::cluster_id_x();
  ptx::cluster_arrive_relaxed();
  ptx::cluster_wait();
  ptx::cluster_arrive();
  ptx::cluster_wait();
  if (threadIdx.x == 0) ptx::mbar_inval(bar);
  uout[threadIdx.x] = acc_u;
}
"""

_KERNEL_HEAD = r"""
__global__ void __launch_bounds__(THREADS, 1)
    drive(const __grid_constant__ CUtensorMap tmap, float* out, uint32_t* uout, void* gmem) {
  extern __shared__ __align__(1024) uint8_t smem[];
  uint64_t* bar = reinterpret_cast<uint64_t*>(smem + 65536);
  uint32_t acc_u = ptx::lane_id() + ptx::warp_idx() + ptx::swizzle_128b(threadIdx.x * 16);
  if (threadIdx.x == 0) {
    ptx::mbar_init(bar, 1);
    ptx::mbar_init(bar + 1, 1);
    ptx::fence_mbarrier_init();
    ptx::prefetch_tmap(&tmap);
  }
"""

_H100_DRIVER = (
    r"""
#include "wrappers.cuh"
#define THREADS 384

// Every wgmma shape / form of the pack on one accumulator array of N/2 floats.
template <int N>
__device__ float run_wgmma(uint64_t da, uint64_t db, uint64_t dmn, const uint32_t (&a)[4]) {
  float d[N / 2] = {};
  ptx::fence_regs(d);
  ptx::wgmma_fence();
  if constexpr (N == 64) {
    ptx::wgmma_m64n64k16_ss(d, da, db, 0);
    ptx::wgmma_m64n64k16_rs<1>(d, a, dmn, 1);
  } else if constexpr (N == 96) {
    ptx::wgmma_m64n96k16_ss(d, da, db, 0);
    ptx::wgmma_m64n96k16_rs(d, a, db, 1);
  } else if constexpr (N == 128) {
    ptx::wgmma_m64n128k16_ss<0, 1>(d, da, dmn, 0);
    ptx::wgmma_m64n128k16_rs(d, a, db, 1);
  } else if constexpr (N == 192) {
    ptx::wgmma_m64n192k16_ss(d, da, db, 0);
  } else {
    ptx::wgmma_m64n256k16_ss(d, da, db, 0);
    ptx::wgmma_m64n256k16_rs(d, a, db, 1);
  }
  ptx::wgmma_ss<N>(d, da, db, 1);
  if constexpr (N != 192) ptx::wgmma_rs<N, 1>(d, a, dmn, 1);
  ptx::wgmma_commit();
  ptx::wgmma_wait<1>();
  ptx::wgmma_wait<0>();
  ptx::fence_regs(d);
  float s = 0.f;
#pragma unroll
  for (int i = 0; i < N / 2; ++i) s += d[i];
  return s;
}
"""
    + _KERNEL_HEAD
    + r"""
  __syncthreads();
  ptx::cluster_sync();
  if (ptx::warpgroup_idx() == 0) {
    ptx::setmaxnreg_dec<40>();
    if (ptx::warp_idx() == 0 && ptx::elect_one_sync()) {
"""
    + _TMA_CALLS
    + _STORE_CALLS
    + r"""
    }
  } else {
    ptx::setmaxnreg_inc<232>();
    const uint32_t t = threadIdx.x % 128;
    const uint64_t da = ptx::make_desc_kmajor_sw128(smem);
    const uint64_t dk = ptx::make_smem_desc(smem + 8192, ptx::kSwizzle64B, 16, 512);
    const uint64_t db = ptx::desc_advance(dk, 32);
    const uint64_t dmn = ptx::make_desc_mnmajor_sw128(smem + 16384, 8192);
    uint32_t a[4];
    for (int i = 0; i < 4; ++i) a[i] = ptx::pack_bf16x2(static_cast<float>(i), 1.f * t);
    ptx::fence_regs(a);
    float s = 0.f;
    switch (static_cast<int>(gmem != nullptr) + static_cast<int>(t % 5)) {
      case 0: s = run_wgmma<64>(da, db, dmn, a); break;
      case 1: s = run_wgmma<96>(da, db, dmn, a); break;
      case 2: s = run_wgmma<128>(da, db, dmn, a); break;
      case 3: s = run_wgmma<192>(da, db, dmn, a); break;
      default: s = run_wgmma<256>(da, db, dmn, a); break;
    }
    uint32_t row, col;
    ptx::wgmma_acc_coord(t, 3, row, col);
    uint32_t r[4];
    ptx::ldmatrix_x4(r, smem + t * 16);
    ptx::ldmatrix_x4_trans(r, smem + t * 16);
    ptx::stmatrix_x4(smem + 32768 + t * 16, r);
    ptx::stmatrix_x4_trans(smem + 32768 + t * 16, r);
    ptx::named_bar_sync(1, 256);
    ptx::named_bar_arrive(2, 256);
    s += ptx::ex2_approx(s);
    out[threadIdx.x] = s + static_cast<float>(row + col + r[0] + ptx::warpgroup_idx());
  }
"""
    + _KERNEL_TAIL
    + _HOST_ENTRY
)

_B200_DRIVER = (
    r"""
#include "wrappers.cuh"
#define THREADS 256
"""
    + _KERNEL_HEAD
    + r"""
  uint32_t* tmem_slot = reinterpret_cast<uint32_t*>(smem + 65536 + 64);
  const uint32_t warp = ptx::warp_idx();
  if (warp == 1) {
    ptx::tmem_alloc(tmem_slot, 256);
    ptx::tmem_relinquish_alloc_permit();
  }
  ptx::tc_fence_before_sync();
  __syncthreads();
  ptx::tc_fence_after_sync();
  ptx::cluster_sync();
  const uint32_t tmem = *tmem_slot;
  if (ptx::warpgroup_idx() == 0) {
    ptx::setmaxnreg_dec<56>();
  } else {
    ptx::setmaxnreg_inc<200>();
  }
  if (warp == 0 && ptx::elect_one_sync()) {
"""
    + _TMA_CALLS
    + r"""
    constexpr uint32_t idesc = ptx::make_idesc_bf16_f32(128, 256);
    constexpr uint32_t idesc_t = ptx::make_idesc_bf16_f32(128, 128, false, true);
    static_assert(idesc == 0x08400490u, "instruction descriptor bit layout");
    const uint64_t da = ptx::make_desc_kmajor_sw128(smem);
    const uint64_t db = ptx::desc_advance(ptx::make_desc_kmajor_sw128(smem + 16384), 32);
    const uint64_t dmn = ptx::make_desc_mnmajor_sw128(smem + 32768, 8192);
    const uint64_t dx = ptx::make_smem_desc(smem + 8192, ptx::kSwizzle64B, 16, 512);
    ptx::umma_bf16_ss(tmem, da, db, idesc, 0);
    ptx::umma_bf16_ss(tmem, da, dx, idesc, 1);
    ptx::umma_bf16_ts(ptx::tmem_addr(tmem, 0, 256), tmem, dmn, idesc_t, 1);
    ptx::umma_commit(bar + 1);
  }
  ptx::mbar_wait(bar + 1, 1);
  ptx::tc_fence_after_sync();
  if (ptx::warpgroup_idx() == 1) {
    const uint32_t quarter = 32 * (warp % 4);
    uint32_t r8[8], r16[16], r32[32];
    ptx::tmem_ld_32x32b_x8(ptx::tmem_addr(tmem, quarter, 0), r8);
    ptx::tmem_ld_32x32b_x16(ptx::tmem_addr(tmem, quarter, 8), r16);
    ptx::tmem_ld_32x32b_x32(ptx::tmem_addr(tmem, quarter, 32), r32);
    ptx::tmem_wait_ld();
    float s = 0.f;
    for (int i = 0; i < 8; ++i) s += __uint_as_float(r8[i]);
    for (int i = 0; i < 16; ++i) s += __uint_as_float(r16[i]);
    for (int i = 0; i < 32; ++i) s += __uint_as_float(r32[i]);
    uint32_t p[8];
    for (int i = 0; i < 8; ++i) p[i] = ptx::pack_bf16x2(__uint_as_float(r8[i]), s);
    ptx::tmem_st_32x32b_x8(ptx::tmem_addr(tmem, quarter, 256), p);
    ptx::tmem_wait_st();
    uint32_t lm[4];
    ptx::ldmatrix_x4(lm, smem + (threadIdx.x % 128) * 16);
    ptx::ldmatrix_x4_trans(lm, smem + (threadIdx.x % 128) * 16);
    ptx::stmatrix_x4(smem + 32768 + (threadIdx.x % 128) * 16, lm);
    ptx::stmatrix_x4_trans(smem + 32768 + (threadIdx.x % 128) * 16, lm);
    ptx::named_bar_sync(1, 128);
    ptx::named_bar_arrive(2, 128);
    out[threadIdx.x] = ptx::ex2_approx(s) + static_cast<float>(lm[0] + ptx::warpgroup_idx());
  }
  ptx::tc_fence_before_sync();
  __syncthreads();
  ptx::tc_fence_after_sync();
  if (warp == 0 && ptx::elect_one_sync()) {
"""
    + _STORE_CALLS
    + r"""
  }
  if (warp == 1) ptx::tmem_dealloc(tmem, 256);
"""
    + _KERNEL_TAIL
    + _HOST_ENTRY
)

DRIVERS = {"h100": _H100_DRIVER, "b200": _B200_DRIVER}

# Function definitions in a header: device wrappers, host helpers, constexpr builders.
_DEF_RE = re.compile(
    r"^(?:template <[^>]*>\s*)?"
    r"(?:__device__ __forceinline__|inline|__host__ __device__ constexpr)\s+"
    r"[\w:<>*\s]+?\b(\w+)\(",
    re.MULTILINE,
)


def _pack_dir(arch: str) -> Path:
    return PACKS_DIR / arch


def _wrapper_names(header: str) -> set[str]:
    return set(_DEF_RE.findall(header))


@pytest.mark.parametrize("arch", sorted(ARCH_FLAGS))
def test_pack_has_exactly_the_four_nonempty_files(arch: str) -> None:
    pack = _pack_dir(arch)
    assert pack.is_dir(), f"missing pack folder {pack}"
    present = sorted(p.name for p in pack.iterdir())
    assert present == sorted(PACK_FILES), f"{arch}: expected {sorted(PACK_FILES)}, got {present}"
    for name in PACK_FILES:
        text = (pack / name).read_text(encoding="utf-8")
        assert text.strip(), f"{arch}/{name} is empty"


@pytest.mark.parametrize("arch", sorted(ARCH_FLAGS))
def test_full_pack_token_budget(arch: str) -> None:
    chars = sum(len((_pack_dir(arch) / n).read_text(encoding="utf-8")) for n in PACK_FILES)
    tokens = chars // 4
    assert TOKENS_MIN <= tokens <= TOKENS_MAX, (
        f"{arch}: full pack is ~{tokens} tokens ({chars} chars); want {TOKENS_MIN}-{TOKENS_MAX}"
    )


@pytest.mark.parametrize("arch", sorted(ARCH_FLAGS))
def test_header_is_self_contained(arch: str) -> None:
    header = (_pack_dir(arch) / "wrappers.cuh").read_text(encoding="utf-8")
    allowed = {
        "cuda.h",
        "cudaTypedefs.h",
        "cuda_runtime.h",
        "cuda_bf16.h",
        "cuda_fp16.h",
        "stdint.h",
        "cstdint",
    }
    includes = set(re.findall(r'^\s*#\s*include\s*[<"]([^>"]+)[>"]', header, re.MULTILINE))
    assert includes <= allowed, f"{arch}: disallowed includes {sorted(includes - allowed)}"
    assert "namespace ptx" in header
    for lib in ("cutlass", "cute/", "cublas", "cudnn"):
        assert lib not in header.lower().replace("cutensormap", ""), f"{arch}: mentions {lib}"


@pytest.mark.parametrize("arch", sorted(ARCH_FLAGS))
def test_driver_calls_every_wrapper(arch: str) -> None:
    header = (_pack_dir(arch) / "wrappers.cuh").read_text(encoding="utf-8")
    names = _wrapper_names(header)
    assert len(names) > 40, f"{arch}: found only {len(names)} wrapper definitions"
    missing = sorted(n for n in names if not re.search(rf"ptx::{n}\b", DRIVERS[arch]))
    assert not missing, f"{arch}: driver does not exercise {missing}"


@pytest.mark.nvcc
@pytest.mark.parametrize("arch", sorted(ARCH_FLAGS))
def test_wrappers_compile_cleanly(arch: str, tmp_path: Path) -> None:
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("nvcc is not on PATH: cannot compile the pack's wrappers.cuh")
    shutil.copy(_pack_dir(arch) / "wrappers.cuh", tmp_path / "wrappers.cuh")
    src = tmp_path / "driver.cu"
    src.write_text(DRIVERS[arch], encoding="utf-8")
    cmd = [
        nvcc,
        "-std=c++17",
        "-shared",
        "-Xcompiler",
        "-fPIC,-Wall,-Wextra",
        "-Werror",
        "all-warnings",
        "-gencode",
        ARCH_FLAGS[arch],
        "-o",
        str(tmp_path / "libdriver.so"),
        str(src),
    ]
    result = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, check=False)
    log = result.stdout + result.stderr
    assert result.returncode == 0, f"{arch}: nvcc failed\n{' '.join(cmd)}\n{log}"
    assert "warning" not in log.lower(), f"{arch}: nvcc printed warnings\n{log}"
    assert "C7508" not in log, f"{arch}: setmaxnreg ignored\n{log}"
    assert (tmp_path / "libdriver.so").stat().st_size > 0
