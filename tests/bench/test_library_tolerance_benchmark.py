"""benchmarks/library_tolerance.py on CPU: its summary of the library's worst elements, and its
refusals (it runs the libraries on the GPU only: docs/benchmarks.md holds its results)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from benchmark_scripts import load_benchmark, script

from ptxgym.device.gpus import visible_gpus

SCRIPT = script("library_tolerance")


def _row(stage: str, output: str, seed: int, ratio: float, mismatched: int) -> dict[str, Any]:
    return {
        "task": "PTX-H100-MHABwd-d64",
        "workload": "b4-s4096-h16",
        "stage": stage,
        "seed": seed,
        "output": output,
        "ok": ratio <= 1.0,
        "worst_ratio": ratio,
        "mismatched": mismatched,
        "tolerance": {"atol": 0.4 if stage == "outliers" else 0.02, "rtol": 0.02},
    }


def test_the_summary_takes_the_worst_over_seeds_per_stage_and_output() -> None:
    benchmark = load_benchmark("library_tolerance")
    rows = [
        _row("normal", "dQ", 1, 0.5, 0),
        _row("normal", "dQ", 2, 0.7, 0),
        _row("outliers", "dQ", 1, 23.6, 672),
        _row("outliers", "dQ", 2, 0.9, 0),
        _row("outliers", "dK", 1, 4.8, 31),
    ]
    lines = benchmark.summary(rows)
    assert lines[2] == "| PTX-H100-MHABwd-d64 | normal | dQ | 0.02, 0.02 | 0.700 | 0 | 0/2 |"
    assert lines[3] == "| PTX-H100-MHABwd-d64 | outliers | dQ | 0.4, 0.02 | 23.600 | 672 | 1/2 |"
    assert lines[4] == "| PTX-H100-MHABwd-d64 | outliers | dK | 0.4, 0.02 | 4.800 | 31 | 1/1 |"
    assert len(lines) == 5


@pytest.mark.parametrize(
    ("arguments", "message"),
    [(["--seeds", "0"], "--seeds must be at least 1"), ([], "it needs a CUDA GPU")],
)
def test_it_refuses_what_it_cannot_measure(
    arguments: list[str], message: str, tmp_path: Path
) -> None:
    if not arguments and visible_gpus():
        pytest.skip("a GPU is visible: the script would measure, not refuse")
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--out", str(tmp_path), *arguments],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode != 0
    assert message in done.stderr
