"""Reward functions: an :class:`Outcome` in, a total with its named components out.

Selectable by name (``REWARDS``) or replaced by any callable ``Outcome -> float | Reward``.
See docs/reward.md for the reasons behind the default ladder.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from ptxgym.outcome import Outcome


@dataclass(frozen=True)
class Reward:
    total: float
    components: dict[str, float] = field(default_factory=dict)


RewardFunction = Callable[[Outcome], "float | Reward"]

# The ladder's rungs; they sum to 1.0 for a correct, qualified kernel at 2x the baseline or more.
COMPILED = 0.1
RAN = 0.1
CORRECT = 0.3
QUALIFIED = 0.3
SPEED = 0.2


def speed_score(speedup: float) -> float:
    """0 at half the baseline's speed or slower, 0.5 at parity, 1 at twice as fast or faster.

    Logarithmic, because speedups multiply; bounded, so a timing outlier cannot dominate.
    """
    return min(1.0, max(0.0, (math.log2(speedup) + 1.0) / 2.0)) if speedup > 0 else 0.0


def qualifies(outcome: Outcome) -> bool:
    """Correct, and executed the target instructions where the task requires them: a
    performance task requires none, so every correct kernel of one qualifies (docs/reward.md)."""
    return outcome.status.correct and (
        outcome.qualified is True or not outcome.instructions_required
    )


def ladder(outcome: Outcome) -> Reward:
    """compiled < ran < correct < correct with the target instructions, plus a speed term."""
    status = outcome.status
    qualified = qualifies(outcome)
    components = {
        "compiled": COMPILED if status.compiled else 0.0,
        "ran": RAN if status.ran else 0.0,
        "correct": CORRECT if status.correct else 0.0,
        "qualified": QUALIFIED if qualified else 0.0,
        "speed": SPEED * speed_score(outcome.speedup)
        if status.correct and outcome.speedup is not None
        else 0.0,
    }
    return Reward(round(sum(components.values()), 6), components)


def binary(outcome: Outcome) -> Reward:
    """1 for a correct kernel that executed the target instructions (where the task requires
    them), else 0."""
    success = qualifies(outcome)
    return Reward(1.0 if success else 0.0, {"success": 1.0 if success else 0.0})


REWARDS: dict[str, Callable[[Outcome], Reward]] = {"ladder": ladder, "binary": binary}


def resolve_reward(spec: str | RewardFunction) -> Callable[[Outcome], Reward]:
    """A reward function from a name in ``REWARDS`` or a user callable."""
    if isinstance(spec, str):
        if spec not in REWARDS:
            raise ValueError(f"unknown reward {spec!r}; choose one of {sorted(REWARDS)}")
        return REWARDS[spec]
    if not callable(spec):
        raise TypeError(f"reward must be a name or a callable, not {type(spec).__name__}")
    user = spec

    def wrapped(outcome: Outcome) -> Reward:
        value = user(outcome)
        if isinstance(value, Reward):
            return value
        return Reward(float(value), {"total": float(value)})

    return wrapped
