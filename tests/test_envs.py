"""Every registered task as a Gymnasium environment (compile-only evaluator, no GPU)."""

from __future__ import annotations

import pickle
import warnings

import gymnasium as gym
import pytest
from gemm_candidates import NAIVE_GEMM
from gymnasium.utils.env_checker import check_env

import ptxgym
from ptxgym.env import PTXKernelEnv
from ptxgym.outcome import Status
from ptxgym.reward import Reward
from ptxgym.tasks import registry

PTX_SPECS = [spec for spec in gym.registry.values() if spec.entry_point == ptxgym.ENTRY_POINT]


def test_every_task_is_registered_on_import() -> None:
    assert len(PTX_SPECS) == len(registry())
    for spec in PTX_SPECS:
        assert spec.nondeterministic
        assert spec.max_episode_steps == 8
        spec.to_json()  # string entry point and plain kwargs: serialisable


@pytest.mark.parametrize("spec", PTX_SPECS, ids=lambda spec: spec.id)
def test_check_env_passes_quietly(
    spec: gym.envs.registration.EnvSpec, capsys: pytest.CaptureFixture[str]
) -> None:
    env = spec.make(disable_env_checker=True, evaluator="compile-only")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        # The render check makes the env in each render mode and renders it after reset.
        check_env(env.unwrapped)
    env.close()
    assert [str(warning.message) for warning in caught] == []
    printed = capsys.readouterr().out
    assert len(printed) < 200 and spec.id in printed  # the human render's one line


@pytest.mark.parametrize("spec", PTX_SPECS, ids=lambda spec: spec.id)
def test_make_reset_and_pickle(spec: gym.envs.registration.EnvSpec) -> None:
    env = gym.make(spec.id)
    observation, info = env.reset(seed=0)
    assert isinstance(observation, str) and observation in env.observation_space
    assert spec.id in observation
    assert info["task_id"] == spec.id
    pickle.loads(pickle.dumps(env.unwrapped))
    env.close()


def test_gym_make_exactly_as_documented() -> None:
    env = gym.make("PTX-H100-MHAFwd-d128")
    observation, _ = env.reset(seed=0)
    assert "mha_fwd" in observation and "wgmma" in observation
    env.close()


@pytest.mark.nvcc
def test_naive_gemm_through_env_step_is_compiled() -> None:
    env = gym.make("PTX-H100-GEMM", evaluator="compile-only")
    prompt, _ = env.reset(seed=0)
    reply = f"Here is my kernel.\n```cuda\n{NAIVE_GEMM}```\n"
    observation, reward, terminated, truncated, info = env.step(reply)
    assert info["status"] == Status.COMPILED.value
    assert info["outcome"]["compile"]["kernels"]
    assert reward == pytest.approx(0.1)
    assert info["reward_components"]["compiled"] == pytest.approx(0.1)
    assert not terminated and not truncated
    assert observation.startswith(prompt) and "## Turn 1" in observation
    assert NAIVE_GEMM.strip()[:200] in observation
    env.close()


@pytest.mark.nvcc
def test_history_feedback_only_omits_the_kernel() -> None:
    env = gym.make("PTX-H100-GEMM", history="feedback-only")
    env.reset()
    observation, *_ = env.step(NAIVE_GEMM)
    assert "Status: COMPILED" in observation
    assert NAIVE_GEMM.strip()[:200] not in observation
    env.close()


def test_episode_truncates_after_turns_and_then_refuses_steps() -> None:
    env = PTXKernelEnv("PTX-H100-GEMM", turns=2)
    env.reset()
    assert env.step("no code")[3] is False
    observation, _, terminated, truncated, info = env.step("still no code")
    assert truncated and not terminated
    assert info["turn"] == 2 and "## Turn 2" in observation
    with pytest.raises(RuntimeError, match="reset"):
        env.step("again")
    env.reset()
    assert env.step("after reset")[4]["turn"] == 1


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"turns": 0}, "turns"),
        ({"prompt_variant": 3}, "prompt_variant"),
        ({"knowledge": "most"}, "knowledge"),
        ({"history": "none"}, "history"),
        ({"reward": "best"}, "unknown reward"),
        ({"render_mode": "rgb_array"}, "render_mode"),
    ],
)
def test_bad_kwargs_are_rejected(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        PTXKernelEnv("PTX-H100-GEMM", **kwargs)  # type: ignore[arg-type]


def test_bad_evaluator_is_rejected_on_first_step() -> None:
    env = PTXKernelEnv("PTX-H100-GEMM", evaluator="quantum")
    env.reset()
    with pytest.raises(ValueError, match="unknown evaluator"):
        env.step(NAIVE_GEMM)


@pytest.mark.parametrize("variant", [0, 1, 2])
@pytest.mark.parametrize(
    "knowledge", ["none", "params", "params+wrappers", "params+wrappers+contracts", "full"]
)
def test_prompt_variants_and_knowledge_levels(variant: int, knowledge: str) -> None:
    env = PTXKernelEnv("PTX-H100-GEMM", prompt_variant=variant, knowledge=knowledge)
    prompt, info = env.reset()
    assert 'extern "C" int gemm(' in prompt and "```cuda" in prompt
    pack_parts = [name for name in info["prompt_tokens"] if name.startswith("pack:")]
    expected = {"none": 0, "params": 1, "params+wrappers": 2, "params+wrappers+contracts": 3}
    assert len(pack_parts) == expected.get(knowledge, 4)


def test_custom_reward_callable() -> None:
    env = PTXKernelEnv("PTX-H100-GEMM", reward=lambda outcome: -1.0)
    env.reset()
    _, reward, *_ = env.step("no code here")
    assert reward == -1.0
    env = PTXKernelEnv("PTX-H100-GEMM", reward=lambda outcome: Reward(2.0, {"mine": 2.0}))
    env.reset()
    info = env.step("no code here")[4]
    assert info["reward_components"] == {"mine": 2.0}


def test_render_modes() -> None:
    env = PTXKernelEnv("PTX-H100-GEMM", render_mode="ansi")
    env.reset()
    assert env.render() == (
        f"PTX-H100-GEMM: turn 0 of 8; the prompt ({len(env.prompt.text):,} characters) "
        "is the observation"
    )
    env.step("no code")
    assert "FORMAT_ERROR" in (env.render() or "")


def test_resume_restores_the_observation_without_evaluating() -> None:
    live = PTXKernelEnv("PTX-H100-GEMM", turns=3)
    live.reset()
    first = live.step("no code here")[4]
    observation, *_, second = live.step("still none")
    restored = PTXKernelEnv("PTX-H100-GEMM", turns=3)
    restored.reset()
    history = [(first["source"], first["feedback"]), (second["source"], second["feedback"])]
    assert restored.resume(history) == observation
    assert restored.step("third")[4]["turn"] == 3
