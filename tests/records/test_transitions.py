"""Transitions between consecutive turns: events and diffs, in records and in reports."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from turn_records import turn, write

from ptxgym.bench.categories import category_rows
from ptxgym.bench.report import report
from ptxgym.bench.runs import load
from ptxgym.records.transitions import Turn, events, trajectory_transitions, transition
from ptxgym.records.turns import TurnRecord


def _turn(number: int, correct: bool, speedup: float | None = None, source: str = "") -> Turn:
    return Turn(number, "PASSED" if correct else "INCORRECT_NUMERICAL", correct, speedup, source)


def test_events_name_what_changed() -> None:
    assert events(_turn(1, False), _turn(2, True, 1.0)) == ("fixed",)
    assert events(_turn(1, True, 1.0), _turn(2, False)) == ("regressed",)
    assert events(_turn(1, True, 1.0), _turn(2, True, 1.2)) == ("faster",)
    assert events(_turn(1, True, 1.2), _turn(2, True, 1.0)) == ("slower",)
    assert events(_turn(1, True, 1.0), _turn(2, True, 1.03)) == ()  # within the timing noise
    assert events(_turn(1, False), _turn(2, False)) == ()


def test_a_transition_carries_the_unified_diff() -> None:
    step = transition(_turn(1, False, source="a\nb\n"), _turn(2, True, 0.5, source="a\nc\nd\n"))
    assert step.events == ("fixed",)
    assert (step.before, step.after, step.added, step.removed) == (1, 2, 2, 1)
    assert step.diff.startswith("--- turn 1\n+++ turn 2\n")
    assert "-b\n" in step.diff and "+c\n" in step.diff
    assert step.to_dict()["events"] == ["fixed"]


def test_trajectories_pair_consecutive_turns_in_order() -> None:
    turns = [_turn(3, True, 2.0), _turn(1, False), _turn(2, True, 1.0)]
    steps = trajectory_transitions(turns)
    assert [(s.before, s.after, s.events) for s in steps] == [
        (1, 2, ("fixed",)),
        (2, 3, ("faster",)),
    ]


def _record(number: int, speedup: float | None, category: str) -> TurnRecord:
    """A turn of a category's task with a source and its code measured: correct when it has a
    speedup."""
    task_id = "PTX-H100-Softmax" if category == "softmax" else "PTX-H100-GEMM"
    return replace(
        turn(task_id, 0, 0, number, speedup=speedup),
        source=f"// turn {number}\n",
        category=category,
        instructions_required=category != "softmax",
        quality={"lines": 10 * number, "cyclomatic_max": number, "maintainability": 50.0},
    )


def test_reports_count_transitions_and_quality_by_category(tmp_path: Path) -> None:
    records = [
        _record(1, None, "softmax"),
        _record(2, 1.0, "softmax"),
        _record(3, 2.0, "softmax"),
        _record(4, None, "softmax"),
        replace(_record(1, 1.0, "gemm"), qualified=True),
    ]
    path = write(tmp_path / "run.jsonl", records)
    rows = {row.category: row for row in category_rows(load([path]), (1.0,))}
    assert list(rows) == ["gemm", "softmax"]  # the documented order of categories
    softmax = rows["softmax"]
    assert softmax.transitions == {
        "fixed": 1,
        "regressed": 1,
        "faster": 1,
        "slower": 0,
        "total": 3,
    }
    assert (softmax.quality.turns, softmax.quality.lines) == (4, 25.0)
    assert softmax.performance_tasks == 1 and softmax.metrics["correct"].mean == 0.5
    # A performance category has no target-instruction metrics; gemm has them.
    assert softmax.metrics["correct_inst"].mean is None
    assert rows["gemm"].metrics["correct_inst"].mean == 1.0


def test_the_report_shows_the_category_tables_in_every_format(tmp_path: Path) -> None:
    records = [_record(1, None, "softmax"), _record(2, 1.5, "softmax")]
    path = write(tmp_path / "run.jsonl", records)
    markdown = report([path])
    assert "### By category" in markdown
    assert "| softmax | 1 | 1 | 2 | 0.50 | – | 1.50 | 0.50 | – |" in markdown
    assert "| softmax | 1 | 1 | 0 | 0 | 0 | 2 | 15.0 | 1.5 | 50.0 |" in markdown
    rows = json.loads(report([path], fmt="json"))["categories"]
    assert rows[0]["category"] == "softmax" and rows[0]["transitions_fixed"] == 1
    assert report([path], fmt="csv", csv_table="categories").startswith(
        "run,knowledge,language,category"
    )
