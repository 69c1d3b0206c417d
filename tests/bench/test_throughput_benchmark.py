"""benchmarks/throughput.py's steady rate: the first and the last round of steps left out."""

from __future__ import annotations

import pytest
from benchmark_scripts import load_benchmark

throughput = load_benchmark("throughput")


def test_the_window_runs_from_the_first_rounds_end_to_the_last_rounds_start() -> None:
    # Two trajectories, eight steps: the window runs from the 2nd end (12) to the 6th (33),
    # so the 3rd to 6th ends (18, 21, 27, 33) are counted.
    ends = [10, 33, 12, 40, 18, 21, 27, 36]
    steady = throughput.steady_rate(ends, 2)
    assert steady == pytest.approx({"per_hour": 4 / 21 * 3600, "evaluations": 4, "window_s": 21})


def test_one_trajectory_leaves_out_its_first_and_last_step() -> None:
    # From the first step's end (5) to the third's (17): the second and third steps counted.
    steady = throughput.steady_rate([5, 11, 17, 23], 1)
    assert steady == pytest.approx({"per_hour": 2 / 12 * 3600, "evaluations": 2, "window_s": 12})


@pytest.mark.parametrize(
    ("ends", "trajectories"),
    [
        ([], 1),
        ([1, 2], 1),  # no step between the first and the last
        ([1, 2, 3, 4], 2),  # two rounds: nothing between them
        ([4, 4, 4], 1),  # no time between the window's ends
    ],
)
def test_no_window_gives_no_rate(ends: list[float], trajectories: int) -> None:
    assert throughput.steady_rate(ends, trajectories) is None


def test_the_table_shows_the_steady_rate_and_its_ratio_to_the_first_level() -> None:
    one = {"per_hour": 600.0, "evaluations": 2, "window_s": 12.0}
    sixteen = {"per_hour": 2100.0, "evaluations": 48, "window_s": 82.3}
    assert throughput.steady_cell(sixteen, one) == "2100 (3.50x, 48 in 82 s)"
    assert throughput.steady_cell(sixteen, None) == "2100 (48 in 82 s)"
    assert throughput.steady_cell(None, one) == "–"
