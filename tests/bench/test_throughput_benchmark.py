"""benchmarks/throughput.py: its steady rate (the first and the last round of steps left out),
distinct steps that compile in every run, the GPU lock's holders named, and how start-ups met
timings said, and what counted each step."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from benchmark_scripts import load_benchmark

from ptxgym.evaluate.compile_only import CompileOnlyEvaluator
from ptxgym.evaluate.judge_settings import JudgeSettings

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


def _level(trajectories: int, per_hour: float, speedup: float) -> dict[str, float]:
    return {"trajectories": trajectories, "per_hour": per_hour, "median_speedup": speedup}


def test_the_targets_are_said_met_or_not_against_one_trajectory_of_the_same_run() -> None:
    results = {
        "levels": [_level(1, 625.0, 0.9401), _level(16, 1950.0, 0.9386)],
        "cached": {"p50_step_s": 1.86},
    }
    assert throughput.target_lines(results) == [
        "1,950 evaluations/hour at 16 trajectories (≥ 2,000: NOT met)",
        "3.12x one trajectory's rate (≥ 2.5x: met)",
        "median speedup 0.9386 against 0.9401 at one trajectory, -0.16% (within ±2%: met)",
        "cached step p50 1.86 s (≤ 2 s: met)",
    ]
    results = {
        "levels": [_level(1, 1020.0, 0.9141), _level(16, 2242.0, 0.8900)],
        "cached": {"p50_step_s": 2.4},
    }
    lines = throughput.target_lines(results)
    assert lines[0].endswith("(≥ 2,000: met)")
    assert lines[1] == "2.20x one trajectory's rate (≥ 2.5x: NOT met)"
    assert lines[2].endswith("-2.64% (within ±2%: NOT met)")
    assert lines[3] == "cached step p50 2.40 s (≤ 2 s: NOT met)"


def test_a_run_of_one_level_is_held_to_the_rate_alone() -> None:
    # Without a one-trajectory level in the run there is nothing to scale or compare against.
    lines = throughput.target_lines({"levels": [_level(16, 2100.0, 0.91)]})
    assert lines == ["2,100 evaluations/hour at 16 trajectories (≥ 2,000: met)"]
    assert throughput.target_lines({"levels": []}) == []


def test_a_second_run_with_the_same_labels_builds_afresh() -> None:
    # The build cache outlives a run: a second run of the benchmark (a fresh import) stepping
    # the same labels must still compile, or its level would time no compiling.
    source = (Path(__file__).resolve().parents[2] / "examples/naive/gemm.cu").read_text()
    evaluator = CompileOnlyEvaluator()
    first = throughput.trajectory(evaluator, "PTX-H100-GEMM", source, "1:t0", 1)
    second_run = load_benchmark("throughput")
    second = second_run.trajectory(evaluator, "PTX-H100-GEMM", source, "1:t0", 1)
    assert [r["status"] for r in first + second] == ["COMPILED", "COMPILED"]
    assert not first[0]["cached_build"] and not second[0]["cached_build"]
    # The same source stepped twice: the cache answers the second step (the cached-step level).
    same = throughput.trajectory(evaluator, "PTX-H100-GEMM", source, "cached", 2, distinct=False)
    assert same[1]["cached_build"]


def test_a_lock_holder_is_named_by_its_process_id() -> None:
    # The lock's occupancy names the processes holding it shared while a timing waits.
    assert throughput.kind_of_pid(os.getpid()) == "the benchmark's process (envs, builds' clients)"
    ended = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        check=True,
        capture_output=True,
        text=True,
    )
    assert throughput.kind_of_pid(int(ended.stdout)) == "a process gone before it was named"


@pytest.mark.parametrize(
    ("lock_startups", "beside", "iters", "linger", "said"),
    [
        (True, None, 50, 0.0, "locked"),
        (True, 50, 50, 0.0, "beside timings of 50+ calls per trial"),
        (True, 50, 5, 0.0, "locked"),
        (True, None, 50, 2.0, "locked, batched by lingers of 2 s"),
        (False, None, 50, 0.0, "without the lock"),
    ],
)
def test_the_report_says_how_start_ups_met_timings(
    lock_startups: bool, beside: int | None, iters: int, linger: float, said: str
) -> None:
    settings = JudgeSettings(
        lock_startups=lock_startups,
        startups_beside_iters=beside,
        iters=iters,
        startup_linger_s=linger,
    )
    assert throughput.startup_policy(settings.__dict__) == said


@pytest.mark.parametrize(
    ("profile", "said"),
    [
        (None, "not profiled"),
        ({"method": "cupti", "note": ""}, "cupti"),
        (
            {"method": "ncu", "note": "counted with Nsight Compute: the CUPTI self-test failed"},
            "ncu: counted with Nsight Compute: the CUPTI self-test failed",
        ),
    ],
    ids=["none", "asked-for", "fallen-back"],
)
def test_each_step_says_what_counted_it_and_why_when_the_judge_fell_back(
    profile: dict[str, str] | None, said: str
) -> None:
    assert throughput.counted_by(profile) == said
