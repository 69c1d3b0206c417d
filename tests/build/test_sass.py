"""Static SASS inventory of built candidates: opcodes per kernel, target families present."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ptxgym import paths
from ptxgym.build import sass
from ptxgym.build.result import CompileResult
from ptxgym.build.sass import SassInventory, parse_sass
from ptxgym.cli import main
from ptxgym.evaluate.compile_only import CompileOnlyEvaluator
from ptxgym.evaluate.count import SELF_TEST_KERNELS
from ptxgym.feedback import render_feedback
from ptxgym.languages.cuda.compiler import compile_source
from ptxgym.outcome import Status
from ptxgym.tasks import get_task

H100 = get_task("PTX-H100-GEMM")
B200 = get_task("PTX-B200-GEMM")
NAIVE_GEMM = paths.examples_dir() / "naive" / "gemm.cu"
KERNELS = Path(__file__).parents[1] / "kernels"
WGMMA_TMA = (SELF_TEST_KERNELS / "wgmma_tma.cu").read_text()
WGMMA_NEVER_TAKEN = (SELF_TEST_KERNELS / "wgmma_never_taken.cu").read_text()
TCGEN05 = (KERNELS / "tcgen05.cu").read_text()


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
