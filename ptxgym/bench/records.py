"""The trajectory record: one JSON line per turn, append-only.

Written by the ``TrajectoryRecorder`` wrapper (and so by ``ptxgym run``), read by the resume logic
of ``ptxgym run`` and by ``ptxgym report``. A line holds everything needed to recompute the metrics
and to build training data without re-running anything.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ptxgym.bench.metrics import Turn

SCHEMA_VERSION = 1


@dataclass(frozen=True)
class TurnRecord:
    """One turn of one trajectory."""

    run: str
    task_id: str
    prompt_variant: int
    knowledge: str
    trajectory: int
    turn: int  # 1-based
    agent: str
    status: str
    correct: bool
    qualified: bool | None  # None: not profiled, or the profile failed
    speedup: float | None
    latency_ms: float | None
    baseline_latency_ms: float | None
    reward: float
    reward_components: dict[str, float]
    source: str | None
    feedback: str
    message: str
    step_seconds: float
    evaluator: str
    versions: dict[str, str] = field(default_factory=dict)
    timestamp: str = ""
    outcome: dict[str, Any] = field(default_factory=dict)
    # How the agent's model produced the action, when a model did (ptxgym.agents): the reply in
    # full, the model, prompt and completion tokens, seconds, finish reason, attempts.
    generation: dict[str, Any] = field(default_factory=dict)
    schema: int = SCHEMA_VERSION

    @property
    def key(self) -> tuple[str, int, str, int, int]:
        """Identifies the turn within a run: (task, variant, knowledge, trajectory, turn)."""
        return (self.task_id, self.prompt_variant, self.knowledge, self.trajectory, self.turn)

    def as_turn(self) -> Turn:
        return Turn(self.correct, self.qualified, self.speedup)

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, line: str) -> TurnRecord:
        data = json.loads(line)
        if data.get("schema") != SCHEMA_VERSION:
            raise ValueError(f"trajectory record schema {data.get('schema')!r} is not supported")
        return cls(**data)


def read_records(path: Path) -> Iterator[TurnRecord]:
    """Every complete record in a JSONL file; a torn last line (a crash mid-write) is skipped."""
    with path.open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            if not line.strip():
                continue
            try:
                yield TurnRecord.from_json(line)
            except json.JSONDecodeError:
                if handle.read().strip():  # only the final line may be torn
                    raise ValueError(f"{path}:{number}: not a JSON record") from None
                return
