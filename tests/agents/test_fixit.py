"""Fixit (``ptxgym.bench.fixit``) on recorded runs, with a teacher behind a real OpenAI-compatible
server on 127.0.0.1 (tests/chat_server.py) and the compile-only evaluator: every failed turn is
attempted once, only verified repairs become SFT records, duplicates are dropped, the attempts
log makes it resumable, and the statistics count every attempt."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from chat_server import ChatRequest, ChatServer, Step
from gemm_candidates import NAIVE_GEMM

from ptxgym import paths
from ptxgym.agents.openai_chat import ChatSettings, OpenAIAgent
from ptxgym.bench.fixit import (
    UNQUALIFIED,
    attempts_path,
    category_of,
    failures,
    fixit,
    read_attempts,
    verified,
)
from ptxgym.cli import main
from ptxgym.evaluate.compile_only import CompileOnlyEvaluator
from ptxgym.outcome import Outcome, Status
from ptxgym.records.turns import TurnRecord, read_records

pytestmark = pytest.mark.nvcc

KEY, MODEL = "test-key", "teacher"
BROKEN = NAIVE_GEMM.replace("return", "retrun", 1)


def record(turn: int, status: str, source: str | None, **changes: Any) -> TurnRecord:
    fields: dict[str, Any] = {
        "run": "r",
        "task_id": "PTX-H100-GEMM",
        "prompt_variant": 0,
        "knowledge": "full",
        "trajectory": 0,
        "turn": turn,
        "agent": "openai:student",
        "status": status,
        "correct": status == "PASSED",
        "qualified": None,
        "speedup": None,
        "latency_ms": None,
        "baseline_latency_ms": None,
        "reward": 0.0,
        "reward_components": {},
        "source": source,
        "feedback": f"Status: {status}: what went wrong at turn {turn}",
        "message": "",
        "step_seconds": 0.1,
        "evaluator": "compile-only",
    }
    return TurnRecord(**(fields | changes))


@pytest.fixture
def run_file(tmp_path: Path) -> Path:
    """Failures of every category, a passing turn, a reply without code, and a duplicate."""
    records = [
        record(1, "COMPILE_ERROR", BROKEN),
        record(2, "FORMAT_ERROR", None),
        record(3, "INCORRECT_NUMERICAL", NAIVE_GEMM + "\n// wrong\n"),
        record(4, "PASSED", NAIVE_GEMM, qualified=False),  # correct, not qualified
        record(5, "PASSED", NAIVE_GEMM, qualified=True),
        record(1, "COMPILE_ERROR", BROKEN, trajectory=1),  # the same failure elsewhere
        record(2, "RUNTIME_ERROR", NAIVE_GEMM + "\n// crashes\n", trajectory=1),
    ]
    path = tmp_path / "run.jsonl"
    path.write_text("".join(r.to_json() + "\n" for r in records))
    return path


def teacher_reply(request: ChatRequest) -> Step:
    """Repairs the broken kernel, gives a kernel for the wrong one, no code for the crash."""
    asked = request.messages[-1]["content"]
    if "// crashes" in asked:
        return Step("I cannot tell what crashed here.")
    if "retrun" in asked:
        return Step(f"`retrun` is a typo for `return`.\n\n```cuda\n{NAIVE_GEMM}```")
    return Step(f"The extra comment changes nothing; here it is again.\n\n```cuda\n{NAIVE_GEMM}```")


def test_failures_are_categorised_and_verified_as_the_evaluator_allows() -> None:
    assert category_of(record(1, "COMPILE_ERROR", "x")) == "compile"
    assert category_of(record(1, "TIMEOUT", "x")) == "runtime"
    assert category_of(record(1, "MEMORY_ERROR", "x")) == "memory"
    assert category_of(record(1, "INCORRECT_SHAPE", "x")) == "incorrect"
    assert category_of(record(1, "PASSED", "x", qualified=False)) == UNQUALIFIED
    assert category_of(record(1, "PASSED", "x", qualified=None)) is None
    assert category_of(record(1, "COMPILED", "x")) is None
    assert not failures([record(1, "COMPILE_ERROR", None)])  # no kernel to repair
    built = Outcome(task_id="t", status=Status.COMPILED, message="", evaluator="compile-only")
    passed = Outcome(task_id="t", status=Status.PASSED, message="", evaluator="gpu")
    assert verified(built, "compile") and not verified(built, UNQUALIFIED)
    assert verified(passed, "incorrect") and not verified(passed, UNQUALIFIED)
    qualified = Outcome(
        task_id="t", status=Status.PASSED, message="", evaluator="gpu", qualified=True
    )
    assert verified(qualified, UNQUALIFIED)


def test_fixit_keeps_only_verified_repairs_once_and_resumes(
    run_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PTXGYM_TEST_KEY", KEY)
    out = tmp_path / "fixit.jsonl"
    with ChatServer(teacher_reply, api_key=KEY, models=(MODEL,)) as server:
        teacher = OpenAIAgent(
            ChatSettings(model=MODEL, base_url=server.base_url, api_key_env="PTXGYM_TEST_KEY")
        )
        first = fixit([run_file], teacher, CompileOnlyEvaluator(), out, concurrency=2, limit=2)
        assert first["attempts"] == 2
        stats = fixit([run_file], teacher, CompileOnlyEvaluator(), out, concurrency=2)
        asked = len(server.completions)
        again = fixit([run_file], teacher, CompileOnlyEvaluator(), out)
        assert len(server.completions) == asked  # every failure was attempted: nothing asked
    # 5 failures with a kernel: compile x2 (one duplicate repair), incorrect, unqualified
    # (not verifiable without a GPU), runtime (no code in the reply).
    assert stats == again
    assert stats["attempts"] == 5 and asked == 5
    assert stats["per_category"] == {
        "compile": {"attempts": 2, "verified": 2, "repair_rate": 1.0},
        "incorrect": {"attempts": 1, "verified": 1, "repair_rate": 1.0},
        "runtime": {"attempts": 1, "verified": 0, "repair_rate": 0.0},
        UNQUALIFIED: {"attempts": 1, "verified": 0, "repair_rate": 0.0},
    }
    samples = [json.loads(line) for line in out.read_text().splitlines()]
    assert stats["records"] == len(samples) == 2  # the two compile repairs are one record
    statuses = {a.status for a in read_attempts(attempts_path(out))}
    assert statuses == {"COMPILED", "FORMAT_ERROR"}
    by_category = {s["meta"]["category"]: s for s in samples}
    compile_sample = by_category["compile"]
    user, assistant = compile_sample["messages"]
    assert user["role"] == "user" and assistant["role"] == "assistant"
    assert "# Task PTX-H100-GEMM" in user["content"]  # the task's prompt
    assert "retrun" in user["content"] and "Status: COMPILE_ERROR" in user["content"]
    assert assistant["content"].startswith("`retrun` is a typo")
    assert compile_sample["meta"]["repair"]["status"] == "COMPILED"
    assert compile_sample["meta"]["teacher"] == MODEL
    assert re.search(r"```cuda\n", assistant["content"])


def test_the_cli_runs_fixit_and_prints_the_repair_rates(
    run_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    monkeypatch.setenv("PTXGYM_TEST_KEY", KEY)
    out = tmp_path / "fixit.jsonl"
    with ChatServer(teacher_reply, api_key=KEY, models=(MODEL,)) as server:
        code = main(
            [
                "fixit",
                str(run_file),
                *("--teacher-model", MODEL, "--base-url", server.base_url),
                *("--api-key-env", "PTXGYM_TEST_KEY", "--evaluator", "compile-only"),
                *("--out", str(out)),
            ]
        )
    printed = capsys.readouterr().out
    assert code == 0
    assert "Fixit: 5 attempts, 3 verified repairs, 2 records" in printed
    assert "compile: 2/2 repaired (100%)" in printed
    assert len(list(read_records(run_file))) == 7  # the run's records are read, not changed


TRITON_GEMM = (paths.examples_dir() / "triton" / "gemm.py").read_text()


def test_a_triton_failure_is_repaired_and_judged_in_triton(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The record's language decides the prompt, the fence asked for, and how the repair is
    built: a Triton module, not a CUDA translation unit."""
    monkeypatch.setenv("PTXGYM_TEST_KEY", KEY)
    broken = TRITON_GEMM.replace("def ", "def def ", 1)
    run_file = tmp_path / "run.jsonl"
    run_file.write_text(record(1, "COMPILE_ERROR", broken, language="triton").to_json() + "\n")
    out = tmp_path / "fixit.jsonl"

    def repair(request: ChatRequest) -> Step:
        return Step(f"A doubled `def`.\n\n```python\n{TRITON_GEMM}```")

    with ChatServer(repair, api_key=KEY, models=(MODEL,)) as server:
        teacher = OpenAIAgent(
            ChatSettings(model=MODEL, base_url=server.base_url, api_key_env="PTXGYM_TEST_KEY")
        )
        stats = fixit([run_file], teacher, "compile-only", out)
        asked = server.completions[0].messages[-1]["content"]
    assert "```python\n" in asked and "one ```python block" in asked
    assert stats["per_category"] == {"compile": {"attempts": 1, "verified": 1, "repair_rate": 1.0}}
    (sample,) = [json.loads(line) for line in out.read_text().splitlines()]
    assert sample["meta"]["language"] == "triton"
    assert sample["meta"]["repair"]["status"] == "COMPILED"
