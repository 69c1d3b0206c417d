"""ptxgym envs in Gymnasium's vector envs (compile-only evaluator, so no GPU is needed)."""

from __future__ import annotations

import gymnasium as gym
import pytest
from gymnasium.vector import AsyncVectorEnv, SyncVectorEnv

import ptxgym  # noqa: F401  (registers the tasks)
from ptxgym import paths

NAIVE_GEMM = (paths.examples_dir() / "naive" / "gemm.cu").read_text()


def _make(task_id: str) -> gym.Env[str, str]:
    return gym.make(task_id, evaluator="compile-only")


@pytest.mark.nvcc
@pytest.mark.parametrize("kind", ["sync", "async"])
def test_vector_envs_step_each_env_with_its_own_action(kind: str) -> None:
    task_ids = ["PTX-H100-GEMM", "PTX-B200-GEMM"]
    factories = [lambda task_id=task_id: _make(task_id) for task_id in task_ids]
    env = (
        SyncVectorEnv(factories)
        if kind == "sync"
        # Text observations need shared_memory=False (Gymnasium reads Text from shared memory
        # only once); spawn, because a CUDA-using evaluator must not be forked.
        else AsyncVectorEnv(factories, shared_memory=False, context="spawn")
    )
    observations, _ = env.reset(seed=0)
    for task_id, observation in zip(task_ids, observations, strict=True):
        assert task_id in observation
    _, rewards, terminated, truncated, info = env.step((NAIVE_GEMM, "no code at all"))
    assert list(info["status"]) == ["COMPILED", "FORMAT_ERROR"]
    assert list(rewards) == pytest.approx([0.1, 0.0])
    assert not any(terminated) and not any(truncated)
    env.close()
