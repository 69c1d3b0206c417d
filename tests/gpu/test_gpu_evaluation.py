"""GPU evaluation end to end: correct kernels pass, broken ones fail alone, the next step works.

Runs on an sm_90 host (``pytest -m gpu``). The kernels are the naive example GEMM and variants of
it, each broken in one way; after every broken one, the correct kernel is stepped on the same env
and must still reach PASSED. The timing protocol is shortened (the correctness protocol is not):
these tests are about outcomes, the benchmarks about numbers.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from gemm_candidates import GEMM, NAIVE_GEMM

from ptxgym.env import PTXKernelEnv
from ptxgym.evaluate.judge_settings import JudgeSettings
from ptxgym.evaluate.local_gpu import LocalGPUEvaluator, incompatibility
from ptxgym.evaluate.timing import TIMING_PHASES
from ptxgym.outcome import Status
from ptxgym.tasks import get_task

pytestmark = pytest.mark.gpu

ENTRY_OPEN = "cudaStream_t stream) {\n"
LAUNCH = "gemm_tn_kernel<<<grid, kThreads, 0, stream>>>(A, B, C, M, N, K, vec_ab, vec_c);\n"
FMA = "acc[i][j] = fmaf(a[i], b[j], acc[i][j]);"
ROW_GUARD = "if (m >= M) continue;"
SETTINGS = JudgeSettings(stage_timeout_s=20.0, warmup=2, iters=5, trials=3, profile=False)


def variant(old: str, new: str, prefix: str = "") -> str:
    assert old in NAIVE_GEMM, f"the naive GEMM changed: {old!r} not found"
    return prefix + NAIVE_GEMM.replace(old, new, 1)


BROKEN = {
    "wrong": (variant(FMA, "acc[i][j] = fmaf(a[i], b[j] * 1.05f, acc[i][j]);"),
              Status.INCORRECT_NUMERICAL, "outside tolerance"),
    "partial": (variant(ROW_GUARD, "if (m >= M || m >= M / 2 + 3) continue;"),
                Status.INCORRECT_NUMERICAL, "NaN"),
    "writes_input": (variant(LAUNCH, LAUNCH + "  cudaMemsetAsync(const_cast<__nv_bfloat16*>(A), "
                             "0, 4096, stream);\n"),
                     Status.INCORRECT_NUMERICAL, "modified its input(s) A"),
    "segfault": (variant(ENTRY_OPEN, ENTRY_OPEN + "  *(volatile int*)nullptr = 1;\n"),
                 Status.RUNTIME_ERROR, "signal 11"),
    "illegal_address": (
        variant(ENTRY_OPEN, ENTRY_OPEN + "  far_write<<<1, 1, 0, stream>>>(C);\n",
                "#include <cuda_bf16.h>\n__global__ void far_write(__nv_bfloat16* c) "
                "{ c[(size_t)1 << 40] = __float2bfloat16(1.f); }\n"),
        # The run dies of an illegal address; memcheck then names the write and its line.
        Status.MEMORY_ERROR, "Invalid __global__ write"),
    "hang": (variant(ENTRY_OPEN, ENTRY_OPEN + "  spin<<<1, 1, 0, stream>>>();\n",
                     "__global__ void spin() { while (clock64() >= 0) {} }\n"),
             Status.TIMEOUT, "no progress"),
    "exit": (variant(ENTRY_OPEN, ENTRY_OPEN + "  exit(0);\n", "#include <cstdlib>\n"),
             Status.RUNTIME_ERROR, "exited with code 0"),
}  # fmt: skip


@pytest.fixture(scope="module")
def env() -> Iterator[PTXKernelEnv]:
    reason = incompatibility(GEMM)
    if reason is not None:
        pytest.skip(reason)
    environment = PTXKernelEnv(
        "PTX-H100-GEMM", turns=100, evaluator=LocalGPUEvaluator(settings=SETTINGS)
    )
    environment.reset(seed=0)
    yield environment
    environment.close()


def test_naive_gemm_passes_with_latency_baseline_and_speedup(env: PTXKernelEnv) -> None:
    info = env.step(NAIVE_GEMM)[4]
    outcome = info["outcome"]
    assert info["status"] == "PASSED", info["feedback"]
    assert outcome["latency_ms"] > 0 and outcome["baseline_latency_ms"] > 0
    assert outcome["speedup"] == pytest.approx(
        outcome["baseline_latency_ms"] / outcome["latency_ms"]
    )
    # 3 trials, the outlier stage, and 3 timed calls chosen at random (fresh inputs each)
    assert len(outcome["checks"]) == 7
    assert sum(check["stage"].startswith("timed call ") for check in outcome["checks"]) == 3
    assert info["reward_components"]["correct"] > 0
    assert "Speedup:" in info["feedback"]
    # The timing's host seconds by part, all within the timing stage.
    stages = outcome["stage_seconds"]
    parts = [stages[f"timing_{phase}"] for phase in TIMING_PHASES]
    assert min(parts) >= 0 and stages["timing_calls"] > 0
    assert sum(parts) <= stages["timing"]
    # The worker ran the candidate under the seccomp filter and with its reads and writes
    # confined (Landlock, applied before CUDA started), CUDA and CUPTI timing included: the
    # candidate is timed with CUPTI, as the baseline is (a worker that could not load CUPTI
    # under the read rule fell back to host-synchronised timing on the H200 once).
    assert outcome["isolation"]["system_calls_filtered"] is True
    assert outcome["isolation"]["writes_confined"] is True
    assert outcome["isolation"]["reads_confined"] is True
    assert {timing["method"] for timing in outcome["timings"]} == {"cupti"}


@pytest.mark.parametrize("name", list(BROKEN))
def test_broken_kernel_fails_alone_and_the_next_step_passes(env: PTXKernelEnv, name: str) -> None:
    source, status, words = BROKEN[name]
    info = env.step(source)[4]
    assert info["status"] == status.value, info["feedback"]
    assert words in info["feedback"], info["feedback"]
    info = env.step(NAIVE_GEMM)[4]
    assert info["status"] == "PASSED", info["feedback"]


SPIN_FROM_CALL = (
    "__device__ unsigned int calls_so_far;\n"
    "__global__ void spin_from(unsigned int call) {\n"
    "  if (atomicAdd(&calls_so_far, 1u) >= call) while (clock64() >= 0) {}\n"
    "}\n"
)


@pytest.mark.parametrize(
    "first_hanging_call",
    [0, 6],  # the first check's call; the timed loop's second
    ids=["in_the_checks", "in_the_timed_loop"],
)
def test_a_hang_costs_seconds_of_gpu_not_the_stage_deadline(first_hanging_call: int) -> None:
    """With the default 300-s stage deadline, a kernel that stops making progress is stopped
    after one call's bound (max(5 s, 1000 x the library's 1.4 ms)): it holds the GPU alone for
    seconds. A hang in the checks, which share the GPU, is stopped once beside the others and
    once more with the GPU alone (other work beside a check might have slowed it)."""
    if reason := incompatibility(GEMM):
        pytest.skip(reason)
    env = PTXKernelEnv(
        "PTX-H100-GEMM", evaluator=LocalGPUEvaluator(settings=JudgeSettings(profile=False))
    )
    env.reset(seed=0)
    try:
        launch = f"  spin_from<<<1, 1, 0, stream>>>({first_hanging_call}u);\n"
        info = env.step(variant(ENTRY_OPEN, ENTRY_OPEN + launch, SPIN_FROM_CALL))[4]
        assert info["status"] == "TIMEOUT", info["feedback"]
        stages = info["outcome"]["stage_seconds"]
        print(f"hang from call {first_hanging_call}: GPU alone {stages['worker_gpu']:.2f} s, "
              f"first attempt {stages.get('shared_attempt', 0.0):.2f} s, step "
              f"{info['outcome']['seconds']:.2f} s")  # fmt: skip
        assert stages["worker_gpu"] <= 10.0
        assert ("shared_attempt" in stages) == (first_hanging_call == 0)
        assert env.step(NAIVE_GEMM)[4]["status"] == "PASSED"
    finally:
        env.close()


def test_b200_task_says_it_needs_sm100() -> None:
    reason = incompatibility(get_task("PTX-B200-GEMM"))
    assert reason is not None and "sm_100" in reason
    env = PTXKernelEnv("PTX-B200-GEMM", evaluator="gpu")
    env.reset()
    with pytest.raises(RuntimeError, match="sm_100"):
        env.step(NAIVE_GEMM)
