"""Runs through the real pipeline (compile-only): every episode recorded, and resumed exactly."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from ptxgym import paths
from ptxgym.agents.base import Agent
from ptxgym.bench.runner import RunPlan, ScriptedAgent, run
from ptxgym.cli import main
from ptxgym.evaluate.compile_only import CompileOnlyEvaluator
from ptxgym.evaluate.evaluator import Evaluator
from ptxgym.languages.cuda.extract import extract_source
from ptxgym.outcome import Outcome
from ptxgym.records.turns import read_records
from ptxgym.tasks import Task, get_task

NAIVE_GEMM = paths.examples_dir() / "naive" / "gemm.cu"
TASKS = ("PTX-H100-GEMM", "PTX-B200-GEMM")
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


class CountingEvaluator:
    """Compile-only evaluation that remembers every candidate it was asked to evaluate."""

    name = "counting"

    def __init__(self) -> None:
        self.inner = CompileOnlyEvaluator()
        self.calls: list[tuple[str, str]] = []

    def evaluate(self, task: Task, source: str) -> Outcome:
        self.calls.append((task.id, source))
        return self.inner.evaluate(task, source)

    def close(self) -> None:
        """Nothing to free."""


class Interrupted(Exception):
    """Stands for a crash or Ctrl-C in the middle of a run."""


class Watching:
    """Passes turns to an agent, keeping what it saw; raises instead of call ``limit + 1``."""

    def __init__(self, agent: Agent, limit: int | None = None) -> None:
        self.agent = agent
        self.name = agent.name
        self.limit = limit
        self.seen: list[tuple[str, int, str | None]] = []

    def act(self, observation: str, info: dict[str, Any]) -> str:
        if len(self.seen) == self.limit:
            raise Interrupted
        self.seen.append((observation, info["turn"], info.get("feedback")))
        return self.agent.act(observation, info)


@pytest.fixture
def broken(tmp_path: Path) -> Path:
    path = tmp_path / "broken.cu"
    path.write_text(NAIVE_GEMM.read_text().replace("return", "retrun", 1))
    return path


@pytest.fixture
def no_code(tmp_path: Path) -> Path:
    """A reply without code: a FORMAT_ERROR that costs no compile."""
    path = tmp_path / "reply.txt"
    path.write_text("I would rather not write a kernel today.")
    return path


def plan(evaluator: Evaluator | str, **changes: Any) -> RunPlan:
    settings: dict[str, Any] = {
        "name": "t",
        "tasks": TASKS,
        "variants": (0, 1),
        "trajectories": 2,
        "turns": 2,
        "evaluator": evaluator,
    }
    return RunPlan(**(settings | changes))


def normalized(path: Path) -> list[dict[str, Any]]:
    """The records without the fields that time the run or depend on the build cache."""
    lines = []
    for line in path.read_text().splitlines():
        data = json.loads(line)
        del data["timestamp"], data["step_seconds"], data["outcome"]["seconds"]
        if data["outcome"]["compile"]:
            del data["outcome"]["compile"]["seconds"], data["outcome"]["compile"]["cached"]
        lines.append(data)
    return lines


@pytest.mark.nvcc
def test_run_records_every_turn_of_every_episode(tmp_path: Path, broken: Path) -> None:
    evaluator = CountingEvaluator()
    out = run(plan(evaluator), ScriptedAgent([broken, NAIVE_GEMM]), tmp_path / "run.jsonl")
    records = list(read_records(out))
    assert len(records) == len(evaluator.calls) == 2 * 2 * 2 * 2
    assert {(r.task_id, r.prompt_variant, r.trajectory, r.turn) for r in records} == {
        (task, variant, trajectory, turn)
        for task in TASKS
        for variant in (0, 1)
        for trajectory in (0, 1)
        for turn in (1, 2)
    }
    assert {(r.turn, r.status) for r in records} == {(1, "COMPILE_ERROR"), (2, "COMPILED")}
    assert all(r.run == "t" and r.agent == "scripted" and r.knowledge == "full" for r in records)
    # Run again: everything is recorded, so nothing is evaluated or appended.
    run(plan(evaluator), ScriptedAgent([broken, NAIVE_GEMM]), out, progress=False)
    assert len(list(read_records(out))) == len(evaluator.calls) == 16


@pytest.mark.nvcc
def test_a_resumed_run_equals_an_uninterrupted_one(tmp_path: Path, broken: Path) -> None:
    files = [broken, NAIVE_GEMM]
    # The feedback quotes the build time, so warm the build cache: both runs then see the same
    # (cached) builds and their feedback and observations can be compared exactly.
    for task_id in TASKS:
        for path in files:
            CompileOnlyEvaluator().evaluate(get_task(task_id), path.read_text())

    whole_evaluator, whole_agent = CountingEvaluator(), Watching(ScriptedAgent(files))
    whole = run(plan(whole_evaluator), whole_agent, tmp_path / "whole.jsonl", progress=False)

    evaluator = CountingEvaluator()
    # Five turns: two whole episodes, then the first turn of the third.
    first = Watching(ScriptedAgent(files), limit=5)
    with pytest.raises(Interrupted):
        run(plan(evaluator), first, tmp_path / "resumed.jsonl", progress=False)
    assert len(list(read_records(tmp_path / "resumed.jsonl"))) == 5
    second = Watching(ScriptedAgent(files))
    resumed = run(plan(evaluator), second, tmp_path / "resumed.jsonl", progress=False)

    assert normalized(resumed) == normalized(whole)
    assert evaluator.calls == whole_evaluator.calls  # nothing evaluated twice, nothing skipped
    # The resumed agent started from the restored observation and the last turn's info.
    assert second.seen[0][1:] == (1, whole_agent.seen[5][2])
    assert first.seen + second.seen == whole_agent.seen


def test_a_partly_recorded_episode_needs_its_turns_in_order(tmp_path: Path, no_code: Path) -> None:
    out = tmp_path / "run.jsonl"
    one = plan(CountingEvaluator(), tasks=TASKS[:1], variants=(0,), trajectories=1, turns=3)
    run(one, ScriptedAgent([no_code]), out, progress=False)
    lines = out.read_text().splitlines(keepends=True)
    out.write_text(lines[0] + lines[2])
    with pytest.raises(ValueError, match=r"recorded turns \[1, 3\]"):
        run(one, ScriptedAgent([no_code]), out, progress=False)


def test_another_agent_does_not_resume_a_run(tmp_path: Path, no_code: Path) -> None:
    out = tmp_path / "run.jsonl"
    one = plan(CountingEvaluator(), tasks=TASKS[:1], variants=(0,), trajectories=1, turns=2)
    first = Watching(ScriptedAgent([no_code]), limit=1)
    with pytest.raises(Interrupted):
        run(one, first, out, progress=False)
    other = Watching(ScriptedAgent([no_code]))
    other.name = "another-model"
    with pytest.raises(ValueError, match="recorded by agent 'scripted', not 'another-model'"):
        run(one, other, out, progress=False)


def test_scripted_agent_submits_the_file_of_each_turn(tmp_path: Path) -> None:
    first, second = tmp_path / "a.cu", tmp_path / "b.cu"
    first.write_text("first")
    second.write_text("second")
    agent = ScriptedAgent([first, second])
    assert [agent.act("", {"turn": t}) for t in range(4)] == ["first", "second", "second", "second"]
    with pytest.raises(FileNotFoundError):
        ScriptedAgent([tmp_path / "missing.cu"])
    binary = tmp_path / "binary.cu"
    binary.write_bytes(b"__global__ void k() {}\xff")
    action = ScriptedAgent([binary]).act("", {"turn": 0})
    assert "not valid UTF-8" in (extract_source(action).error or "")


@pytest.mark.parametrize(
    ("changes", "error"),
    [
        ({"tasks": ("PTX-H100-Nope",)}, KeyError),
        ({"tasks": (TASKS[0], TASKS[0])}, ValueError),
        ({"variants": (3,)}, ValueError),
        ({"turns": 0}, ValueError),
        ({"knowledge": "most"}, ValueError),
        ({"evaluator": "tpu"}, ValueError),
    ],
)
def test_a_bad_plan_fails_before_running(changes: dict[str, Any], error: type[Exception]) -> None:
    settings = {"evaluator": CountingEvaluator()} | changes
    with pytest.raises(error):
        plan(**settings)


def test_cli_run_records_reports_and_resumes(
    tmp_path: Path, no_code: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "runs" / "mine.jsonl"
    argv = ["run", "--tasks", "PTX-H100-GEMM", "--variants", "0,2", "--turns", "2"]
    argv += ["--evaluator", "compile-only", "--files", str(no_code), "--out", str(out)]
    assert main([*argv, "--no-progress"]) == 0
    printed = capsys.readouterr().out
    assert "## mine" in printed and "| PTX-H100-GEMM | 0.00 (0.00) |" in printed
    records = list(read_records(out))
    assert [(r.prompt_variant, r.turn, r.status) for r in records] == [
        (0, 1, "FORMAT_ERROR"),
        (0, 2, "FORMAT_ERROR"),
        (2, 1, "FORMAT_ERROR"),
        (2, 2, "FORMAT_ERROR"),
    ]
    assert main([*argv, "--no-progress"]) == 0
    assert len(list(read_records(out))) == 4  # already complete: nothing added


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--tasks", "PTX-H100-Nope"], "unknown task"),
        (["--tasks", "PTX-H100-GEMM", "--variants", "0,x"], "--variants"),
        (["--tasks", "PTX-H100-GEMM", "--variants", "5"], "prompt variants"),
    ],
)
def test_cli_run_errors(
    tmp_path: Path, no_code: Path, args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["run", *args, "--files", str(no_code), "--out", str(tmp_path / "r.jsonl")]
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_cli_run_needs_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "--tasks", "all", "--out", str(tmp_path / "r.jsonl")]) == 2
    assert "needs --files" in capsys.readouterr().err


@pytest.mark.nvcc
def test_demo_writes_records_report_and_plot(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from ptxgym.device.gpus import visible_gpus

    assert main(["demo", "--out", str(tmp_path)]) == 0
    printed = capsys.readouterr().out
    if not visible_gpus():
        assert "No NVIDIA GPU found" in printed
    assert "| PTX-H100-GEMM |" in printed and "example runs succeeded" in printed
    records = list(read_records(tmp_path / "demo.jsonl"))
    assert {r.task_id for r in records} >= {"PTX-H100-GEMM", "PTX-B200-GEMM"}
    assert (tmp_path / "report.md").read_text().startswith("# ptxgym report")
    assert (tmp_path / "fastp.png").read_bytes().startswith(PNG_MAGIC)


def test_demo_refuses_a_concurrency_below_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["demo", "--out", str(tmp_path), "--concurrency", "0"]) == 2
    assert "--concurrency must be at least 1, not 0" in capsys.readouterr().err
    assert not (tmp_path / "demo.jsonl").exists()


def test_a_run_in_another_language_does_not_resume_from_this_ones_turns(
    tmp_path: Path, no_code: Path
) -> None:
    """One file, one run name, two languages: the Triton run plays its own episodes instead of
    taking the CUDA run's recorded turns as its history."""
    out = tmp_path / "run.jsonl"
    one = plan(CompileOnlyEvaluator(), tasks=TASKS[:1], variants=(0,), trajectories=1, turns=1)
    run(one, ScriptedAgent([no_code]), out, progress=False)
    triton = plan(
        CompileOnlyEvaluator(language="triton"),
        tasks=TASKS[:1],
        variants=(0,),
        trajectories=1,
        turns=1,
        language="triton",
    )
    watching = Watching(ScriptedAgent([no_code]))
    run(triton, watching, out, progress=False)
    assert len(watching.seen) == 1  # played, not restored
    assert sorted(record.language for record in read_records(out)) == ["cuda", "triton"]
