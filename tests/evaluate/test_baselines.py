"""Cached baselines (``ptxgym.evaluate.baselines``): a change of the timing protocol misses them."""

from __future__ import annotations

import pytest

from ptxgym.evaluate.baselines import baseline_key
from ptxgym.evaluate.timing import CallSchedule
from ptxgym.tasks import get_task

GEMM = get_task("PTX-H100-GEMM")
DEVICE = {
    "name": "H200",
    "driver": "580",
    "torch": "2.11",
    "cuda": "13.0",
    "cudnn": 91900,
    "timing_method": "cupti",
}
PROTOCOL = {"warmup": 10, "iters": 50, "trials": 3}


def test_a_new_call_schedule_with_the_same_counts_misses_cached_baselines(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    key = baseline_key(DEVICE, {}, GEMM, GEMM.workloads[0], PROTOCOL)
    # The schedule before each trial had its own warm-up: 10 warm-up calls, then all 150 timed.
    monkeypatch.setattr(CallSchedule, "timed", property(lambda schedule: tuple(range(10, 160))))
    assert baseline_key(DEVICE, {}, GEMM, GEMM.workloads[0], PROTOCOL) != key
