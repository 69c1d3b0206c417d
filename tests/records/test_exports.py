"""The datasets made of recorded turns (``ptxgym.records.exports``): failure→repair pairs, and
FlashInfer-Trace datasets parsed back with FlashInfer-Bench's own schema."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from ptxgym import __version__
from ptxgym.interop import flashinfer_trace as trace
from ptxgym.outcome import CheckReport, Outcome, OutputCheck, Status, WorkloadTiming
from ptxgym.records.exports import (
    export_flashinfer,
    repair_pairs,
    write_repair_dataset,
)
from ptxgym.records.turns import TurnRecord
from ptxgym.tasks import Task, get_task

GEMM = "PTX-H100-GEMM"
DECODE = "PTX-H100-GQADecode"


# --------------------------------------------------------------------------------------------
# Repair pairs


def make_record(
    turn: int,
    status: Status,
    *,
    source: str | None = "",
    trajectory: int = 0,
    knowledge: str = "full",
    task_id: str = GEMM,
    speedup: float | None = None,
    qualified: bool | None = None,
    outcome: Outcome | None = None,
    versions: dict[str, str] | None = None,
) -> TurnRecord:
    passed = status is Status.PASSED
    if outcome is None:
        outcome = Outcome(
            task_id,
            status,
            f"{status.value} at turn {turn}",
            "scripted",
            latency_ms=1.0 if passed else None,
            baseline_latency_ms=speedup if passed else None,
            speedup=speedup,
            qualified=qualified,
        )
    return TurnRecord(
        run="r",
        task_id=task_id,
        prompt_variant=0,
        knowledge=knowledge,
        trajectory=trajectory,
        turn=turn,
        agent="tester",
        status=status.value,
        correct=passed,
        qualified=outcome.qualified,
        speedup=outcome.speedup,
        latency_ms=outcome.latency_ms,
        baseline_latency_ms=outcome.baseline_latency_ms,
        reward=0.0,
        reward_components={},
        source=f"// kernel of turn {turn}\n" if source == "" else source,
        feedback=f"feedback of turn {turn}",
        message=outcome.message,
        step_seconds=1.0,
        evaluator=outcome.evaluator,
        versions=versions or {},
        timestamp="2025-01-01T00:00:00.000+00:00",
        outcome=json.loads(json.dumps(outcome.to_dict())),
    )


def test_repair_pairs() -> None:
    records = [
        make_record(3, Status.PASSED, speedup=1.2, qualified=True),
        make_record(1, Status.COMPILE_ERROR),
        make_record(2, Status.INCORRECT_NUMERICAL),
        make_record(4, Status.FORMAT_ERROR, source=None),  # nothing submitted: no pair
        make_record(5, Status.RUNTIME_ERROR),
        make_record(6, Status.PASSED, speedup=2.0, qualified=False),
        make_record(7, Status.TIMEOUT),  # nothing correct later: no pair
        # Another knowledge level with the same trajectory index is another trajectory.
        make_record(1, Status.COMPILE_ERROR, knowledge="none"),
        make_record(2, Status.COMPILE_ERROR, knowledge="none"),
        # So is another language: its failure is not repaired by the CUDA turn 3.
        replace(make_record(1, Status.COMPILE_ERROR), language="triton"),
    ]
    pairs = repair_pairs(records)
    assert [(p["failed_turn"], p["repaired_turn"]) for p in pairs] == [(1, 3), (2, 3), (5, 6)]
    first = pairs[0]
    assert first == {
        "run": "r",
        "task_id": GEMM,
        "prompt_variant": 0,
        "knowledge": "full",
        "language": "cuda",
        "trajectory": 0,
        "failed_turn": 1,
        "failed_status": "COMPILE_ERROR",
        "failed_source": "// kernel of turn 1\n",
        "feedback": "feedback of turn 1",
        "repaired_turn": 3,
        "repaired_source": "// kernel of turn 3\n",
        "repaired_speedup": 1.2,
        "repaired_qualified": True,
    }
    assert (pairs[2]["repaired_speedup"], pairs[2]["repaired_qualified"]) == (2.0, False)


def test_no_repair_without_a_later_correct_turn() -> None:
    records = [
        make_record(1, Status.PASSED, speedup=1.0),
        make_record(2, Status.INCORRECT_SHAPE),
        make_record(3, Status.COMPILE_ERROR),
    ]
    assert repair_pairs(records) == []


def test_write_repair_dataset(tmp_path: Path) -> None:
    records = [make_record(1, Status.COMPILE_ERROR), make_record(2, Status.PASSED, speedup=1.0)]
    path = tmp_path / "data" / "repairs.jsonl"
    assert write_repair_dataset(records, path) == 1
    lines = path.read_text(encoding="utf-8").splitlines()
    assert [json.loads(line) for line in lines] == repair_pairs(records)
    assert write_repair_dataset(records[:1], path) == 0  # the file is replaced
    assert path.read_text(encoding="utf-8") == ""


# --------------------------------------------------------------------------------------------
# FlashInfer-Trace export


def _read_dataset(files: Sequence[Path], root: Path) -> dict[str, list[Any]]:
    """Every written file parsed back with ptxgym.interop.flashinfer_trace's models, grouped by top
    folder."""
    parsed: dict[str, list[Any]] = {}
    for path in files:
        top = path.relative_to(root).parts[0]
        if top == "definitions":
            parsed.setdefault(top, []).append(trace.read_definition(path))
        elif top == "solutions":
            solution = trace.Solution.model_validate_json(path.read_text(encoding="utf-8"))
            assert path.stem == solution.name
            parsed.setdefault(top, []).append(solution)
        else:
            parsed.setdefault(top, []).extend(trace.read_jsonl(path))
    return parsed


def _decode_pass(task: Task) -> Outcome:
    timings = tuple(
        WorkloadTiming(w.name, 1.0 + i, 2.0 + i, (2.0 + i) / (1.0 + i), (1.0 + i,), "cupti")
        for i, w in enumerate(task.workloads)
    )
    checks = tuple(
        CheckReport(
            "trial0",
            w.name,
            tuple(
                OutputCheck(name, True, max_abs_error=1e-3 * (i + 1), max_rel_error=2e-3)
                for name in task.definition.outputs
            ),
        )
        for i, w in enumerate(task.workloads)
    )
    return Outcome(
        task.id,
        Status.PASSED,
        "correct",
        "gpu",
        latency_ms=sum(t.latency_ms for t in timings),
        baseline_latency_ms=sum(t.baseline_latency_ms for t in timings),
        speedup=1.3,
        qualified=True,
        checks=checks,
        timings=timings,
    )


def _decode_nan(task: Task) -> Outcome:
    bad = OutputCheck("o", False, "numerical", "NaN", max_abs_error=0.5, non_finite=3)
    checks = (CheckReport("trial0", task.workloads[1].name, (bad,)),)
    return Outcome(task.id, Status.INCORRECT_NUMERICAL, "o: NaN", "gpu", checks=checks)


def test_export_flashinfer_parses_back(tmp_path: Path) -> None:
    decode = get_task(DECODE)
    versions = {"gpu": "NVIDIA H200", "driver": "570.86", "ptxgym": __version__}
    records = [
        make_record(1, Status.FORMAT_ERROR, source=None),  # no source: nothing exported
        make_record(2, Status.COMPILE_ERROR),
        make_record(3, Status.PASSED, speedup=1.5, qualified=True, versions=versions),
        make_record(1, Status.PASSED, task_id=DECODE, outcome=_decode_pass(decode)),
        make_record(2, Status.INCORRECT_NUMERICAL, task_id=DECODE, outcome=_decode_nan(decode)),
    ]
    root = tmp_path / "fib"
    files = export_flashinfer(records, root)
    dataset = _read_dataset(files, root)
    gemm_name = trace.definition_name(get_task(GEMM))
    decode_name = trace.definition_name(decode)
    assert sorted(d.name for d in dataset["definitions"]) == sorted([gemm_name, decode_name])
    solutions = {s.name: s for s in dataset["solutions"]}
    assert sorted(solutions) == sorted(
        [
            f"r_{gemm_name}_v0_full_t0_2",
            f"r_{gemm_name}_v0_full_t0_3",
            f"r_{decode_name}_v0_full_t0_1",
            f"r_{decode_name}_v0_full_t0_2",
        ]
    )
    assert solutions[f"r_{gemm_name}_v0_full_t0_3"].sources[0].content == "// kernel of turn 3\n"
    assert all(s.author == "tester" for s in solutions.values())

    traces = dataset["traces"]
    assert len(traces) == 2 + 2 * len(decode.workloads)  # one per workload per turn
    assert {t.solution for t in traces} == set(solutions)
    workloads = {t.workload.uuid: t.workload for t in dataset["workloads"]}
    assert all(workloads[t.workload.uuid] == t.workload for t in traces)

    by_solution: dict[str, list[trace.Trace]] = {}
    for t in traces:
        by_solution.setdefault(t.solution or "", []).append(t)
    [gemm_failed] = by_solution[f"r_{gemm_name}_v0_full_t0_2"]
    assert gemm_failed.evaluation is not None
    assert gemm_failed.evaluation.status == "COMPILE_ERROR"
    [gemm_passed] = by_solution[f"r_{gemm_name}_v0_full_t0_3"]
    assert gemm_passed.evaluation is not None and gemm_passed.evaluation.performance is not None
    assert gemm_passed.evaluation.performance.speedup_factor == 1.5  # totals: one workload
    assert gemm_passed.evaluation.environment.hardware == "NVIDIA_H200"
    assert gemm_passed.evaluation.environment.libs == {"driver": "570.86", "ptxgym": __version__}
    assert gemm_passed.evaluation.timestamp == "2025-01-01T00:00:00.000+00:00"

    # A pooled task: each workload's trace has that workload's timing and error maxima.
    passed = by_solution[f"r_{decode_name}_v0_full_t0_1"]
    decode_uuids = [t.workload.uuid for t in dataset["workloads"] if t.definition == decode_name]
    assert [t.workload.uuid for t in passed] == decode_uuids
    for i, t in enumerate(passed):
        assert t.evaluation is not None and t.evaluation.performance is not None
        assert t.evaluation.correctness is not None
        assert t.evaluation.performance.latency_ms == 1.0 + i
        assert t.evaluation.performance.reference_latency_ms == 2.0 + i
        assert t.evaluation.correctness.max_absolute_error == pytest.approx(1e-3 * (i + 1))
        assert t.evaluation.correctness.max_relative_error == pytest.approx(2e-3)
    failed = by_solution[f"r_{decode_name}_v0_full_t0_2"]
    assert all(t.evaluation and t.evaluation.status == "INCORRECT_NUMERICAL" for t in failed)
    errors = [
        t.evaluation.correctness.max_absolute_error
        for t in failed
        if t.evaluation and t.evaluation.correctness
    ]
    assert len(errors) == len(decode.workloads)
    assert all(math.isnan(e) for e in errors)  # unmeasured, or non-finite outputs

    before = {path: path.read_bytes() for path in files}
    again = export_flashinfer(records, root)  # idempotent: files rewritten, not appended
    assert {path: path.read_bytes() for path in again} == before


def test_export_without_sources_writes_nothing(tmp_path: Path) -> None:
    assert export_flashinfer([make_record(1, Status.FORMAT_ERROR, source=None)], tmp_path) == []
    assert list(tmp_path.iterdir()) == []
