"""benchmarks/throughput.py's steady rate: the window in which every trajectory is under way."""

from __future__ import annotations

from typing import Any

import pytest
from benchmark_scripts import load_benchmark

throughput = load_benchmark("throughput")


def steps(*ends: float) -> list[dict[str, Any]]:
    return [{"ended_at": end} for end in ends]


def test_the_window_runs_from_the_last_first_step_to_the_first_last_step() -> None:
    runs = [steps(10, 20, 30, 40), steps(14, 22, 31, 36)]
    # The window is (14, 36]: 20, 30 of the first and 22, 31, 36 of the second end in it.
    steady = throughput.steady_rate(runs)
    assert steady == pytest.approx({"per_hour": 5 / 22 * 3600, "evaluations": 5, "window_s": 22})


def test_one_trajectory_counts_every_step_after_its_first() -> None:
    steady = throughput.steady_rate([steps(5, 11, 17, 23)])
    assert steady == pytest.approx({"per_hour": 3 / 18 * 3600, "evaluations": 3, "window_s": 18})


@pytest.mark.parametrize(
    "runs",
    [
        [],
        [steps(1, 2)],  # too few steps for a window past the first
        [steps(1, 2, 3), steps(10, 11, 12)],  # one ended before the other's first step did
    ],
)
def test_no_window_gives_no_rate(runs: list[list[dict[str, Any]]]) -> None:
    assert throughput.steady_rate(runs) is None


def test_the_table_shows_the_steady_rate_and_its_ratio_to_the_first_level() -> None:
    one = {"per_hour": 600.0, "evaluations": 3, "window_s": 18.0}
    sixteen = {"per_hour": 2100.0, "evaluations": 90, "window_s": 154.3}
    assert throughput.steady_cell(sixteen, one) == "2100 (3.50x, 90 in 154 s)"
    assert throughput.steady_cell(None, one) == "–"
