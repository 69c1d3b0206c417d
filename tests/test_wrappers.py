"""FastP, TrajectoryRecorder and ChatMessages over the env (the exports built from trajectory
records are tests/records/test_exports.py's).

Most tests drive the real env with a scripted evaluator that returns crafted outcomes (no GPU,
no nvcc); the ``nvcc`` tests take real compile-only steps.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import gymnasium as gym
import pytest

from ptxgym import __version__, paths, wrappers
from ptxgym.build.result import CompilerUnavailable
from ptxgym.device.gpus import GPUInfo
from ptxgym.env import PTXKernelEnv
from ptxgym.interop import flashinfer_trace as trace
from ptxgym.outcome import Outcome, Status
from ptxgym.records import exports
from ptxgym.records.exports import export_flashinfer
from ptxgym.records.metrics import Turn, summarize
from ptxgym.records.turns import TurnRecord, read_records
from ptxgym.tasks import Task
from ptxgym.wrappers import (
    ChatMessage,
    ChatMessages,
    FastP,
    TrajectoryRecorder,
    summarize_wrappers,
)

# The turns of tests/records/test_metrics.py, whose metrics are computed by hand there.
WRONG = Turn(False, None, None)
PLAIN = Turn(True, False, 1.5)
UNKNOWN = Turn(True, None, 3.0)
QUALIFIED_SLOW = Turn(True, True, 0.5)
QUALIFIED_FAST = Turn(True, True, 2.0)
A = [WRONG, PLAIN, QUALIFIED_SLOW, QUALIFIED_FAST]
B = [UNKNOWN, WRONG, WRONG, QUALIFIED_SLOW]

GEMM = "PTX-H100-GEMM"


class ScriptedEvaluator:
    """Returns the outcome of each scripted turn in order, whatever the source."""

    name = "scripted"

    def __init__(self, script: Sequence[Turn]) -> None:
        self.script = list(script)
        self.calls = 0

    def evaluate(self, task: Task, source: str) -> Outcome:
        turn = self.script[self.calls]
        self.calls += 1
        if not turn.correct:
            return Outcome(task.id, Status.INCORRECT_NUMERICAL, "C: 3 elements wrong", self.name)
        return Outcome(
            task.id,
            Status.PASSED,
            "correct",
            self.name,
            latency_ms=1.0,
            baseline_latency_ms=turn.speedup,
            speedup=turn.speedup,
            qualified=turn.qualified,
        )

    def close(self) -> None:
        """Nothing to release."""


def kernel(n: int) -> str:
    return f'extern "C" int gemm() {{ return {n}; }}\n'


def make_env(script: Sequence[Turn], *, turns: int = 4, **kwargs: Any) -> PTXKernelEnv:
    task_id = kwargs.pop("task_id", GEMM)
    return PTXKernelEnv(task_id, turns=turns, evaluator=ScriptedEvaluator(script), **kwargs)


def play(env: gym.Env[str, str], steps: int) -> list[dict[str, Any]]:
    env.reset(seed=0)
    return [env.step(kernel(n))[4] for n in range(steps)]


# --------------------------------------------------------------------------------------------
# FastP


def test_fastp_trajectories_and_summary() -> None:
    env = FastP(make_env(A + B))
    play(env, 4)
    play(env, 4)
    assert env.trajectories == [A, B]
    summary = env.summary(limits=(1, 4), ps=(1.0, 2.0))
    assert summary == summarize([A, B], limits=(1, 4), ps=(1.0, 2.0))
    assert summary.trajectories == 2 and summary.turns == 8
    assert summary.turn_correctness[4] == pytest.approx((3 / 8, 5 / 8))
    assert summary.turn_correctness[1] == pytest.approx((0.0, 1 / 2))
    assert summary.best_speedup[4] == (2.0, 3.0)
    assert summary.fast[1.0][4] == pytest.approx((1 / 8, 3 / 8))
    assert summary.fast[2.0][4] == pytest.approx((0.0, 1 / 8))


def test_fastp_info_at_episode_end() -> None:
    env = FastP(make_env(A + B))
    first = play(env, 4)
    assert all("fastp" not in info for info in first[:-1])
    assert first[-1]["fastp"] == {
        "turns": 4,
        "turn_correctness": {"inst": 0.5, "all": 0.75},
        "best_speedup": {"inst": 2.0, "all": 2.0},
        "fast_1": {"inst": 0.25, "all": 0.5},
    }
    second = play(env, 4)[-1]["fastp"]
    assert second == {
        "turns": 4,
        "turn_correctness": {"inst": 0.25, "all": 0.5},
        "best_speedup": {"inst": 0.5, "all": 3.0},
        "fast_1": {"inst": 0.0, "all": 0.25},
    }
    json.dumps(second, allow_nan=False)


def test_fastp_counts_no_empty_episodes() -> None:
    env = FastP(make_env([WRONG, PLAIN, QUALIFIED_FAST], turns=2))
    env.reset()
    env.reset()
    assert env.trajectories == []
    play(env, 2)
    env.reset()
    env.reset()
    assert env.trajectories == [[WRONG, PLAIN]]
    env.step(kernel(0))  # the current, unfinished episode counts too
    assert env.trajectories == [[WRONG, PLAIN], [QUALIFIED_FAST]]


def test_fastp_through_gym_make_ends_on_truncation() -> None:
    evaluator = ScriptedEvaluator([WRONG, QUALIFIED_FAST])
    env = FastP(gym.make(GEMM, turns=2, max_episode_steps=2, evaluator=evaluator))
    env.reset(seed=0)
    env.step(kernel(0))
    *_, truncated, info = env.step(kernel(1))
    assert truncated
    assert info["fastp"]["best_speedup"] == {"inst": 2.0, "all": 2.0}
    env.close()


def test_fastp_info_reaches_vector_env_callers() -> None:
    def make(script: list[Turn]) -> FastP:
        return FastP(PTXKernelEnv(GEMM, turns=2, evaluator=ScriptedEvaluator(script)))

    envs = gym.vector.SyncVectorEnv([lambda: make(A), lambda: make(B)])
    envs.reset(seed=0)
    envs.step((kernel(0), kernel(0)))
    *_, truncated, info = envs.step((kernel(1), kernel(1)))
    assert truncated.tolist() == [True, True]
    assert info["fastp"]["best_speedup"]["all"].tolist() == [1.5, 3.0]
    envs.close()


def test_summarize_wrappers_pools_tasks() -> None:
    gemm = FastP(make_env(A))
    attention = FastP(make_env(B, task_id="PTX-H100-MHAFwd-d64"))
    play(gemm, 4)
    play(attention, 4)
    assert summarize_wrappers([gemm, attention]) == summarize([A, B])


# --------------------------------------------------------------------------------------------
# TrajectoryRecorder


def test_recorder_syncs_a_line_per_step(tmp_path: Path) -> None:
    path = tmp_path / "runs" / "r.jsonl"
    env = TrajectoryRecorder(
        make_env([WRONG, PLAIN, QUALIFIED_FAST], turns=3, prompt_variant=1, knowledge="params"),
        path,
        run="nightly",
        agent="tester",
    )
    env.reset(seed=0)
    for n in range(3):
        _, reward, _, _, info = env.step(kernel(n))
        lines = path.read_text(encoding="utf-8").splitlines()  # on disk before step returned
        assert len(lines) == n + 1
        record = TurnRecord.from_json(lines[-1])
        assert record.key == (GEMM, 1, "params", 0, n + 1)
        assert (record.run, record.agent) == ("nightly", "tester")
        assert record.status == info["status"]
        assert record.source == info["source"] == kernel(n)
        assert (record.feedback, record.message) == (info["feedback"], info["message"])
        assert record.reward == pytest.approx(float(reward))
        assert record.reward_components == info["reward_components"]
        assert record.outcome == json.loads(json.dumps(info["outcome"]))
        assert record.evaluator == "scripted"
        assert record.step_seconds > 0
        assert datetime.fromisoformat(record.timestamp).utcoffset() == UTC.utcoffset(None)
        assert {"ptxgym", "python", "nvcc"} <= set(record.versions)
    records = list(read_records(path))
    assert [r.as_turn() for r in records] == [WRONG, PLAIN, QUALIFIED_FAST]
    assert {(r.category, r.instructions_required) for r in records} == {("gemm", True)}
    assert all(r.quality["lines"] >= 1 and r.quality["tool"] for r in records)
    # Each turn after the first records its transition from the one before, with the diff.
    assert records[0].transition == {}
    assert records[1].transition["events"] == ["fixed"]
    assert records[2].transition["events"] == ["faster"]
    assert records[2].transition["diff"].startswith("--- turn 2\n+++ turn 3\n")
    assert (records[2].latency_ms, records[2].baseline_latency_ms) == (1.0, 2.0)
    assert [r.correct for r in records] == [False, True, True]
    assert [TurnRecord.from_json(r.to_json()) for r in records] == records


def test_recorder_trajectory_indices(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    env = TrajectoryRecorder(make_env([WRONG] * 5, turns=1), path)
    for options in (None, None, {"trajectory": 7}, None, {"trajectory": 2}):
        env.reset(options=options)
        env.step(kernel(0))
    assert [r.trajectory for r in read_records(path)] == [0, 1, 7, 8, 2]
    with pytest.raises(ValueError, match="trajectory"):
        env.reset(options={"trajectory": -1})


def test_recorder_versions_computed_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []

    def no_nvcc() -> str:
        calls.append("nvcc")
        raise CompilerUnavailable("nvcc was not found")

    monkeypatch.setattr(wrappers, "nvcc_version", no_nvcc)
    gpu = GPUInfo(0, "NVIDIA H200", (9, 0), "570.86")
    monkeypatch.setattr(wrappers, "visible_gpus", lambda: (gpu,))
    env = TrajectoryRecorder(make_env([WRONG, WRONG], turns=2), tmp_path / "r.jsonl")
    play(env, 2)
    versions = [r.versions for r in read_records(tmp_path / "r.jsonl")]
    assert versions[0] == versions[1]
    assert versions[0]["nvcc"] == "unavailable" and calls == ["nvcc"]
    assert versions[0]["gpu"] == "NVIDIA H200" and versions[0]["driver"] == "570.86"
    assert versions[0]["ptxgym"] == __version__


def test_recorder_needs_a_ptxgym_env(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="ptxgym env"):
        TrajectoryRecorder(gym.make("CartPole-v1"), tmp_path / "r.jsonl")


def test_torn_last_line_is_skipped_then_cut(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    env = TrajectoryRecorder(make_env([WRONG] * 4, turns=4), path)
    play(env, 2)
    with path.open("a", encoding="utf-8") as handle:
        handle.write('{"run": "run", "task_id": "PTX-H1')  # a crash mid-write
    assert [r.turn for r in read_records(path)] == [1, 2]
    with pytest.warns(UserWarning, match="torn last line"):
        env.step(kernel(2))
    assert [r.turn for r in read_records(path)] == [1, 2, 3]


def test_record_missing_only_its_newline_is_kept(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    env = TrajectoryRecorder(make_env([WRONG] * 2, turns=2), path)
    env.reset()
    env.step(kernel(0))
    path.write_bytes(path.read_bytes().rstrip(b"\n"))
    env.step(kernel(1))
    assert [r.turn for r in read_records(path)] == [1, 2]


# --------------------------------------------------------------------------------------------
# Real compile-only steps

NAIVE_GEMM = (paths.examples_dir() / "naive" / "gemm.cu").read_text(encoding="utf-8")


@pytest.mark.nvcc
def test_real_steps_recorded_and_exported(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    inner = PTXKernelEnv(GEMM, turns=2, evaluator="compile-only")
    env = FastP(TrajectoryRecorder(inner, path, run="ci", agent="naive"))
    env.reset(seed=0)
    assert env.step("no code here")[4]["status"] == "FORMAT_ERROR"
    *_, truncated, info = env.step(f"```cuda\n{NAIVE_GEMM}```")
    assert truncated and info["status"] == "COMPILED"
    assert info["fastp"]["turn_correctness"] == {"inst": 0.0, "all": 0.0}
    records = list(read_records(path))
    assert [(r.turn, r.status, r.evaluator) for r in records] == [
        (1, "FORMAT_ERROR", "none"),
        (2, "COMPILED", "compile-only"),
    ]
    assert records[1].outcome["compile"]["ok"] is True
    assert records[1].versions["nvcc"] != "unavailable"

    files = export_flashinfer(records, tmp_path / "fib")
    [trace_file] = [f for f in files if f.parts[-3] == "traces"]
    [record] = trace.read_jsonl(trace_file)
    assert record.evaluation is not None
    assert record.evaluation.status == "RUNTIME_ERROR"  # built, never run (docs/trace.md)
    assert record.evaluation.log.startswith("ptxgym_status: COMPILED")
    env.close()


def test_the_exports_are_still_given_by_the_wrappers_module() -> None:
    # They were wrappers' before they went to ptxgym.records.exports; code that imports them
    # from here gets the very same functions.
    for name in exports.__all__:
        assert name in wrappers.__all__ and getattr(wrappers, name) is getattr(exports, name)


# --------------------------------------------------------------------------------------------
# ChatMessages

SYSTEM = "You write fast CUDA kernels."
# Real chat templates, copied from model repositories: ChatML as Qwen2 writes it (system
# allowed), and Mistral-7B-Instruct-v0.1's, which raises unless roles alternate user/assistant.
CHATML = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
MISTRAL = (
    "{{ bos_token }}{% for message in messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
    "{% endif %}{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token}}"
    "{% else %}{{ raise_exception('Only user and assistant roles are supported!') }}"
    "{% endif %}{% endfor %}"
)


def ptx(env: gym.Env[str, str]) -> PTXKernelEnv:
    unwrapped = env.unwrapped
    assert isinstance(unwrapped, PTXKernelEnv)
    return unwrapped


def roles(messages: Sequence[ChatMessage]) -> list[str]:
    return [message["role"] for message in messages]


def test_chat_messages_after_reset() -> None:
    env = ChatMessages(make_env([]))
    observation, info = env.reset(seed=0)
    assert info["messages"] == [{"role": "user", "content": observation}]
    assert observation == ptx(env).prompt.text
    assert env.messages == info["messages"]
    assert info["turn"] == 0  # the env's own keys are kept


def test_chat_messages_system_message() -> None:
    env = ChatMessages(make_env([WRONG], turns=1), system=SYSTEM)
    observation, info = env.reset()
    assert info["messages"] == [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": observation},
    ]
    info = env.step(kernel(0))[4]
    assert roles(info["messages"]) == ["system", "user", "assistant", "user"]
    assert info["messages"][0] == {"role": "system", "content": SYSTEM}


@pytest.mark.parametrize("history", ["full", "feedback-only"])
def test_chat_user_message_is_the_tail_of_the_observation(history: str) -> None:
    env = ChatMessages(make_env([WRONG, PLAIN], turns=2, history=history))
    closing = "\n\n" + ptx(env).closing
    before, _ = env.reset()
    for n in range(2):
        action = f"My attempt {n}:\n```cuda\n{kernel(n)}```\nDone."
        observation, _, _, truncated, info = env.step(action)
        assistant, user = info["messages"][-2:]
        assert assistant == {"role": "assistant", "content": action}  # the reply as sent
        assert user["role"] == "user"
        assert info["feedback"] in user["content"] and "Your kernel:" not in user["content"]
        # The flat observation is the one before, less its closing line, plus the new turn.
        kept = before.removesuffix(closing)
        assert observation.startswith(kept)
        new_part = observation[len(kept) :]
        assert new_part.endswith(user["content"])
        assert (kernel(n).rstrip() in new_part) == (history == "full")
        header = f"\n\n## Turn {n + 1}\n\nFeedback:\n\n"
        if history == "feedback-only":  # then the user message is all the turn adds
            assert new_part == header + user["content"]
        expected = info["feedback"] if truncated else info["feedback"] + closing
        assert user["content"] == expected
        before = observation
    assert roles(env.messages) == ["user", "assistant", "user", "assistant", "user"]


def test_chat_messages_are_copies() -> None:
    env = ChatMessages(make_env([WRONG, WRONG], turns=2), system=SYSTEM)
    info = env.reset()[1]
    info["messages"][0]["content"] = "changed"
    info["messages"].append({"role": "assistant", "content": "injected"})
    env.messages[1]["content"] = "changed too"
    assert env.messages == [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": ptx(env).prompt.text},
    ]
    first = env.step(kernel(0))[4]["messages"]
    first[-1]["content"] = ""
    second = env.step(kernel(1))[4]["messages"]
    assert second[:4] == env.messages[:4] and second[3]["content"] != ""
    assert second is not env.messages and len(second) == 6


def test_chat_messages_through_gym_make_and_reset() -> None:
    evaluator = ScriptedEvaluator([WRONG, PLAIN, QUALIFIED_FAST])
    env = ChatMessages(gym.make(GEMM, turns=2, max_episode_steps=2, evaluator=evaluator))
    env.reset(seed=0)
    env.step(kernel(0))
    *_, truncated, info = env.step(kernel(1))
    assert truncated and len(info["messages"]) == 5
    assert info["messages"][-1]["content"] == info["feedback"]  # no turns remain: no closing
    info = env.reset()[1]  # a new episode starts a new conversation
    assert roles(info["messages"]) == ["user"]
    assert roles(env.step(kernel(2))[4]["messages"]) == ["user", "assistant", "user"]
    env.close()


def test_chat_messages_step_before_reset() -> None:
    env = ChatMessages(make_env([WRONG]))
    info = env.step(kernel(0))[4]
    assert roles(info["messages"]) == ["user", "assistant", "user"]
    assert info["messages"][0]["content"] == ptx(env).prompt.text


def test_chat_messages_needs_a_ptxgym_env() -> None:
    with pytest.raises(TypeError, match="ptxgym env"):
        ChatMessages(gym.make("CartPole-v1"))


def test_chat_messages_resume() -> None:
    live = ChatMessages(make_env([WRONG, PLAIN], turns=3), system=SYSTEM)
    live.reset()
    replies = ["no code in this reply", f"Here:\n```cuda\n{kernel(1)}```"]
    infos = [live.step(reply)[4] for reply in replies]
    history = [(info["source"], info["feedback"]) for info in infos]

    restored = ChatMessages(make_env([], turns=3), system=SYSTEM)
    restored.reset()
    assert restored.resume(history, replies) == ptx(live)._compose_observation()
    assert restored.messages == live.messages

    rebuilt = ChatMessages(make_env([], turns=3), system=SYSTEM)
    rebuilt.reset()
    rebuilt.resume(history)  # without the replies, they are rebuilt from the sources
    assistant = [m["content"] for m in rebuilt.messages if m["role"] == "assistant"]
    assert assistant == ["", f"```cuda\n{kernel(1).rstrip()}\n```"]
    assert [m for m in rebuilt.messages if m["role"] != "assistant"] == [
        m for m in live.messages if m["role"] != "assistant"
    ]
    with pytest.raises(RuntimeError, match="follow reset"):
        rebuilt.resume(history)
    with pytest.raises(ValueError, match="replies"):
        restored.reset()
        restored.resume(history, replies[:1])


def test_chat_messages_refuse_a_resume_behind_them() -> None:
    env = ChatMessages(make_env([WRONG], turns=3))
    env.reset()
    ptx(env).resume([(None, "Status: FORMAT_ERROR: no code")])  # not through the wrapper
    with pytest.raises(RuntimeError, match="behind this wrapper"):
        env.step(kernel(0))


@pytest.mark.nvcc
def test_chat_messages_real_steps() -> None:
    env = ChatMessages(gym.make(GEMM, turns=3, max_episode_steps=3, evaluator="compile-only"))
    observation, info = env.reset(seed=0)
    assert info["messages"] == [{"role": "user", "content": observation}]
    no_code = "I will think about it first."
    first = env.step(no_code)[4]
    assert first["status"] == "FORMAT_ERROR"
    reply = f"The naive kernel:\n\n```cuda\n{NAIVE_GEMM}```\n"
    observation, *_, second = env.step(reply)
    assert second["status"] == "COMPILED"
    closing = "\n\n" + ptx(env).closing
    assert second["messages"] == [
        {"role": "user", "content": ptx(env).prompt.text},
        {"role": "assistant", "content": no_code},
        {"role": "user", "content": first["feedback"] + closing},
        {"role": "assistant", "content": reply},
        {"role": "user", "content": second["feedback"] + closing},
    ]
    assert "Status: FORMAT_ERROR" in second["messages"][2]["content"]
    assert "Status: COMPILED" in second["messages"][4]["content"]
    assert observation.endswith(second["messages"][4]["content"])
    assert NAIVE_GEMM.rstrip() in observation  # history="full": the flat text echoes the kernel
    assert NAIVE_GEMM.rstrip() not in second["messages"][4]["content"]
    env.close()


@pytest.mark.skipif(
    importlib.util.find_spec("transformers") is None, reason="needs transformers installed"
)
@pytest.mark.parametrize(("template", "system"), [(CHATML, SYSTEM), (MISTRAL, None)])
def test_chat_messages_render_with_a_chat_template(template: str, system: str | None) -> None:
    # Imported by name: mypy then needs neither package (nor its stubs) where it checks tests.
    tokenizers = importlib.import_module("tokenizers")
    models = importlib.import_module("tokenizers.models")
    transformers = importlib.import_module("transformers")
    # A tokenizer built here, not downloaded: a one-word vocabulary is enough to render text.
    tokenizer = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tokenizers.Tokenizer(models.WordLevel({"<unk>": 0}, unk_token="<unk>")),
        bos_token="<s>",
        eos_token="</s>",
    )
    tokenizer.chat_template = template
    env = ChatMessages(make_env([WRONG, PLAIN], turns=2), system=system)
    env.reset()
    env.step("no code")
    messages = env.step(f"```cuda\n{kernel(1)}```")[4]["messages"]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert isinstance(text, str)
    assert all(message["content"] in text for message in messages)
    if system is None:  # Mistral's template checks the order: one message off, and it fails
        with pytest.raises(Exception, match="must alternate"):
            tokenizer.apply_chat_template(messages[1:], tokenize=False)
