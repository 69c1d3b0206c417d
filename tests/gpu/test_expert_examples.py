"""The expert example kernels through the real env pipeline on the GPU (``pytest -m gpu``).

Each expert kernel in ``examples/manifest.yaml`` must pass every check, qualify, and execute the
target families its entry names (wgmma and TMA unless it says otherwise). How fast they are
against the library is a benchmark figure (benchmarks/gpu_evaluation.py, docs/benchmarks.md), not
a test assertion.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from expert_examples import EXPERTS

from ptxgym import paths
from ptxgym.env import PTXKernelEnv
from ptxgym.evaluate.judge_settings import JudgeSettings
from ptxgym.evaluate.local_gpu import LocalGPUEvaluator, incompatibility
from ptxgym.tasks import get_task

pytestmark = pytest.mark.gpu

SHORT = JudgeSettings(stage_timeout_s=60.0, warmup=3, iters=10, trials=3)


def _step(evaluator: LocalGPUEvaluator, example: str, task_id: str) -> dict[str, Any]:
    env = PTXKernelEnv(task_id, evaluator=evaluator)
    env.reset(seed=0)
    info: dict[str, Any] = env.step((paths.examples_dir() / example).read_text())[4]
    return info


@pytest.fixture(scope="module")
def infos() -> dict[tuple[str, str], dict[str, Any]]:
    """Every runnable expert stepped once, all at once through one evaluator: the CPU stages of
    one (references, builds, sanitizer start-ups) overlap the others', while each timing still
    has the GPU alone, so the sixteen fit one device call instead of one each."""
    runnable = [
        (example, task_id)
        for example, task_id, _ in EXPERTS
        if incompatibility(get_task(task_id)) is None
    ]
    pool = LocalGPUEvaluator(settings=SHORT)
    try:
        with ThreadPoolExecutor(max_workers=max(1, len(runnable))) as threads:
            futures = {key: threads.submit(_step, pool, *key) for key in runnable}
            return {key: future.result() for key, future in futures.items()}
    finally:
        pool.close()


@pytest.mark.parametrize(("example", "task_id", "families"), EXPERTS)
def test_expert_kernel_passes_and_executes_its_families(
    infos: dict[tuple[str, str], dict[str, Any]],
    example: str,
    task_id: str,
    families: dict[str, bool],
) -> None:
    reason = incompatibility(get_task(task_id))
    if reason is not None:
        pytest.skip(reason)
    info = infos[(example, task_id)]
    outcome = info["outcome"]
    assert info["status"] == "PASSED", info["feedback"]
    assert outcome["qualified"] is True, info["feedback"]
    assert outcome["profile"]["families"] == families
    assert outcome["speedup"] > 0
