"""Counts from CUPTI's SASS metrics joined with the library's listing (``ptxgym.evaluate.count``),
on CPU: the helper builds and loads, the join gives the executed target opcodes, and counts that
do not fit the listing are refused. tests/gpu/test_gpu_count.py counts on the GPU."""

from __future__ import annotations

import ctypes
import functools
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import numpy
import pytest

from ptxgym import paths
from ptxgym.build.sass import LISTING_FILE, FunctionListing, flops_per_warp, target_addresses
from ptxgym.evaluate import count, cupti_helper
from ptxgym.evaluate.count import CountsRefused, PendingCount, counts_profile
from ptxgym.evaluate.profile import with_coverage
from ptxgym.evaluate.single_call import CallJob
from ptxgym.languages.cuda.compiler import compile_source
from ptxgym.outcome import InstructionProfile
from ptxgym.tasks import get_task

GEMM = get_task("PTX-H100-GEMM")
EXPERT_GEMM = (paths.examples_dir() / "expert" / "gemm.cu").read_text()
pytestmark = pytest.mark.nvcc


@functools.cache
def _expert_listing() -> tuple[str, dict[str, FunctionListing]]:
    build = compile_source(EXPERT_GEMM, GEMM)
    assert build.ok and build.library is not None, build.log
    return build.library, target_addresses(Path(build.library), GEMM)


def _kernel() -> tuple[str, FunctionListing]:
    (name, listing), *others = _expert_listing()[1].items()
    assert not others
    return name, listing


def _offset(listing: FunctionListing, opcode: str) -> int:
    return next(offset for offset, text in listing.targets.items() if text.startswith(opcode))


def test_the_listing_holds_the_target_instructions_with_their_offsets() -> None:
    name, listing = _kernel()
    assert "gemm_ws_kernel" in name  # the symbol as compiled (mangled)
    assert any(text.startswith("HGMMA.64x256x16") for text in listing.targets.values())
    assert any(text.startswith("UTMALDG") for text in listing.targets.values())
    assert all(offset % 16 == 0 and offset < listing.size for offset in listing.targets)


def test_the_build_keeps_its_listing_and_the_join_reads_it(tmp_path: Path) -> None:
    library, listing = _expert_listing()
    kept = Path(library).with_name(LISTING_FILE)
    assert kept.is_file(), "the build did not keep its SASS listing beside its library"
    # A copy of the library without the kept listing is disassembled anew: the same join.
    alone = tmp_path / "candidate.so"
    alone.write_bytes(Path(library).read_bytes())
    assert target_addresses(alone, GEMM) == listing
    # With a kept listing, the join reads it instead of disassembling (here: an empty one).
    alone.with_name(LISTING_FILE).write_text("")
    assert target_addresses(alone, GEMM) == {}


def test_counts_at_target_offsets_give_the_executed_opcodes() -> None:
    name, listing = _kernel()
    hgmma, tma = _offset(listing, "HGMMA"), _offset(listing, "UTMALDG")
    rows = [[name, hgmma, 8, 256], [name, tma, 2, 2], [name, 0, 100, 3200]]
    profile = counts_profile(GEMM, {name: listing}, rows)
    assert profile.ok and profile.method == "cupti"
    assert profile.warp_counts == {"HGMMA": 8, "UTMALDG": 2}  # offset 0 is no target
    assert profile.thread_counts == {"HGMMA": 256, "UTMALDG": 2}
    assert profile.families == {"compute": True, "data_movement": True}
    assert profile.qualified is True


def test_target_instructions_that_never_ran_do_not_qualify() -> None:
    name, listing = _kernel()
    rows = [[name, offset, 0, 0] for offset in listing.targets] + [[name, 16, 4, 128]]
    profile = counts_profile(GEMM, {name: listing}, rows)
    assert profile.qualified is False
    assert profile.thread_counts == {"HGMMA": 0, "UTMALDG": 0}


def test_predicated_off_threads_do_not_count_as_executed() -> None:
    name, listing = _kernel()
    rows = [[name, _offset(listing, "HGMMA"), 4, 0]]  # issued, every thread's predicate off
    assert counts_profile(GEMM, {name: listing}, rows).families["compute"] is False


def test_a_function_named_as_written_finds_its_listing() -> None:
    name, listing = _kernel()
    demangled = "(anonymous namespace)::gemm_ws_kernel(CUtensorMap_st, CUtensorMap_st, "
    rows = [[demangled + "__nv_bfloat16*, int, int)", _offset(listing, "HGMMA"), 4, 128]]
    assert counts_profile(GEMM, {name: listing}, rows).families["compute"] is True


@pytest.mark.parametrize(
    ("row", "why"),
    [
        (["K", 8, 1, 1], "offset 0x8"),  # not on an instruction boundary
        (["K", 1 << 20, 1, 1], "offset 0x100000"),  # beyond the function
        (["K", "HGMMA", 1, 1], "malformed"),  # an offset that is no number
        (["K", 16, -1, 0], "malformed"),  # a negative count
        (["K", 16, 1], "malformed"),  # a missing field
        (["K", 16, 1, 33], "33 threads for 1 warp-level"),  # more threads than a warp has
    ],
)
def test_counts_that_do_not_fit_the_listing_are_refused(row: list[object], why: str) -> None:
    name, listing = _kernel()
    row = [name if field == "K" else field for field in row]
    with pytest.raises(CountsRefused, match=why):
        counts_profile(GEMM, {name: listing}, [row])


def test_counts_of_functions_the_library_lacks_are_refused_not_taken_as_none_executed() -> None:
    name, listing = _kernel()
    with pytest.raises(CountsRefused, match="no counted function"):
        counts_profile(GEMM, {name: listing}, [["some_other_kernel", 0, 1, 32]])
    # Kernels of other modules beside the candidate's are left out.
    rows = [["some_other_kernel", 0, 1, 32], [name, _offset(listing, "HGMMA"), 4, 128]]
    assert counts_profile(GEMM, {name: listing}, rows).qualified is True


def test_the_helper_builds_once_and_exports_its_functions() -> None:
    if cupti_helper.find_cupti() is None:
        pytest.skip("no libcupti here")
    helper = cupti_helper.build_helper()
    assert helper == cupti_helper.build_helper() and helper.is_file()
    library = ctypes.CDLL(str(helper))
    for function in ("prepare", "enable", "collect", "record_count", "record", "disable"):
        assert hasattr(library, f"ptxgym_sass_{function}")


def test_a_count_that_cannot_run_is_unknown_and_says_why() -> None:
    """Without a GPU (here) or without CUPTI, the count run fails; the profile is unknown."""
    library, _ = _expert_listing()
    workload = {"axes": {"M": 128, "N": 128, "K": 64}, "sequences": {}}
    inputs = {
        "A": numpy.zeros(128 * 64 * 2, numpy.uint8),
        "B": numpy.zeros(128 * 64 * 2, numpy.uint8),
    }
    job = CallJob(GEMM, library, workload, inputs)
    profile = PendingCount(device=0).finish(job, timeout_s=60)
    assert profile.ok is False and profile.qualified is None
    assert profile.method == "cupti" and profile.reason


def test_a_build_without_target_instructions_is_not_run_and_the_outcome_says_why() -> None:
    """Absent cannot execute: the naive GEMM's SASS has no HGMMA or UTMA*, so its profile is
    decided from the listing (here, without a GPU, where a count run would fail)."""
    build = compile_source((paths.examples_dir() / "naive" / "gemm.cu").read_text(), GEMM)
    assert build.ok and build.library is not None, build.log
    workload = {"axes": GEMM.workloads[0].axes, "sequences": {}}
    job = CallJob(GEMM, build.library, workload, {})
    profile = PendingCount(device=0).finish(job, timeout_s=60)
    assert profile.ok and profile.method == "sass" and profile.note == count.NO_TARGETS_NOTE
    assert profile.families == {"compute": False, "data_movement": False}
    assert profile.qualified is False and profile.coverage == 0.0


def test_an_instructions_warp_and_thread_counts_may_come_in_rows_of_their_own() -> None:
    """As CUPTI gives them on the H200: one record per instruction and metric."""
    name, listing = _kernel()
    hgmma = _offset(listing, "HGMMA")
    rows = [[name, hgmma, 4, 0], [name, hgmma, 0, 128], [name, 0, 0, 16384], [name, 0, 512, 0]]
    profile = counts_profile(GEMM, {name: listing}, rows)
    assert (profile.warp_counts, profile.thread_counts) == ({"HGMMA": 4}, {"HGMMA": 128})
    with pytest.raises(CountsRefused, match="129 threads for 4"):
        counts_profile(GEMM, {name: listing}, [*rows, [name, hgmma, 0, 1]])


def test_a_matrix_instructions_work_comes_from_its_shape() -> None:
    assert flops_per_warp("HGMMA.64x256x16.F32.BF16 R24, gdesc[UR8], R24, UP0") == 131072
    assert flops_per_warp("@P0 HGMMA.64x64x16.F32.BF16 R24, gdesc[UR4], RZ") == 32768
    assert flops_per_warp("UTMALDG.2D [UR8], [UR4]") is None


def test_the_matrix_instructions_work_is_summed_and_measured_against_the_task() -> None:
    name, listing = _kernel()
    hgmma = [offset for offset, text in listing.targets.items() if text.startswith("HGMMA")]
    per_warp = 131072  # HGMMA.64x256x16: the expert GEMM's shape
    workload = {"axes": {"M": 256, "N": 256, "K": 256}, "sequences": {}}
    op = 2 * 256**3
    # As many warp-level executions as the whole product needs, spread over its HGMMA offsets.
    warps = op // per_warp
    rows = [[name, offset, warps // len(hgmma), 32 * warps // len(hgmma)] for offset in hgmma]
    assert warps % len(hgmma) == 0
    unmeasured = replace(counts_profile(GEMM, {name: listing}, rows), flops_executed=None)
    profile = with_coverage(unmeasured, GEMM, workload)
    assert profile.coverage is None and profile.qualified is True  # not measured: execution
    counted = counts_profile(GEMM, {name: listing}, rows)
    assert counted.flops_executed == op
    full = with_coverage(counted, GEMM, workload)
    assert full.coverage == pytest.approx(1.0) and full.min_coverage == GEMM.min_coverage
    assert full.qualified is True
    # One warpgroup's wgmma beside a product done otherwise: executed, but not qualified.
    token_rows = [[name, hgmma[0], 4, 128]]
    token = counts_profile(GEMM, {name: listing}, token_rows)
    assert token.families["compute"] is True
    token = with_coverage(token, GEMM, workload)
    assert token.coverage == pytest.approx(4 * per_warp / op)
    assert token.qualified is False


def test_a_data_movement_family_qualifies_on_execution_alone() -> None:
    profile = InstructionProfile(
        True, families={"compute": True, "data_movement": True}, coverage=0.01, min_coverage=0.5
    )
    assert profile.qualified is True
    assert replace(profile, families={"compute": True, "data_movement": False}).qualified is False


def test_the_self_test_says_why_counting_cannot_be_trusted_here() -> None:
    assert "Hopper kernels only" in (count.self_test(0, (10, 0)) or "")
    # Here (no GPU) the kernels build, and counting them fails with the run's own words.
    reason = count.self_test(0, (9, 0))
    assert reason is not None and reason.startswith("counting wgmma_tma.cu failed")


@pytest.mark.parametrize(
    ("asked", "self_test", "method", "note"),
    [
        ("ncu", "never called", "ncu", ""),
        ("cupti", None, "cupti", ""),
        ("cupti", "no CUPTI", "ncu", "the CUPTI self-test failed (no CUPTI)"),
    ],
)
def test_a_judge_counts_with_cupti_only_after_its_self_test_passed(
    monkeypatch: pytest.MonkeyPatch, asked: str, self_test: str | None, method: str, note: str
) -> None:
    from ptxgym.evaluate import judge
    from ptxgym.evaluate.judge_settings import JudgeSettings

    def fake_self_test(device: int, capability: tuple[int, int]) -> str | None:
        assert self_test != "never called" and capability == (9, 0)
        return self_test

    monkeypatch.setattr(judge, "count_self_test", fake_self_test)
    stand_in = SimpleNamespace(
        settings=JudgeSettings(profile_method=asked),  # type: ignore[arg-type]
        device=0,
        device_info={"capability": [9, 0]},
    )
    chosen, why = judge.Judge._choose_profile_method(stand_in)  # type: ignore[arg-type]
    assert chosen == method and note in why
