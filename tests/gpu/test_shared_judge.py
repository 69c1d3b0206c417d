"""AsyncVectorEnv workers sharing one judge server on the GPU (``pytest -m gpu``)."""

from __future__ import annotations

import gymnasium as gym
import pytest
from gemm_candidates import NAIVE_GEMM
from gymnasium.vector import AsyncVectorEnv

import ptxgym  # noqa: F401  (registers the tasks)
from ptxgym.evaluate.judge_server import server_files
from ptxgym.evaluate.judge_settings import JudgeSettings
from ptxgym.evaluate.local_gpu import LocalGPUEvaluator, incompatibility
from ptxgym.tasks import get_task

pytestmark = pytest.mark.gpu

SETTINGS = JudgeSettings(stage_timeout_s=63.0, warmup=2, iters=5, trials=3, profile=False)


def _make() -> gym.Env[str, str]:
    return gym.make("PTX-H100-GEMM", evaluator=LocalGPUEvaluator(settings=SETTINGS, shared=True))


def test_async_vector_env_workers_share_one_judge() -> None:
    reason = incompatibility(get_task("PTX-H100-GEMM"))
    if reason is not None:
        pytest.skip(reason)
    env = AsyncVectorEnv([_make, _make, _make], shared_memory=False, context="spawn")
    env.reset(seed=0)
    _, _, _, _, info = env.step((NAIVE_GEMM, f"{NAIVE_GEMM}\n// second\n", "no code"))
    assert list(info["status"]) == ["PASSED", "PASSED", "FORMAT_ERROR"]
    env.close()
    # One server for the GPU and these settings, reached by both workers that evaluated.
    assert server_files(0, SETTINGS).socket.exists()
