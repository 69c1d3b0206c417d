"""The timer's formula and its hooks around each call (``ptxgym.evaluate.timing``): where ``before``
and ``after`` run, and that their time stays out of what is measured. No GPU: the device's part (its
synchronisations, the L2 flush) is stood in for and noted."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

from ptxgym.evaluate.timing import CallSchedule, Timer, latency_of


def timer_noting(events: list[str]) -> Timer:
    """A timer without CUPTI (the host-clock method) whose device work only notes itself."""
    timer = Timer.__new__(Timer)  # no GPU: nothing of torch's is touched but what is below
    timer.torch = SimpleNamespace(cuda=SimpleNamespace(synchronize=lambda: events.append("sync")))
    timer.cupti = None
    timer._phases = {}

    def flush() -> bool:
        events.append("flush")
        return True  # the persisting-L2 reset took effect

    timer._reset_l2 = flush  # type: ignore[method-assign]
    return timer


def test_the_hooks_run_around_each_call_outside_its_preparation_and_synchronisation() -> None:
    events: list[str] = []
    timer = timer_noting(events)
    timer.measure(
        lambda i: events.append(f"call {i}"),
        lambda i: events.append(f"prepare {i}"),
        warmup=1,
        iters=2,
        trials=2,
        before=lambda i: events.append(f"before {i}"),
        after=lambda i: events.append(f"after {i}"),
    )

    def warm_up(i: int) -> list[str]:
        return [f"prepare {i}", "sync", f"before {i}", f"call {i}", "sync", f"after {i}"]

    def timed(i: int) -> list[str]:
        return [f"prepare {i}", "flush", "sync", f"before {i}", f"call {i}", "sync", f"after {i}"]

    # Each trial warms up again before its timed calls; the calls are numbered in order.
    assert events == warm_up(0) + timed(1) + timed(2) + warm_up(3) + timed(4) + timed(5)
    assert CallSchedule(warmup=1, iters=2, trials=2).timed == (1, 2, 4, 5)


def test_the_hooks_time_is_not_measured() -> None:
    timer = timer_noting([])
    result = timer.measure(
        lambda i: time.sleep(0.005),
        lambda i: None,
        warmup=1,
        iters=3,
        trials=2,
        before=lambda i: time.sleep(0.06),
        after=lambda i: time.sleep(0.06),
    )
    assert result.method == "host-sync" and len(result.call_ms) == 6
    # A call and either hook would take at least 65 ms.
    assert all(5.0 <= call_ms < 60.0 for call_ms in result.call_ms), result.call_ms
    assert (result.trial_medians_ms, result.latency_ms) == latency_of(result.call_ms, 3, 2)
    # Eight calls, a warm-up call per trial included, each with two hooks of 60 ms.
    assert result.phase_seconds["messages"] >= 8 * 2 * 0.06


def test_the_latency_is_the_mean_of_the_trial_medians() -> None:
    medians, latency = latency_of([1.0, 9.0, 2.0, 4.0, 4.0, 100.0], iters=3, trials=2)
    assert medians == (2.0, 4.0) and latency == 3.0
    with pytest.raises(ValueError, match="5 call times for 2 trials of 3 calls"):
        latency_of([1.0] * 5, iters=3, trials=2)


def test_the_schedule_numbers_every_call_and_times_the_last_iters_of_each_trial() -> None:
    schedule = CallSchedule(warmup=10, iters=50, trials=3)
    assert schedule.calls == 180 and len(schedule.timed) == 150
    assert schedule.timed[:2] == (10, 11) and schedule.timed[49:51] == (59, 70)
    assert not schedule.is_timed(60) and not schedule.is_timed(180) and not schedule.is_timed(-1)
