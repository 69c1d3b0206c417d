"""The instruction profile on the GPU: executed, not merely present (``pytest -m gpu``).

Purpose-written kernels (tests/kernels/) are profiled directly; the naive GEMM goes through
``env.step``. Counts are checked against what the kernels issue: one m64n64k16 wgmma per
warpgroup is 4 warp-level HGMMA (128 predicated-on threads), one TMA load is 1 per block.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from typing import Any

import pytest
from gemm_candidates import GEMM, NAIVE_GEMM

from ptxgym.env import PTXKernelEnv
from ptxgym.evaluate.count import SELF_TEST_KERNELS
from ptxgym.evaluate.judge_settings import JudgeSettings
from ptxgym.evaluate.local_gpu import LocalGPUEvaluator, incompatibility
from ptxgym.evaluate.profile import profile_candidate
from ptxgym.evaluate.worker import host_inputs
from ptxgym.languages.cuda.compiler import compile_source
from ptxgym.outcome import InstructionProfile

pytestmark = pytest.mark.gpu

WORKLOAD = {"axes": GEMM.workloads[0].axes, "sequences": {}}
BLOCKS = GEMM.workloads[0].axes["M"] // 64  # the test kernels launch one warpgroup per 64 rows
SHORT = JudgeSettings(stage_timeout_s=60.0, warmup=2, iters=5, trials=3)


@functools.cache
def _inputs() -> dict[str, Any]:
    """The first workload's inputs for seed 1, made once (the judge's trusted generator)."""
    return host_inputs(GEMM, WORKLOAD, 1)


@pytest.fixture(autouse=True)
def _sm90() -> None:
    reason = incompatibility(GEMM)
    if reason is not None:
        pytest.skip(reason)


def _profile(source: str) -> InstructionProfile:
    build = compile_source(source, GEMM)
    assert build.ok and build.library is not None, build.log
    result = profile_candidate(GEMM, build.library, WORKLOAD, _inputs(), device=0)
    assert result.ok, result.reason
    return result


def test_executed_wgmma_and_tma_are_counted() -> None:
    result = _profile((SELF_TEST_KERNELS / "wgmma_tma.cu").read_text())
    assert result.families == {"compute": True, "data_movement": True}
    assert result.qualified is True
    assert result.warp_counts["HGMMA"] == 4 * BLOCKS
    assert result.thread_counts["HGMMA"] == 128 * BLOCKS
    assert result.warp_counts["UTMALDG"] == BLOCKS
    # Only the candidate's launch is profiled, not the kernels that made its inputs.
    assert len(result.kernels) == 1 and "wgmma_tma_kernel" in result.kernels[0].name
    # Where the profiled run's seconds went: the GPU part is its wait for the profiler's turn,
    # its load, inputs and call.
    seconds = result.call_seconds
    keys = {"context", "gpu_wait", "profiler_wait", "load", "inputs", "call", "gpu"}
    assert keys <= set(seconds)
    assert seconds["call"] > 0
    parts = ("profiler_wait", "load", "inputs", "call")
    assert sum(seconds[part] for part in parts) <= seconds["gpu"]


def test_wgmma_on_a_branch_never_taken_does_not_qualify() -> None:
    source = (SELF_TEST_KERNELS / "wgmma_never_taken.cu").read_text()
    build = compile_source(source, GEMM)
    assert build.sass is not None and build.sass.families_present["compute"]
    result = _profile(source)
    assert result.thread_counts.get("HGMMA", 0) == 0
    assert result.families["compute"] is False and result.qualified is False


def test_plain_cuda_executes_neither_family() -> None:
    result = _profile(NAIVE_GEMM)
    assert result.families == {"compute": False, "data_movement": False}
    assert result.thread_counts["FFMA"] > 0


@pytest.fixture
def env() -> Iterator[PTXKernelEnv]:
    environment = PTXKernelEnv("PTX-H100-GEMM", evaluator=LocalGPUEvaluator(settings=SHORT))
    environment.reset()
    yield environment
    environment.close()


def test_a_correct_plain_kernel_passes_without_qualifying(env: PTXKernelEnv) -> None:
    info = env.step(NAIVE_GEMM)[4]
    assert info["status"] == "PASSED", info["feedback"]
    assert info["outcome"]["qualified"] is False
    assert info["reward_components"]["qualified"] == 0.0
    assert "Qualified: no" in info["feedback"]


def test_a_profile_that_fails_is_unknown_and_the_step_completes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A judge of its own (other settings), asked to count with Nsight Compute and started with
    # it made unavailable. (Counted by CUPTI, the default, this kernel's profile is decided from
    # its SASS, which holds no target instruction: no tool runs.)
    monkeypatch.setenv("PTXGYM_NCU", "/nonexistent/ncu")
    settings = JudgeSettings(
        stage_timeout_s=61.0, warmup=2, iters=5, trials=3, profile_method="ncu"
    )
    environment = PTXKernelEnv("PTX-H100-GEMM", evaluator=LocalGPUEvaluator(settings=settings))
    environment.reset()
    info = environment.step(NAIVE_GEMM)[4]
    assert info["status"] == "PASSED"
    assert info["outcome"]["qualified"] is None
    assert "unknown (Nsight Compute (ncu) was not found" in info["feedback"]
