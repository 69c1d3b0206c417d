"""Eight envs stepping at once through one shared GPU evaluator (``pytest -m gpu``): each gets its
own outcome, a crashing candidate among them fails alone, and every honest one passes."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

import pytest
from gemm_candidates import GEMM, NAIVE_GEMM

from ptxgym.env import PTXKernelEnv
from ptxgym.evaluate.judge_settings import JudgeSettings
from ptxgym.evaluate.local_gpu import LocalGPUEvaluator, incompatibility

pytestmark = pytest.mark.gpu

ENTRY_OPEN = "cudaStream_t stream) {\n"
FMA = "acc[i][j] = fmaf(a[i], b[j], acc[i][j]);"
CRASHER = NAIVE_GEMM.replace(ENTRY_OPEN, ENTRY_OPEN + "  *(volatile int*)nullptr = 1;\n", 1)
WRONG = NAIVE_GEMM.replace(FMA, "acc[i][j] = fmaf(a[i], b[j] * 1.05f, acc[i][j]);", 1)
SETTINGS = JudgeSettings(stage_timeout_s=60.0, warmup=2, iters=5, trials=3, concurrency=4)


@pytest.mark.parametrize(
    "check_streams", [False, True], ids=["default_stream", "a_stream_per_judge_thread"]
)
def test_eight_envs_step_concurrently_and_each_gets_its_own_outcome(check_streams: bool) -> None:
    """Also with the judge comparing each thread's outputs on a stream of its own
    (``JudgeSettings.check_streams``): every verdict stays the candidate's."""
    reason = incompatibility(GEMM)
    if reason is not None:
        pytest.skip(reason)
    assert CRASHER != NAIVE_GEMM and WRONG != NAIVE_GEMM
    # Distinct sources (distinct builds), so no two envs share anything but the evaluator.
    honest = [f"{NAIVE_GEMM}\n// env {index}\n" for index in range(6)]
    expected = ["PASSED"] * 6 + ["RUNTIME_ERROR", "INCORRECT_NUMERICAL"]
    sources = [*honest, CRASHER, WRONG]
    evaluator = LocalGPUEvaluator(settings=replace(SETTINGS, check_streams=check_streams))
    envs = [PTXKernelEnv("PTX-H100-GEMM", evaluator=evaluator) for _ in sources]
    for env in envs:
        env.reset(seed=0)
    with ThreadPoolExecutor(max_workers=len(envs)) as pool:
        futures = [pool.submit(env.step, source) for env, source in zip(envs, sources, strict=True)]
        infos = [future.result()[4] for future in futures]
    assert [info["status"] for info in infos] == expected, [info["message"] for info in infos]
    for info, source in zip(infos, sources, strict=True):
        # Each outcome is of its own source: the build it reports holds that source.
        built = Path(info["outcome"]["compile"]["library"]).with_name("candidate.cu")
        assert built.read_text().strip() == source.strip()
    speedups = [info["outcome"]["speedup"] for info in infos[:6]]
    assert max(speedups) / min(speedups) < 1.1  # one kernel, one GPU, turns taken: same speed
