"""What changed between consecutive turns of a trajectory: transition events, with the diff.

Events (a transition may have none, or ``faster``/``slower`` beside nothing else):

- ``fixed``: the earlier turn was not correct, the later one is;
- ``regressed``: the earlier turn was correct, the later one is not;
- ``faster`` / ``slower``: both correct, and the speedup over the baseline moved by more than
  ``NOISE`` (a relative change within it is the timing's run-to-run spread, not an event).

The diff is the unified diff of the two submitted sources. The trajectory recorder writes each
turn's transition from the turn before it into the turn's record; reports recompute them from
the records, so trajectories resumed across processes and records of older versions count too.
Training data of the error → repair → pass kind is the ``fixed`` transitions with their diffs.
"""

from __future__ import annotations

import difflib
import itertools
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal

Event = Literal["fixed", "regressed", "faster", "slower"]
EVENTS: tuple[Event, ...] = ("fixed", "regressed", "faster", "slower")
# The relative change of speedup that counts as faster or slower: the timing of one kernel
# repeats within a few percent on an otherwise idle GPU (docs/benchmarks.md).
NOISE = 0.05


@dataclass(frozen=True)
class Turn:
    """The facts of one turn a transition compares."""

    turn: int
    status: str
    correct: bool
    speedup: float | None
    source: str | None


@dataclass(frozen=True)
class Transition:
    """From turn ``before`` to turn ``after`` of one trajectory."""

    before: int
    after: int
    events: tuple[Event, ...]
    status_before: str
    status_after: str
    speedup_before: float | None
    speedup_after: float | None
    added: int  # lines added by the diff
    removed: int  # lines removed by the diff
    diff: str

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["events"] = list(self.events)
        return data


def events(before: Turn, after: Turn) -> tuple[Event, ...]:
    """The events between two turns (see the module's documentation)."""
    if not before.correct and after.correct:
        return ("fixed",)
    if before.correct and not after.correct:
        return ("regressed",)
    if before.correct and after.correct and before.speedup and after.speedup:
        ratio = after.speedup / before.speedup
        if ratio > 1 + NOISE:
            return ("faster",)
        if ratio < 1 / (1 + NOISE):
            return ("slower",)
    return ()


def transition(before: Turn, after: Turn) -> Transition:
    """The transition from ``before`` to ``after``, with the unified diff of their sources."""
    lines = list(
        difflib.unified_diff(
            (before.source or "").splitlines(keepends=True),
            (after.source or "").splitlines(keepends=True),
            fromfile=f"turn {before.turn}",
            tofile=f"turn {after.turn}",
        )
    )
    changed = [line for line in lines if not line.startswith(("+++", "---"))]
    return Transition(
        before=before.turn,
        after=after.turn,
        events=events(before, after),
        status_before=before.status,
        status_after=after.status,
        speedup_before=before.speedup,
        speedup_after=after.speedup,
        added=sum(line.startswith("+") for line in changed),
        removed=sum(line.startswith("-") for line in changed),
        diff="".join(line if line.endswith("\n") else line + "\n" for line in lines),
    )


def trajectory_transitions(turns: Sequence[Turn]) -> list[Transition]:
    """Each consecutive pair of a trajectory's turns (in turn order), as a transition."""
    ordered = sorted(turns, key=lambda turn: turn.turn)
    return [transition(a, b) for a, b in itertools.pairwise(ordered)]
