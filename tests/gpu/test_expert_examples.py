"""The expert example kernels through the real env pipeline on the GPU (``pytest -m gpu``).

Each expert kernel in ``examples/manifest.yaml`` must pass every check and execute both target
families (wgmma and TMA) under Nsight Compute. How fast they are against the library is a
benchmark figure (benchmarks/gpu_evaluation.py, docs/benchmarks.md), not a test assertion.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import yaml

from ptxgym import paths
from ptxgym.env import PTXKernelEnv
from ptxgym.evaluate.judge import JudgeSettings
from ptxgym.evaluate.local_gpu import LocalGPUEvaluator, incompatibility
from ptxgym.tasks import get_task

pytestmark = pytest.mark.gpu

EXPERTS = [
    (entry["file"], task_id)
    for entry in yaml.safe_load((paths.examples_dir() / "manifest.yaml").read_text())["examples"]
    # CUDA's: the Triton examples have their own test (tests/gpu/test_triton.py).
    if entry["kind"] == "expert" and entry.get("language", "cuda") == "cuda"
    for task_id in entry["tasks"]
]
SHORT = JudgeSettings(stage_timeout_s=60.0, warmup=3, iters=10, trials=3)


@pytest.fixture(scope="module")
def evaluator() -> Iterator[LocalGPUEvaluator]:
    pool = LocalGPUEvaluator(settings=SHORT)
    yield pool
    pool.close()


@pytest.mark.parametrize(("example", "task_id"), EXPERTS)
def test_expert_kernel_passes_and_executes_both_families(
    evaluator: LocalGPUEvaluator, example: str, task_id: str
) -> None:
    reason = incompatibility(get_task(task_id))
    if reason is not None:
        pytest.skip(reason)
    env = PTXKernelEnv(task_id, evaluator=evaluator)
    env.reset(seed=0)
    info = env.step((paths.examples_dir() / example).read_text())[4]
    outcome = info["outcome"]
    assert info["status"] == "PASSED", info["feedback"]
    assert outcome["qualified"] is True, info["feedback"]
    assert outcome["profile"]["families"] == {"compute": True, "data_movement": True}
    assert outcome["speedup"] > 0
