"""benchmarks/ray_scaling.py's dry run on CPU: a real local Ray cluster, compile-only judges
(one per "GPU" of a pool), real nvcc builds. Every level measured and compiled, a judge killed
with every request answered exactly once, the ratios computed; and the scaling verdict's rules.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from benchmark_scripts import load_benchmark, script

pytest.importorskip("ray", reason="needs Ray: pip install 'ptxgym[ray]'")

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = script("ray_scaling")


@pytest.mark.nvcc
def test_the_dry_run_measures_every_level_and_survives_a_killed_judge(tmp_path: Path) -> None:
    out = tmp_path / "out"
    arguments = ["--out", str(out), "--judge", "compile-only", "--gpus", "1", "2"]
    arguments += ["--trajectories", "2", "4", "--steps", "1", "--local"]
    # A process of its own: the script starts and shuts down its own Ray cluster. Two builds at
    # once (the build memory budget of a small machine allows one; these builds need far less).
    result = subprocess.run(
        [sys.executable, str(SCRIPT), *arguments],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
        env={**os.environ, "PTXGYM_BUILD_MEMORY_GIB": "16"},
        check=False,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    results = json.loads((out / "ray_scaling.json").read_text(encoding="utf-8"))

    assert [pool["error"] for pool in results["pools"]] == [None, None]
    for pool in results["pools"]:
        judges = [member for member in pool["members"] if member.startswith("judge")]
        assert len(judges) == pool["gpus"] and all("serving sm_90" in j for j in judges)
        assert pool["warm_up"]["judges_reached"] == pool["gpus"]
    levels = results["levels"]
    assert [(level["gpus"], level["trajectories"]) for level in levels] == [
        (1, 2),
        (1, 4),
        (2, 2),
        (2, 4),
    ]
    for level in levels:
        evaluations = level["trajectories"] * level["steps"]
        assert level["error"] is None and level["evaluations"] == evaluations
        assert level["statuses"] == {"COMPILED": evaluations}
        assert level["per_hour"] > 0 and level["p50_step_s"] > 0
        assert level["median_speedup"] is None  # compile-only: nothing ran
        # Each of the pool's judges counted; no retry outside the kill level.
        assert len(level["judge_requests"]) == level["gpus"]
        assert sum(level["judge_requests"]) == evaluations
        assert level["pool"]["submitted"] == level["pool"]["answered"] == evaluations

    kill = results["kill"]
    assert (kill["gpus"], kill["trajectories"], kill["steps"]) == (2, 4, 1)
    check = kill["kill"]
    assert check["passed"], check
    assert check["killed"]["member"].startswith("judge")
    assert kill["pool"]["submitted"] == kill["pool"]["answered"] == 4
    assert kill["pool"]["failed"] == kill["pool"]["cancelled"] == 0
    assert kill["pool"]["duplicate_answers"] == 0
    assert kill["pool"]["actor_deaths"] >= 1
    assert kill["statuses"] == {"COMPILED": 4}

    ratios = results["ratios"]
    assert [ratio["trajectories"] for ratio in ratios] == [2, 4]
    for ratio in ratios:
        assert ratio["ratio"] == pytest.approx(ratio["largest_per_hour"] / ratio["base_per_hour"])
        assert ratio["after_first_answer_ratio"] is None or ratio["after_first_answer_ratio"] > 0
        assert ratio["required"] == pytest.approx(1.8)
        assert ratio["verdict"] == "dry run"
    assert "speedups" not in results  # on by default only with GPU judges

    # The same levels through the local (here compile-only) evaluator, and one Ray judge
    # against it.
    assert [level["trajectories"] for level in results["local_levels"]] == [2, 4]
    assert all(level["statuses"] == {"COMPILED": level["trajectories"]}
               for level in results["local_levels"])  # fmt: skip
    assert [(row["trajectories"], row["verdict"]) for row in results["against_local"]] == [
        (2, "dry run"),
        (4, "dry run"),
    ]

    markdown = (out / "ray_scaling.md").read_text(encoding="utf-8")
    assert markdown in result.stdout
    assert "against the local evaluator" in markdown
    assert "evaluations per hour measure the builds" in markdown
    assert "Kill check" in markdown and "**PASS**" in markdown


def test_the_scaling_verdict_needs_ninety_percent_of_linear_and_both_levels() -> None:
    benchmark = load_benchmark("ray_scaling")

    def level(gpus: int, trajectories: int, per_hour: float, error: str | None = None) -> Any:
        return {
            "gpus": gpus,
            "trajectories": trajectories,
            "per_hour": per_hour,
            # Without the first round of builds, every rate is higher.
            "after_first_answer_per_hour": per_hour * gpus * 1.1,
            "error": error,
        }

    levels = [
        level(1, 16, 1000.0),
        level(2, 16, 1850.0),
        level(1, 32, 1000.0),
        level(2, 32, 1700.0),
        level(1, 48, 1000.0),
        level(2, 48, 2000.0, error="EvaluatorError: two actors died under this request"),
    ]
    ratios = benchmark.scaling_ratios(levels, [1, 2], [16, 32, 48, 64], "gpu")
    assert [(r["trajectories"], r["verdict"]) for r in ratios] == [
        (16, "PASS"),
        (32, "FAIL"),
        (48, "no result"),  # a level cut short is no measurement
        (64, "no result"),  # never run
    ]
    assert ratios[0]["ratio"] == pytest.approx(1.85)
    assert ratios[0]["after_first_answer_ratio"] == pytest.approx(3.7)
    assert ratios[1]["required"] == pytest.approx(1.8)
    assert benchmark.scaling_ratios(levels, [1, 2], [16], "compile-only")[0]["verdict"] == (
        "dry run"
    )
    # Four GPUs against two: 90 % of twice.
    (four,) = benchmark.scaling_ratios(
        [level(2, 16, 1000.0), level(4, 16, 1700.0)], [2, 4], [16], "gpu"
    )
    assert four["required"] == pytest.approx(1.8) and four["verdict"] == "FAIL"
    assert benchmark.scaling_ratios(levels, [2], [16], "gpu") == []


def test_one_ray_gpu_must_keep_ninety_percent_of_the_local_evaluators_rate() -> None:
    benchmark = load_benchmark("ray_scaling")
    pool = [
        {"gpus": 1, "trajectories": 16, "per_hour": 1700.0, "median_speedup": 0.92, "error": None},
        {"gpus": 1, "trajectories": 32, "per_hour": 1500.0, "median_speedup": 0.92, "error": None},
        {"gpus": 2, "trajectories": 16, "per_hour": 3300.0, "median_speedup": 0.92, "error": None},
    ]
    local = [
        {"trajectories": 16, "per_hour": 1800.0, "median_speedup": 0.93, "error": None},
        {"trajectories": 32, "per_hour": 1800.0, "median_speedup": 0.93, "error": None},
        {"trajectories": 48, "error": "EvaluatorError: the judge died"},
    ]
    rows = benchmark.against_local(pool, local, "gpu")
    assert [(row["trajectories"], row["verdict"]) for row in rows] == [
        (16, "PASS"),  # 0.94
        (32, "FAIL"),  # 0.83
        (48, "no result"),
    ]
    assert rows[0]["ratio"] == pytest.approx(1700 / 1800)
    assert benchmark.against_local(pool, local[:1], "compile-only")[0]["verdict"] == "dry run"


def test_with_gpu_judges_and_no_gpu_it_says_so_at_once(tmp_path: Path) -> None:
    benchmark = load_benchmark("ray_scaling")
    if benchmark.cuda_device_count():
        pytest.skip("a GPU is visible: the run would measure for minutes, not refuse")
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--out", str(tmp_path), "--trajectories", "--local"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode != 0
    assert "needs an NVIDIA GPU" in done.stderr and "compile-only" in done.stderr


def test_an_example_against_local_needs_equal_statuses_and_speedups_within_two_percent() -> None:
    benchmark = load_benchmark("ray_scaling")

    def run(label: str, speedups: list[float], statuses: dict[str, int]) -> dict[str, Any]:
        median = sorted(speedups)[len(speedups) // 2] if speedups else None
        entry = {"label": label, "statuses": statuses, "speedups": speedups, "error": None}
        return {**entry, "median": median}

    examples = [
        {
            "task": "PTX-H100-GEMM",
            "example": "expert/gemm.cu",
            "runs": [run("local", [0.915], {"PASSED": 3}), run("Ray", [0.916], {"PASSED": 3})],
            "largest_difference": 0.0011,
            "same_statuses": True,
            "within_tolerance": True,
        },
        {
            "task": "PTX-H100-GQADecode",
            "example": "expert/gqa_decode.cu",
            "runs": [run("local", [1.05], {"PASSED": 3}), run("Ray", [], {"TIMEOUT": 3})],
            "largest_difference": None,
            "same_statuses": False,
            "within_tolerance": False,
        },
    ]
    table = benchmark.speedup_lines(examples, "through both")
    assert "| local | Ray | largest difference | same statuses | within 2% |" in table[2]
    assert table[-1].endswith("| n/a | **no** | **no** |")
    results = {"pools": [], "levels": [], "ratios": [], "examples_against_local": examples}
    assert not benchmark.all_checks_hold(results)
    results["examples_against_local"] = examples[:1]
    assert benchmark.all_checks_hold(results)
