"""ptxgym envs in Gymnasium's vector envs (compile-only evaluator, so no GPU is needed)."""

from __future__ import annotations

import gymnasium as gym
import pytest
from gemm_candidates import NAIVE_GEMM
from gymnasium.vector import AsyncVectorEnv, SyncVectorEnv

import ptxgym  # noqa: F401  (registers the tasks)


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


@pytest.mark.nvcc
@pytest.mark.parametrize(
    ("mode", "vector_kwargs"),
    [("sync", {}), ("async", {"shared_memory": False, "context": "spawn"})],
)
def test_make_vec_resets_and_steps(mode: str, vector_kwargs: dict[str, object]) -> None:
    env = gym.make_vec(
        "PTX-H100-GEMM",
        num_envs=2,
        vectorization_mode=mode,
        vector_kwargs=vector_kwargs,
        evaluator="compile-only",
    )
    try:
        prompts, _ = env.reset(seed=0)
        assert all("PTX-H100-GEMM" in prompt for prompt in prompts)
        observations, rewards, _, _, info = env.step((NAIVE_GEMM, "no code at all"))
        assert list(info["status"]) == ["COMPILED", "FORMAT_ERROR"]
        assert list(rewards) == pytest.approx([0.1, 0.0])
        # Each observation after the step is its prompt followed by that step's feedback.
        for prompt, observation in zip(prompts, observations, strict=True):
            assert observation.startswith(prompt) and len(observation) > len(prompt)
    finally:
        env.close()


def test_make_vec_async_with_shared_memory_fails_at_once_saying_what_to_pass() -> None:
    with pytest.raises(ValueError, match="shared_memory") as raised:
        gym.make_vec("PTX-H100-GEMM", num_envs=2, vectorization_mode="async")
    assert "vector_kwargs={'shared_memory': False, 'context': 'spawn'}" in str(
        raised.value.__cause__
    )
