"""The default reward ladder (``ptxgym.reward``): every rung's value, as docs/reward.md states
it."""

from __future__ import annotations

import pytest

from ptxgym.outcome import Outcome, Status
from ptxgym.reward import binary, ladder


def outcome(
    status: Status, *, speedup: float | None = None, qualified: bool | None = None
) -> Outcome:
    return Outcome("PTX-H100-GEMM", status, "", "gpu", speedup=speedup, qualified=qualified)


@pytest.mark.parametrize(
    ("status", "total"),
    [
        (Status.FORMAT_ERROR, 0.0),
        (Status.POLICY_VIOLATION, 0.0),
        (Status.COMPILE_ERROR, 0.0),
        (Status.COMPILED, 0.1),  # built, not run (compile-only)
        (Status.RUNTIME_ERROR, 0.1),
        (Status.TIMEOUT, 0.1),
        (Status.MEMORY_ERROR, 0.1),
        (Status.INCORRECT_SHAPE, 0.2),
        (Status.INCORRECT_DTYPE, 0.2),
        (Status.INCORRECT_NUMERICAL, 0.2),
    ],
)
def test_the_rungs_below_correct(status: Status, total: float) -> None:
    # Speed and qualification earn nothing for an incorrect kernel.
    assert ladder(outcome(status, speedup=4.0, qualified=True)).total == total


@pytest.mark.parametrize(
    ("speedup", "unqualified", "qualified"),
    [
        (None, 0.5, 0.8),  # not timed
        (0.25, 0.5, 0.8),  # half the baseline's speed or slower: no speed term
        (0.5, 0.5, 0.8),
        (1.0, 0.6, 0.9),  # parity: half the speed term
        (2.0, 0.7, 1.0),  # twice as fast: all of it
        (8.0, 0.7, 1.0),  # bounded
    ],
)
def test_a_correct_kernel_earns_the_speed_term_qualified_or_not(
    speedup: float | None, unqualified: float, qualified: float
) -> None:
    for unknown_or_not in (None, False):  # a failed profile counts as not qualified
        plain = ladder(outcome(Status.PASSED, speedup=speedup, qualified=unknown_or_not))
        assert plain.total == unqualified and plain.components["qualified"] == 0.0
    assert ladder(outcome(Status.PASSED, speedup=speedup, qualified=True)).total == qualified


def test_any_qualified_kernel_outranks_any_unqualified_one() -> None:
    fastest_plain = ladder(outcome(Status.PASSED, speedup=1000.0, qualified=False)).total
    slowest_qualified = ladder(outcome(Status.PASSED, speedup=0.001, qualified=True)).total
    assert fastest_plain < slowest_qualified


def test_binary_is_one_only_for_a_correct_qualified_kernel() -> None:
    assert binary(outcome(Status.PASSED, qualified=True)).total == 1.0
    assert binary(outcome(Status.PASSED, qualified=None)).total == 0.0
    assert binary(outcome(Status.INCORRECT_NUMERICAL, qualified=True)).total == 0.0


def test_a_performance_task_pays_the_qualified_rung_to_every_correct_kernel() -> None:
    correct = Outcome(
        "PTX-H100-GELU", Status.PASSED, "", "gpu", speedup=2.0, instructions_required=False
    )
    assert correct.qualified is None
    assert ladder(correct).components["qualified"] == pytest.approx(0.3)
    assert ladder(correct).total == pytest.approx(1.0)
    assert binary(correct).total == 1.0
    wrong = Outcome(
        "PTX-H100-GELU", Status.INCORRECT_NUMERICAL, "", "gpu", instructions_required=False
    )
    assert ladder(wrong).components["qualified"] == 0.0 and binary(wrong).total == 0.0
