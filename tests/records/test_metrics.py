"""The metrics against hand-computed values, including unknown profiles and empty runs."""

from __future__ import annotations

import pytest

from ptxgym.records.metrics import (
    Turn,
    best_speedup,
    fast_p,
    fast_p_curve,
    summarize,
    turn_correctness,
)

WRONG = Turn(False, None, None)
PLAIN = Turn(True, False, 1.5)  # correct, target instructions not executed
UNKNOWN = Turn(True, None, 3.0)  # correct, profile failed: never counts as qualified
QUALIFIED_SLOW = Turn(True, True, 0.5)
QUALIFIED_FAST = Turn(True, True, 2.0)

# Two trajectories of 4 turns each.
A = [WRONG, PLAIN, QUALIFIED_SLOW, QUALIFIED_FAST]
B = [UNKNOWN, WRONG, WRONG, QUALIFIED_SLOW]


def test_turn_correctness() -> None:
    assert turn_correctness([A, B]) == pytest.approx(5 / 8)
    assert turn_correctness([A, B], inst=True) == pytest.approx(3 / 8)
    assert turn_correctness([A, B], k=1) == pytest.approx(1 / 2)  # WRONG, UNKNOWN
    assert turn_correctness([A, B], k=1, inst=True) == 0.0


def test_best_speedup() -> None:
    assert best_speedup([A, B]) == 3.0  # UNKNOWN counts without the instruction requirement
    assert best_speedup([A, B], inst=True) == 2.0
    assert best_speedup([A, B], k=2) == 3.0
    assert best_speedup([A, B], k=2, inst=True) is None
    assert best_speedup([A, B], k=3, inst=True) == 0.5


def test_fast_p() -> None:
    assert fast_p([A, B], 1.0) == pytest.approx(3 / 8)  # PLAIN 1.5, QUALIFIED_FAST 2, UNKNOWN 3
    assert fast_p([A, B], 1.0, inst=True) == pytest.approx(1 / 8)
    assert fast_p([A, B], 0.0) == pytest.approx(5 / 8)  # Fast_0 is the correctness rate
    assert fast_p([A, B], 0.0, inst=True) == pytest.approx(3 / 8)
    assert fast_p([A, B], 2.0) == pytest.approx(1 / 8)  # strictly faster: 2.0 does not count
    assert fast_p([A, B], 1.0, k=1) == pytest.approx(1 / 2)


def test_fast_p_curve_is_non_increasing() -> None:
    thresholds = [0.0, 0.5, 1.0, 2.0, 4.0]
    inst = fast_p_curve([A, B], thresholds)
    assert inst == pytest.approx([3 / 8, 1 / 8, 1 / 8, 0.0, 0.0])
    plain = fast_p_curve([A, B], thresholds, inst=False)
    assert plain == pytest.approx([5 / 8, 3 / 8, 3 / 8, 1 / 8, 0.0])
    assert plain == sorted(plain, reverse=True)


def test_unknown_profiles_never_count_as_qualified() -> None:
    only_unknown = [[UNKNOWN, UNKNOWN]]
    assert turn_correctness(only_unknown, inst=True) == 0.0
    assert best_speedup(only_unknown, inst=True) is None
    assert fast_p(only_unknown, 1.0, inst=True) == 0.0


def test_empty_runs_have_no_rates() -> None:
    assert turn_correctness([]) is None
    assert turn_correctness([[]]) is None
    assert best_speedup([]) is None
    assert fast_p([], 1.0) is None
    summary = summarize([])
    assert summary.trajectories == 0 and summary.turns == 0
    assert summary.turn_correctness[1] == (None, None)


def test_summary_pairs_target_instruction_first() -> None:
    summary = summarize([A, B], ps=(1.0,))
    assert summary.trajectories == 2 and summary.turns == 8
    assert summary.turn_correctness[4] == pytest.approx((3 / 8, 5 / 8))
    assert summary.turn_correctness[1] == pytest.approx((0.0, 1 / 2))
    assert summary.best_speedup[4] == (2.0, 3.0)
    assert summary.best_speedup[8] == (2.0, 3.0)  # limits past the length use every turn
    assert summary.fast[1.0][4] == pytest.approx((1 / 8, 3 / 8))


def test_performance_turns_have_only_unrestricted_metrics() -> None:
    fast = Turn(True, None, 3.0, instructions_required=False)
    slow = Turn(True, None, 0.5, instructions_required=False)
    performance = [[fast, WRONG_PERFORMANCE, slow]]
    assert turn_correctness(performance) == pytest.approx(2 / 3)
    assert fast_p(performance, 1.0) == pytest.approx(1 / 3)
    assert best_speedup(performance) == 3.0
    # No target-instruction metric: a set of performance tasks has none, not zeros.
    assert turn_correctness(performance, inst=True) is None
    assert fast_p(performance, 1.0, inst=True) is None
    assert best_speedup(performance, inst=True) is None
    # Pooled with an instruction task, the target-instruction values are over its turns only.
    mixed = [*performance, A]
    assert turn_correctness(mixed, inst=True) == turn_correctness([A], inst=True)
    assert turn_correctness(mixed) == pytest.approx(5 / 7)


WRONG_PERFORMANCE = Turn(False, None, None, instructions_required=False)
