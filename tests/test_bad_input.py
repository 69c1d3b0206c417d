"""Bad actions: each gets a clear status and feedback fast, and the episode goes on."""

from __future__ import annotations

import time

import gymnasium as gym
import pytest

import ptxgym  # noqa: F401  (registers the tasks)
from ptxgym.outcome import Status

ENTRY = (
    'extern "C" int gemm(const __nv_bfloat16* A, const __nv_bfloat16* B, __nv_bfloat16* C, '
    "int M, int N, int K, cudaStream_t stream) { return 0; }\n"
)
BAD_ACTIONS = {
    "empty": ("", Status.FORMAT_ERROR, "empty"),
    "no code": ("I would use wgmma here, with TMA loads.", Status.FORMAT_ERROR, "no code"),
    "10 MB": ("x" * 10_000_000, Status.FORMAT_ERROR, "characters"),
    "10 MB of code": (ENTRY + "//" + "y" * 10_000_000, Status.FORMAT_ERROR, "characters"),
    "binary": ("\x7fELF\x02\x01\x01\x00" + "\x00" * 64, Status.FORMAT_ERROR, "binary"),
    "invalid UTF-8": ("__global__ void k() {}\udc80\udcff", Status.FORMAT_ERROR, "UTF-8"),
    "/etc/passwd": ('#include "/etc/passwd"\n' + ENTRY, Status.POLICY_VIOLATION, "by path"),
    "../x": ('#include "../x"\n' + ENTRY, Status.POLICY_VIOLATION, "by path"),
}


@pytest.mark.parametrize("name", list(BAD_ACTIONS))
def test_bad_action_is_reported_fast_and_the_episode_goes_on(name: str) -> None:
    action, status, words = BAD_ACTIONS[name]
    env = gym.make("PTX-H100-GEMM")
    env.reset(seed=0)
    started = time.perf_counter()
    observation, reward, terminated, truncated, info = env.step(action)
    elapsed = time.perf_counter() - started
    assert elapsed < 1.0, f"{name} took {elapsed:.2f} s"
    assert info["status"] == status.value
    assert words in info["message"]
    assert f"Status: {status.value}" in observation
    assert reward == 0.0
    assert not terminated and not truncated
    # The next step is evaluated normally.
    info = env.step("still no code")[4]
    assert info["turn"] == 2 and info["status"] == Status.FORMAT_ERROR.value
    env.close()


@pytest.mark.parametrize("action", [None, b"__global__ void k() {}", 3, {"code": "x"}])
def test_non_string_action_raises_type_error(action: object) -> None:
    env = gym.make("PTX-H100-GEMM")
    env.reset()
    with pytest.raises(TypeError, match="must be a str"):
        env.step(action)
    env.close()
