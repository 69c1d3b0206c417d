"""benchmarks/experts.py on CPU: which kernels it would evaluate, its table, and its refusal to
run without a GPU (it evaluates on the GPU only: docs/benchmarks.md holds its results)."""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml
from benchmark_scripts import load_benchmark, script

from ptxgym import paths
from ptxgym.device.gpus import visible_gpus

SCRIPT = script("experts")


def test_it_takes_every_shipped_expert_and_every_draft_once_per_task() -> None:
    experts = load_benchmark("experts")
    drafts = yaml.safe_load((paths.examples_dir() / "expert/drafts/manifest.yaml").read_text())
    chosen = experts.kernels("all", None)
    assert len(chosen) == len(set(chosen))
    assert {file for file, _ in experts.kernels("shipped", None)} == {
        f"expert/{path.name}" for path in (paths.examples_dir() / "expert").glob("*.cu")
    }
    assert experts.kernels("drafts", None) == [
        (f"expert/drafts/{entry['file']}", entry["task"]) for entry in drafts["drafts"]
    ]
    assert experts.kernels("all", "MHAFwd-d64") == [
        ("expert/mha_fwd_d64.cu", "PTX-H100-MHAFwd-d64"),
    ]


def test_a_row_shows_the_workloads_range_and_what_executed() -> None:
    experts = load_benchmark("experts")
    outcome = {
        "status": "PASSED",
        "message": "correct on 35 checks",
        "qualified": True,
        "profile": {"warp_counts": {"UBLKCP": 65536}, "coverage": None, "method": "cupti"},
        "latency_ms": 2.5017,
        "baseline_latency_ms": 2.6240,
        "speedup": 1.049,
        "timings": [{"speedup": 0.988}, {"speedup": 1.26}],
        "speed_of_light": {"achieved_tflops": 1.8, "mfu": 0.0018},
        "sanitizers": [{"tool": "memcheck", "ok": True, "errors": 0}],
    }
    decode = experts.row("expert/gqa_decode.cu", "PTX-H100-GQADecode", outcome, 1.0)
    table = experts.markdown([decode])
    assert table.splitlines()[-1] == (
        "| expert/gqa_decode.cu | PTX-H100-GQADecode | PASSED | True (UBLKCP 65,536) | 2.5017 "
        "| 2.6240 | 1.049 (0.988-1.260) | 2 | 0.2% | 0 | – |"
    )


def test_a_failed_row_shows_how_far_past_its_tolerance_each_output_was() -> None:
    experts = load_benchmark("experts")
    checks = [
        {"stage": "trial0", "outputs": [{"name": "dQ", "ok": True, "worst_ratio": 0.4}]},
        {
            "stage": "outliers",
            "outputs": [
                {"name": "dQ", "ok": False, "worst_ratio": 11.64},
                {"name": "dV", "ok": False, "worst_ratio": 3.5},
            ],
        },
    ]
    outcome = {"status": "INCORRECT_NUMERICAL", "message": "", "checks": checks}
    failed = experts.row("expert/drafts/mha_bwd_d128.cu", "PTX-H100-MHABwd-d128", outcome, 1.0)
    assert failed["worst_ratios"] == {"outliers:dQ": 11.64, "outliers:dV": 3.5}
    assert experts.markdown([failed]).endswith("| outliers:dQ 11.6, outliers:dV 3.5 |")


def test_a_variant_sets_one_constexpr_and_refuses_a_missing_one() -> None:
    experts = load_benchmark("experts")
    source = "constexpr int kStages = 3;  // depth\nconstexpr int kHeadsPerCta = 4;\n"
    varied = experts.with_settings(source, {"kHeadsPerCta": "2"}, "f.cu")
    assert varied == "constexpr int kStages = 3;  // depth\nconstexpr int kHeadsPerCta = 2;\n"
    with pytest.raises(SystemExit, match="0 definitions of constexpr kGroupM"):
        experts.with_settings(source, {"kGroupM": "16"}, "f.cu")
    with pytest.raises(SystemExit, match="NAME=VALUE"):
        experts.parse_settings(["kStages"])


def test_without_a_gpu_it_says_so() -> None:
    if visible_gpus():
        pytest.skip("a GPU is visible: the script would evaluate for minutes, not refuse")
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--out", "/tmp/ptxgym-experts-test"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode != 0
    assert "needs an NVIDIA GPU" in done.stderr
