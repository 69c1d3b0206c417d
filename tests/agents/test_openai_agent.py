"""The LLM agent (``ptxgym.agents.openai_chat``) against a real OpenAI-compatible server on
127.0.0.1 (tests/chat_server.py), with the real client over HTTP, through the real run loop and
the compile-only evaluator: replies with kernels, without code, broken; retries; a refused key;
a dead endpoint; a killed run resumed; the context policy."""

from __future__ import annotations

import json
import re
import threading
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from chat_server import ChatRequest, ChatServer, Step, scripted

from ptxgym import paths
from ptxgym.agents.base import AgentError
from ptxgym.agents.openai_chat import (
    OMITTED_FEEDBACK,
    OMITTED_REPLY,
    ChatSettings,
    OpenAIAgent,
    estimate_tokens,
    fit_context,
)
from ptxgym.bench import report
from ptxgym.bench.fixit import fixit
from ptxgym.bench.runner import RunPlan, run
from ptxgym.cli import main
from ptxgym.evaluate.compile_only import CompileOnlyEvaluator
from ptxgym.records.turns import read_records

pytestmark = pytest.mark.nvcc

KEY = "test-key"
MODEL = "test-model"
TASKS = ("PTX-H100-GEMM", "PTX-B200-GEMM", "PTX-H100-MHAFwd-d128")
KERNELS = {
    "PTX-H100-GEMM": "naive/gemm.cu",
    "PTX-B200-GEMM": "naive/gemm.cu",
    "PTX-H100-MHAFwd-d128": "naive/mha_fwd_d128.cu",
}
# What the scripted model answers at each turn of every conversation.
TURN_STATUS = {1: "COMPILED", 2: "FORMAT_ERROR", 3: "COMPILE_ERROR", 4: "COMPILED"}


def _task_of(request: ChatRequest) -> str:
    found = re.search(r"PTX-(?:H100|B200)-[A-Za-z]+(?:-d\d+)?", request.messages[0]["content"])
    assert found, "the first message is the task's prompt"
    return found.group()


def model(request: ChatRequest) -> Step:
    """A model that answers turn 1 with the task's naive kernel in prose, turn 2 without code,
    turn 3 with a kernel that does not compile, and turn 4 with the kernel again."""
    kernel = (paths.examples_dir() / KERNELS[_task_of(request)]).read_text()
    if request.turn == 2:
        return Step("I need to think about the tiling before I write anything.")
    if request.turn == 3:
        kernel = kernel.replace("return", "retrun", 1)
    return Step(f"Here is my kernel.\n\n```cuda\n{kernel}```\nIt should be correct.")


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setenv("PTXGYM_TEST_KEY", KEY)
    with ChatServer(model, api_key=KEY, models=(MODEL,)) as running:
        yield running


def agent_for(server: ChatServer, **changes: Any) -> OpenAIAgent:
    settings = ChatSettings(
        model=MODEL,
        base_url=server.base_url,
        api_key_env="PTXGYM_TEST_KEY",
        temperature=0.7,
        max_tokens=4096,
        max_retries=2,
        timeout_s=30.0,
    )
    return OpenAIAgent(ChatSettings(**(settings.__dict__ | changes)))


def plan(**changes: Any) -> RunPlan:
    settings: dict[str, Any] = {
        "name": "llm",
        "tasks": TASKS,
        "variants": (0, 1, 2),
        "trajectories": 2,
        "turns": 4,
        "evaluator": "compile-only",
    }
    return RunPlan(**(settings | changes))


def test_a_run_against_the_server_records_every_turn_with_the_models_usage(
    server: ChatServer, tmp_path: Path
) -> None:
    out = run(plan(), agent_for(server), tmp_path / "run.jsonl", progress=False, concurrency=4)
    records = list(read_records(out))
    assert len(records) == 3 * 3 * 2 * 4
    assert Counter(r.status for r in records) == Counter(
        {status: 18 for status in TURN_STATUS.values()} | {"COMPILED": 36}
    )
    for record in records:
        assert record.status == TURN_STATUS[record.turn]
        assert record.agent == f"openai:{MODEL}"
        generation = record.generation
        assert generation["model"] == MODEL and generation["finish_reason"] == "stop"
        assert generation["prompt_tokens"] > 0 and generation["completion_tokens"] > 0
        assert generation["reply"].startswith(("Here is my kernel", "I need to think"))
    # What the model was sent: the prompt, then each reply and its feedback, in order.
    requests = server.completions
    assert len(requests) == len(records)
    last_turns = [r for r in requests if r.turn == 4]
    assert len(last_turns) == 18
    messages = last_turns[0].messages
    assert [m["role"] for m in messages] == ["user"] + ["assistant", "user"] * 3
    assert "COMPILED" in messages[2]["content"]
    assert messages[3]["content"].startswith("I need to think")
    assert "FORMAT_ERROR" in messages[4]["content"]
    assert messages[-1]["content"].endswith("reply with one ```cuda block.")
    assert all(r.body["temperature"] == 0.7 for r in requests)
    assert all(r.body["max_completion_tokens"] == 4096 for r in requests)
    # Its report: one per-model row for the agent, with its tokens.
    table = report.report([out])
    assert "## Per model" in table
    row = next(line for line in table.splitlines() if line.startswith(f"| openai:{MODEL} |"))
    prompt_tokens = sum(r.generation["prompt_tokens"] for r in records)
    assert f"{prompt_tokens:,}" in row
    # Fixit over it: each task's broken kernel (turn 3 of every episode) repaired once.
    stats = fixit([out], agent_for(server), CompileOnlyEvaluator(), tmp_path / "fixit.jsonl")
    assert stats["per_category"] == {
        "compile": {"attempts": 18, "verified": 18, "repair_rate": 1.0}
    }
    assert stats["records"] == 3


def test_episodes_overlap_when_run_concurrently(server: ChatServer, tmp_path: Path) -> None:
    """With 4 episodes under way, requests of different episodes arrive while others are being
    evaluated: at some point several requests are in flight at once."""
    slow = ChatServer(
        lambda request: Step(model(request).text, delay_s=0.3), api_key=KEY, models=(MODEL,)
    )
    with slow:
        out = tmp_path / "run.jsonl"
        run(
            plan(tasks=TASKS[:1], variants=(0, 1), turns=2),
            agent_for(slow),
            out,
            progress=False,
            concurrency=4,
        )
        arrivals = sorted(r.received_at for r in slow.completions)
    assert len(list(read_records(out))) == 1 * 2 * 2 * 2
    # Four conversations started together: their first requests arrived within one reply's delay.
    assert arrivals[3] - arrivals[0] < 0.3


def test_a_rate_limit_then_a_reply_is_retried_by_the_client(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PTXGYM_TEST_KEY", KEY)
    kernel = (paths.examples_dir() / "naive" / "gemm.cu").read_text()
    steps = scripted(Step.rate_limited(0.05), Step.server_error(), Step(f"```cuda\n{kernel}```"))
    with ChatServer(steps, api_key=KEY, models=(MODEL,)) as limited:
        out = run(
            plan(tasks=TASKS[:1], variants=(0,), trajectories=1, turns=1),
            agent_for(limited),
            tmp_path / "run.jsonl",
            progress=False,
        )
        assert [r.status for r in limited.completions] == [429, 500, 200]
    (record,) = read_records(out)
    assert record.status == "COMPILED"


@pytest.mark.parametrize(
    ("step", "message"),
    [
        (Step(status=401), "refused the request (401)"),
        (Step.dropped(), "still failed after 1 retries: APIConnectionError"),
        (Step.server_error(), "still failed after 1 retries: InternalServerError"),
    ],
    ids=["bad-key", "dropped", "server-error"],
)
def test_a_failing_endpoint_stops_the_run_with_a_clear_error(
    step: Step, message: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PTXGYM_TEST_KEY", KEY if step.status != 401 else "wrong-key")
    with ChatServer(scripted(step), api_key=KEY, models=(MODEL,)) as failing:
        agent = agent_for(failing, max_retries=1)
        with pytest.raises(AgentError, match=re.escape(message)):
            run(plan(tasks=TASKS[:1]), agent, tmp_path / "run.jsonl", progress=False)


def test_a_missing_key_is_said_before_anything_runs(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("PTXGYM_TEST_KEY", raising=False)
    with pytest.raises(AgentError, match="set PTXGYM_TEST_KEY"):
        OpenAIAgent(ChatSettings(model=MODEL, api_key_env="PTXGYM_TEST_KEY"))
    out = tmp_path / "run.jsonl"
    arguments = ["--api-key-env", "PTXGYM_TEST_KEY", "--out", str(out)]
    code = main(
        ["run", "--agent", "openai", "--model", MODEL, "--tasks", "PTX-H100-GEMM", *arguments]
    )
    assert code != 0 and not out.exists()
    assert "ptxgym: error: set PTXGYM_TEST_KEY" in capsys.readouterr().err


def test_a_killed_run_resumes_with_the_conversation_as_it_was(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The endpoint dies after 11 replies; the run stops, resumes against a live one, and the
    resumed conversations hold the replies the model really sent."""
    monkeypatch.setenv("PTXGYM_TEST_KEY", KEY)
    answered = Counter[str]()
    lock = threading.Lock()

    def dying(request: ChatRequest) -> Step:
        with lock:
            answered["n"] += 1
            if answered["n"] > 11:
                return Step.server_error()
        return model(request)

    out = tmp_path / "run.jsonl"
    small = plan(tasks=TASKS[:1], variants=(0, 1), trajectories=2, turns=4)
    with ChatServer(dying, api_key=KEY, models=(MODEL,)) as first, pytest.raises(AgentError):
        run(small, agent_for(first, max_retries=0), out, progress=False)
    before = list(read_records(out))
    assert len(before) == 11
    with ChatServer(model, api_key=KEY, models=(MODEL,)) as second:
        run(small, agent_for(second), out, progress=False)
        resumed = second.completions
    after = list(read_records(out))
    assert len(after) == 16 and after[:11] == before
    assert sorted((r.prompt_variant, r.trajectory, r.turn) for r in after) == sorted(
        (v, t, turn) for v in (0, 1) for t in (0, 1) for turn in range(1, 5)
    )
    assert len(resumed) == 16 - 11  # no recorded turn asked again
    # The first resumed request continues a conversation: the earlier replies are the real ones.
    continued = next(r for r in resumed if r.turn > 1)
    replies = [m["content"] for m in continued.messages if m["role"] == "assistant"]
    assert replies[0].startswith("Here is my kernel.")


def test_the_cli_runs_the_openai_agent_and_summarises_its_tokens(
    server: ChatServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "cli.jsonl"
    code = main(
        [
            "run",
            *("--agent", "openai", "--model", MODEL, "--base-url", server.base_url),
            *("--api-key-env", "PTXGYM_TEST_KEY", "--tasks", "PTX-H100-GEMM"),
            *("--variants", "0", "--turns", "2", "--knowledge", "none,full"),
            *("--evaluator", "compile-only", "--concurrency", "2", "--no-progress"),
            *("--extra-body", json.dumps({"top_k": 20}), "--prices", "2,8", "--out", str(out)),
        ]
    )
    printed = capsys.readouterr().out
    assert code == 0
    records = list(read_records(out))
    assert sorted((r.knowledge, r.turn) for r in records) == [
        ("full", 1),
        ("full", 2),
        ("none", 1),
        ("none", 2),
    ]
    generated = [r.generation for r in records]
    cost = sum(2 * g["prompt_tokens"] + 8 * g["completion_tokens"] for g in generated) / 1e6
    assert "Model use: 4 replies" in printed and f"${cost:,.2f} at the prices given" in printed
    assert all(r.body["top_k"] == 20 for r in server.completions)


def _conversation(turns: int, reply_chars: int, feedback_chars: int) -> list[dict[str, str]]:
    messages = [{"role": "user", "content": "p" * 400}]
    for turn in range(1, turns + 1):
        messages.append({"role": "assistant", "content": f"{turn}" * reply_chars})
        messages.append({"role": "user", "content": f"{turn}" * feedback_chars})
    return messages


def test_the_context_policy_cuts_old_replies_first_then_old_feedback() -> None:
    messages = _conversation(turns=4, reply_chars=4000, feedback_chars=400)
    assert fit_context(messages, None, None) == (messages, 0)
    whole = estimate_tokens(messages)
    assert fit_context(messages, whole, 0) == (messages, 0)
    # Room for all but about two replies: the two oldest go, their feedback stays.
    fitted, omitted = fit_context(messages, whole - 1500, 0)
    assert omitted == 2
    assert fitted[1]["content"] == OMITTED_REPLY.format(turn=1)
    assert fitted[3]["content"] == OMITTED_REPLY.format(turn=2)
    assert fitted[2] == messages[2] and fitted[5] == messages[5]
    assert estimate_tokens(fitted) <= whole - 1500
    # Tighter: every reply but the last, then the oldest feedback.
    fitted, _ = fit_context(messages, 400, 0)
    assert fitted[0] == messages[0] and fitted[-2:] == messages[-2:]
    assert fitted[2]["content"] == OMITTED_FEEDBACK.format(turn=1)
    assert fitted[5]["content"] == OMITTED_REPLY.format(turn=3)
    # The reply's room counts too.
    assert fit_context(messages, whole + 100, 200)[1] == 1
