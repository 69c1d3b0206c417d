"""The benchmark's metrics over multi-turn trajectories.

Each turn has three facts: correct (C), executed the target instructions at run time (I; an
unknown profile counts as not qualified), and speedup over the library baseline (s, for correct
turns). Over a set of trajectories, restricted to each trajectory's first ``k`` turns:

- turn correctness rate: the fraction of turns that are correct;
- target-instruction turn correctness rate: the fraction that are correct and qualified;
- best speedup: the largest speedup of any correct turn (``None`` when there is none);
- target-instruction best speedup: the same over correct, qualified turns;
- Fast_p: the fraction of turns that are correct with speedup > p; Fast_p^Inst also requires
  qualification.

A performance task (``instructions_required`` False: no target instruction family) has only the
unrestricted metrics: the target-instruction variants are over the turns of instruction tasks
alone, and ``None`` for a set of performance tasks.

Every metric is a fraction of turns (or a maximum over turns), so trajectories of different
lengths and many tasks can be pooled. With no turns at all, rates are ``None``, not 0.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

TURN_LIMITS = (1, 4, 8)


@dataclass(frozen=True)
class Turn:
    """The facts of one turn the metrics need."""

    correct: bool
    qualified: bool | None
    speedup: float | None
    # False for a turn of a performance task: the target-instruction variants leave it out.
    instructions_required: bool = True

    def counts(self, *, inst: bool) -> bool:
        """Correct, and (for the target-instruction variants) qualified for certain."""
        return self.correct and (not inst or self.qualified is True)


Trajectory = Sequence[Turn]


def _turns(trajectories: Iterable[Trajectory], k: int | None, inst: bool = False) -> list[Turn]:
    """The first ``k`` turns of every trajectory; for a target-instruction metric only those of
    tasks that require the instructions (a performance task has no such metric)."""
    return [
        turn
        for trajectory in trajectories
        for turn in trajectory[:k]
        if not inst or turn.instructions_required
    ]


def turn_correctness(
    trajectories: Iterable[Trajectory], *, k: int | None = None, inst: bool = False
) -> float | None:
    """Fraction of the first-``k`` turns that are correct (and qualified, with ``inst``)."""
    turns = _turns(trajectories, k, inst)
    if not turns:
        return None
    return sum(turn.counts(inst=inst) for turn in turns) / len(turns)


def best_speedup(
    trajectories: Iterable[Trajectory], *, k: int | None = None, inst: bool = False
) -> float | None:
    """Largest speedup among the first-``k`` turns that count; ``None`` if none does."""
    speedups = [
        turn.speedup
        for turn in _turns(trajectories, k, inst)
        if turn.counts(inst=inst) and turn.speedup is not None
    ]
    return max(speedups) if speedups else None


def fast_p(
    trajectories: Iterable[Trajectory], p: float, *, k: int | None = None, inst: bool = False
) -> float | None:
    """Fraction of the first-``k`` turns that count and are faster than ``p`` × the baseline."""
    turns = _turns(trajectories, k, inst)
    if not turns:
        return None
    fast = sum(
        turn.counts(inst=inst) and turn.speedup is not None and turn.speedup > p for turn in turns
    )
    return fast / len(turns)


def fast_p_curve(
    trajectories: Iterable[Trajectory],
    thresholds: Sequence[float],
    *,
    k: int | None = None,
    inst: bool = True,
) -> list[float | None]:
    """Fast_p (or Fast_p^Inst) at each threshold: the curve the report plots."""
    pooled = [list(trajectory) for trajectory in trajectories]
    return [fast_p(pooled, p, k=k, inst=inst) for p in thresholds]


@dataclass(frozen=True)
class Summary:
    """Every metric at every turn limit, for one group of trajectories (e.g. a task × variant).

    Each field maps a turn limit to ``(target-instruction value, unrestricted value)``.
    """

    trajectories: int
    turns: int
    turn_correctness: dict[int, tuple[float | None, float | None]]
    best_speedup: dict[int, tuple[float | None, float | None]]
    fast: dict[float, dict[int, tuple[float | None, float | None]]]


def summarize(
    trajectories: Iterable[Trajectory],
    *,
    limits: Sequence[int] = TURN_LIMITS,
    ps: Sequence[float] = (1.0,),
) -> Summary:
    """All metrics, target-instruction first and unrestricted second, at each turn limit."""
    pooled = [list(trajectory) for trajectory in trajectories]

    def both(metric: str, k: int, p: float = 0.0) -> tuple[float | None, float | None]:
        if metric == "correct":
            return (
                turn_correctness(pooled, k=k, inst=True),
                turn_correctness(pooled, k=k, inst=False),
            )
        if metric == "best":
            return best_speedup(pooled, k=k, inst=True), best_speedup(pooled, k=k, inst=False)
        return fast_p(pooled, p, k=k, inst=True), fast_p(pooled, p, k=k, inst=False)

    return Summary(
        trajectories=len(pooled),
        turns=sum(len(trajectory) for trajectory in pooled),
        turn_correctness={k: both("correct", k) for k in limits},
        best_speedup={k: both("best", k) for k in limits},
        fast={p: {k: both("fast", k, p) for k in limits} for p in ps},
    )
