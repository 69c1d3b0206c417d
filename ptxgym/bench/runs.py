"""Trajectory records grouped for reports: by run (name, knowledge level, action language) and by
model (agent, knowledge level, action language), as trajectories by task and prompt variant; and
how one metric spreads across prompt variants."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ptxgym.languages import DEFAULT_LANGUAGE
from ptxgym.records.metrics import Trajectory
from ptxgym.records.turns import TurnRecord, read_records

# What a report and its plot say where no turn of the records ran on a GPU.
NOTHING_RAN = "No turn ran on a GPU"


def label_of(name: str, knowledge: str, language: str) -> str:
    """``name (knowledge)``; ``name (knowledge, triton)`` for a language other than CUDA."""
    qualifiers = [knowledge] + ([] if language == DEFAULT_LANGUAGE else [language])
    return f"{name} ({', '.join(qualifiers)})"


@dataclass
class RecordedRun:
    """The records of one run configuration, as trajectories by task and prompt variant."""

    name: str
    knowledge: str
    language: str
    agents: set[str] = field(default_factory=set)
    # task → variant → trajectory index → turn → record
    tasks: dict[str, dict[int, dict[int, dict[int, TurnRecord]]]] = field(
        default_factory=lambda: defaultdict(lambda: defaultdict(lambda: defaultdict(dict)))
    )

    @property
    def label(self) -> str:
        return label_of(self.name, self.knowledge, self.language)

    @property
    def longest(self) -> int:
        return max(
            max(turns)
            for variants in self.tasks.values()
            for trajectories in variants.values()
            for turns in trajectories.values()
        )

    def records(self) -> list[TurnRecord]:
        return [
            record
            for variants in self.tasks.values()
            for trajectories in variants.values()
            for turns in trajectories.values()
            for record in turns.values()
        ]

    @property
    def reached_gpu(self) -> bool:
        """Whether any turn was run on a GPU (built turns of a compile-only run were not)."""
        return any(record.reached_gpu for record in self.records())

    @property
    def measured_mfu(self) -> bool:
        """Whether any turn's speed of light was measured (timed on a GPU with known peaks)."""
        return any(record.mfu is not None for record in self.records())

    def turn_records(self, task_id: str, variant: int) -> list[list[TurnRecord]]:
        """Each trajectory of one variant of a task, its records in turn order."""
        return [
            [turns[number] for number in sorted(turns)]
            for _, turns in sorted(self.tasks[task_id][variant].items())
        ]

    def trajectories(self, task_id: str, variant: int | None = None) -> list[Trajectory]:
        """Each trajectory's turns in order, for one variant or pooled over all of them."""
        chosen = list(self.tasks[task_id]) if variant is None else [variant]
        return [
            [record.as_turn() for record in records]
            for v in chosen
            for records in self.turn_records(task_id, v)
        ]


@dataclass(frozen=True)
class Spread:
    """One metric across prompt variants: mean, min and max over the ``n`` variants where it is
    defined (best speedup is undefined for a variant without a counting turn)."""

    mean: float | None
    low: float | None
    high: float | None
    n: int

    @classmethod
    def of(cls, values: Sequence[float | None]) -> Spread:
        defined = [value for value in values if value is not None]
        if not defined:
            return cls(None, None, None, 0)
        return cls(sum(defined) / len(defined), min(defined), max(defined), len(defined))

    def columns(self, key: str) -> dict[str, float | None]:
        """The flat columns of metric ``key``: its mean, min and max across variants."""
        return {f"{key}_mean": self.mean, f"{key}_min": self.low, f"{key}_max": self.high}


@dataclass
class RecordedModel:
    """The records of one agent at one knowledge level in one action language over every run
    and task, as trajectories by prompt variant."""

    agent: str
    knowledge: str
    language: str
    # variant → (run, task, trajectory index) → turn → record
    variants: dict[int, dict[tuple[str, str, int], dict[int, TurnRecord]]] = field(
        default_factory=lambda: defaultdict(lambda: defaultdict(dict))
    )

    @property
    def label(self) -> str:
        return label_of(self.agent, self.knowledge, self.language)

    def records(self) -> list[TurnRecord]:
        return [
            record
            for trajectories in self.variants.values()
            for turns in trajectories.values()
            for record in turns.values()
        ]

    @property
    def longest(self) -> int:
        return max(
            max(turns) for trajectories in self.variants.values() for turns in trajectories.values()
        )

    def trajectories(self, variant: int) -> list[Trajectory]:
        """Each trajectory of one variant, over every task and run, its turns in order."""
        return [
            [turns[number].as_turn() for number in sorted(turns)]
            for _, turns in sorted(self.variants[variant].items())
        ]


def by_model(runs: Sequence[RecordedRun]) -> list[RecordedModel]:
    """The runs' records regrouped by agent, knowledge level and action language, in order of
    first appearance."""
    models: dict[tuple[str, str, str], RecordedModel] = {}
    for run in runs:
        for task_id, variants in run.tasks.items():
            for variant, trajectories in variants.items():
                for index, turns in trajectories.items():
                    for number, record in turns.items():
                        model = models.setdefault(
                            (record.agent, run.knowledge, run.language),
                            RecordedModel(record.agent, run.knowledge, run.language),
                        )
                        model.variants[variant][(run.name, task_id, index)][number] = record
    return list(models.values())


def load(paths: Sequence[Path]) -> list[RecordedRun]:
    """Every record in ``paths``, grouped by run (name, knowledge level and action language); a
    turn recorded twice is an error.

    The language is part of a turn's identity: a run's name defaults to its file's stem, so a
    CUDA run and a Triton run written to files of one name in two folders share their names and
    keys, yet are different turns.
    """
    runs: dict[tuple[str, str, str], RecordedRun] = {}
    seen: dict[tuple[str, str, tuple[str, int, str, int, int]], Path] = {}
    for path in map(Path, paths):
        if not path.is_file():
            raise FileNotFoundError(f"{path}: no such file")
        for record in read_records(path):
            identity = (record.run, record.language, record.key)
            if (first := seen.get(identity)) is not None:
                raise ValueError(
                    f"{path}: turn {record.turn} of {record.task_id} variant "
                    f"{record.prompt_variant} trajectory {record.trajectory} in run "
                    f"{record.run!r} ({record.language}) is recorded twice (also in {first})"
                )
            seen[identity] = path
            run = runs.setdefault(
                (record.run, record.knowledge, record.language),
                RecordedRun(record.run, record.knowledge, record.language),
            )
            run.agents.add(record.agent)
            trajectory = run.tasks[record.task_id][record.prompt_variant][record.trajectory]
            trajectory[record.turn] = record
    if not runs:
        raise ValueError(f"no trajectory records in {', '.join(str(p) for p in paths)}")
    return list(runs.values())
