"""Triton against CUDA: one agent's records of one task, side by side per action language.

``language_rows(records)`` finds every agent, knowledge level and task recorded in more than one
action language (``TurnRecord.language``) and gives one row per language, each pooling that
language's trajectories over prompt variants and runs. A task played in one language only is
left out, so the rows of a task always compare the same work by the same agent.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any

from ptxgym.languages import DEFAULT_LANGUAGE
from ptxgym.records.metrics import Trajectory, best_speedup, turn_correctness
from ptxgym.records.turns import TurnRecord, best_mfu

# (agent, knowledge, task) → language → (run, prompt variant, trajectory index) → turn → record
_Recorded = dict[tuple[str, str, str], dict[str, dict[tuple[str, int, int], dict[int, TurnRecord]]]]


@dataclass(frozen=True)
class LanguageRow:
    """One agent at one knowledge level on one task in one language, over every turn of that
    language's trajectories (prompt variants and runs pooled)."""

    agent: str
    knowledge: str
    task_id: str
    language: str
    trajectories: int
    turns: int
    correct: float | None  # fraction of the turns that are correct
    correct_inst: float | None  # ... and executed the target instructions; None: performance task
    best_speedup: float | None  # None: no correct turn
    best_speedup_inst: float | None  # ... of a correct turn that executed the target instructions
    # The largest MFU of a correct turn that executed the target instructions; None when no such
    # turn had its speed of light measured (compile-only, or a GPU without known peaks).
    best_mfu_inst: float | None
    reached_gpu: bool  # whether any of its turns ran on a GPU (else its zeros are not results)

    def flat(self) -> dict[str, Any]:
        """The row as one flat mapping (CSV and JSON share it)."""
        return asdict(self)


def language_rows(records: Iterable[TurnRecord]) -> list[LanguageRow]:
    """One row per language for every (agent, knowledge level, task) recorded in more than one
    language; groups in order of first appearance, CUDA first within a group, then the others
    by name. The records must hold each turn once (``ptxgym.bench.runs.load`` checks that)."""
    recorded: _Recorded = defaultdict(lambda: defaultdict(lambda: defaultdict(dict)))
    for record in records:
        trajectory = (record.run, record.prompt_variant, record.trajectory)
        group = recorded[(record.agent, record.knowledge, record.task_id)]
        group[record.language][trajectory][record.turn] = record
    return [
        _row(agent, knowledge, task_id, language, by_language[language])
        for (agent, knowledge, task_id), by_language in recorded.items()
        if len(by_language) > 1
        for language in sorted(by_language, key=lambda name: (name != DEFAULT_LANGUAGE, name))
    ]


def _row(
    agent: str,
    knowledge: str,
    task_id: str,
    language: str,
    trajectories: dict[tuple[str, int, int], dict[int, TurnRecord]],
) -> LanguageRow:
    ordered = [[turns[number] for number in sorted(turns)] for turns in trajectories.values()]
    played: list[Trajectory] = [[record.as_turn() for record in turns] for turns in ordered]
    records = [record for turns in ordered for record in turns]
    return LanguageRow(
        agent=agent,
        knowledge=knowledge,
        task_id=task_id,
        language=language,
        trajectories=len(ordered),
        turns=len(records),
        correct=turn_correctness(played),
        correct_inst=turn_correctness(played, inst=True),
        best_speedup=best_speedup(played),
        best_speedup_inst=best_speedup(played, inst=True),
        best_mfu_inst=best_mfu(records, inst=True),
        reached_gpu=any(record.reached_gpu for record in records),
    )
