"""A run's tasks grouped by category (docs/tasks.md): one row per category, its metrics pooled
over the category's tasks, the transitions between consecutive turns counted, and the means of
the code-quality metrics of the submitted sources.

``category_rows(runs, ps)`` gives the rows in the documented order of categories (then any a
record names that the registry does not); ``ptxgym.bench.report`` writes them as tables. The
target-instruction metrics (``_inst``) pool only the tasks that require the instructions.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ptxgym.bench.runs import RecordedRun, Spread
from ptxgym.records.metrics import Summary, summarize
from ptxgym.records.transitions import EVENTS, trajectory_transitions
from ptxgym.records.turns import TurnRecord
from ptxgym.tasks import CATEGORIES, get_task

# The category of a record that names none (schema 1) and whose task is not registered here.
UNCATEGORIZED = "uncategorized"


def category_of(task_id: str, records: Sequence[TurnRecord]) -> str:
    """A task's category: as its records name it, else as the registry does."""
    named = next((record.category for record in records if record.category), "")
    if named:
        return named
    try:
        return get_task(task_id).category
    except KeyError:
        return UNCATEGORIZED


@dataclass(frozen=True)
class Quality:
    """The means of the code-quality metrics over the turns whose records have them."""

    turns: int
    lines: float | None
    cyclomatic_max: float | None
    maintainability: float | None

    @classmethod
    def of(cls, records: Sequence[TurnRecord]) -> Quality:
        measured = [record.quality for record in records if record.quality]

        def mean(key: str) -> float | None:
            values = [float(q[key]) for q in measured if isinstance(q.get(key), int | float)]
            return sum(values) / len(values) if values else None

        return cls(len(measured), mean("lines"), mean("cyclomatic_max"), mean("maintainability"))


@dataclass(frozen=True)
class CategoryRow:
    """One category of one run: its tasks' metrics pooled per prompt variant (then across
    variants, as the per-model table does), its transitions counted and its code measured.
    ``metrics`` holds, by key, the spread of each metric at the run's longest turn limit; the
    ``_inst`` ones are over the tasks that require the target instructions (``–`` where none
    does)."""

    run: str
    knowledge: str
    language: str
    category: str
    tasks: int
    performance_tasks: int
    turns: int
    metrics: dict[str, Spread]
    transitions: dict[str, int]  # event → count, and "total": consecutive pairs of turns
    quality: Quality

    def flat(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "run": self.run,
            "knowledge": self.knowledge,
            "language": self.language,
            "category": self.category,
            "tasks": self.tasks,
            "performance_tasks": self.performance_tasks,
            "turns": self.turns,
        }
        for key, spread in self.metrics.items():
            data |= spread.columns(key)
        data |= {f"transitions_{key}": count for key, count in self.transitions.items()}
        return data | {
            "quality_turns": self.quality.turns,
            "lines_mean": self.quality.lines,
            "cyclomatic_max_mean": self.quality.cyclomatic_max,
            "maintainability_mean": self.quality.maintainability,
        }


def _category_metrics(summary: Summary, k: int, ps: Sequence[float]) -> dict[str, float | None]:
    correct_inst, correct = summary.turn_correctness[k]
    best_inst, best = summary.best_speedup[k]
    values = {
        "correct": correct,
        "correct_inst": correct_inst,
        "best_speedup": best,
        "best_speedup_inst": best_inst,
    }
    for p in ps:
        values[f"fast_p{p:g}_inst"], values[f"fast_p{p:g}"] = summary.fast[p][k]
    return values


def category_rows(runs: Sequence[RecordedRun], ps: Sequence[float]) -> list[CategoryRow]:
    """Per run, one row per category of its tasks, in the documented order of categories."""
    table = []
    for run in runs:
        k = run.longest
        members: dict[str, list[str]] = defaultdict(list)
        for task_id, by_variant in run.tasks.items():
            records = [r for v in by_variant.values() for t in v.values() for r in t.values()]
            members[category_of(task_id, records)].append(task_id)
        order = [*CATEGORIES, *sorted(set(members) - set(CATEGORIES))]
        for category in [name for name in order if name in members]:
            task_ids = members[category]
            variants = sorted({v for task_id in task_ids for v in run.tasks[task_id]})
            values = [
                _category_metrics(
                    summarize(
                        [
                            trajectory
                            for task_id in task_ids
                            if variant in run.tasks[task_id]
                            for trajectory in run.trajectories(task_id, variant)
                        ],
                        limits=[k],
                        ps=ps,
                    ),
                    k,
                    ps,
                )
                for variant in variants
            ]
            records = [
                record
                for task_id in task_ids
                for trajectories in run.tasks[task_id].values()
                for turns in trajectories.values()
                for record in turns.values()
            ]
            table.append(
                CategoryRow(
                    run=run.name,
                    knowledge=run.knowledge,
                    language=run.language,
                    category=category,
                    tasks=len(task_ids),
                    performance_tasks=sum(
                        not any(r.instructions_required for r in records if r.task_id == task_id)
                        for task_id in task_ids
                    ),
                    turns=len(records),
                    metrics={key: Spread.of([v[key] for v in values]) for key in values[0]},
                    transitions=_transition_counts(run, task_ids),
                    quality=Quality.of(records),
                )
            )
    return table


def _transition_counts(run: RecordedRun, task_ids: Sequence[str]) -> dict[str, int]:
    """The events between consecutive turns of every trajectory of these tasks, counted."""
    counts = dict.fromkeys(EVENTS, 0) | {"total": 0}
    for task_id in task_ids:
        for trajectories in run.tasks[task_id].values():
            for turns in trajectories.values():
                steps = trajectory_transitions([r.as_transition_turn() for r in turns.values()])
                counts["total"] += len(steps)
                for step in steps:
                    for event in step.events:
                        counts[event] += 1
    return counts
