"""GPU evaluation benchmark: the naive examples through env.step, reproducibility, baselines.

Prints markdown (for docs/benchmarks.md) and writes the raw numbers to OUT/gpu_evaluation.json.
Run on a GPU host: ``python benchmarks/gpu_evaluation.py --out DIR`` (scripts/gpu_host.sh does).
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import time
from pathlib import Path
from typing import Any

import yaml

from ptxgym import paths
from ptxgym.env import PTXKernelEnv
from ptxgym.evaluate.judge_settings import JudgeSettings
from ptxgym.evaluate.local_gpu import LocalGPUEvaluator, incompatibility
from ptxgym.evaluate.roofline import peaks_for, speed_of_light
from ptxgym.outcome import WorkloadTiming
from ptxgym.tasks import registry

REPEATS = 5


def step(evaluator: LocalGPUEvaluator, task_id: str, source: str) -> dict[str, Any]:
    env = PTXKernelEnv(task_id, evaluator=evaluator, language=evaluator.language)
    env.reset(seed=0)
    started = time.perf_counter()
    info = env.step(source)[4]
    outcome = info["outcome"]
    return {
        "task": task_id,
        "status": info["status"],
        "message": info["message"],
        "latency_ms": outcome["latency_ms"],
        "baseline_latency_ms": outcome["baseline_latency_ms"],
        "speedup": outcome["speedup"],
        "step_s": time.perf_counter() - started,
        "method": outcome["timings"][0]["method"] if outcome["timings"] else None,
        "qualified": outcome["qualified"],
        "profile_s": outcome["profile"]["seconds"] if outcome["profile"] else None,
        "executed": {
            family: executed
            for family, executed in (outcome["profile"] or {}).get("families", {}).items()
        },
        "evaluation_s": outcome["seconds"],
        "speed_of_light": outcome["speed_of_light"],
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, default=Path("benchmarks/out"))
    parser.add_argument(
        "--only-baselines", metavar="PATTERN", help="measure only baselines of ids with PATTERN"
    )
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    evaluator = LocalGPUEvaluator()
    results: dict[str, Any] = {"date": datetime.date.today().isoformat()}
    results["device"] = evaluator.device_info()
    print(f"# GPU evaluation, {results['date']}, {results['device']['name']}\n")

    if args.only_baselines is not None:
        baseline_table(evaluator, results, args.out, args.only_baselines)
        return
    manifest = yaml.safe_load((paths.examples_dir() / "manifest.yaml").read_text())
    examples = []
    # One evaluator per action language the manifest names (CUDA when an entry names none).
    by_language = {evaluator.language: evaluator}
    for entry in manifest["examples"]:
        source = (paths.examples_dir() / entry["file"]).read_text()
        language = entry.get("language", evaluator.language)
        if language not in by_language:
            by_language[language] = LocalGPUEvaluator(language=language)
        for task_id in entry["tasks"]:
            if incompatibility(registry()[task_id]) is None:
                result = step(by_language[language], task_id, source)
                examples.append(result | {"example": entry["file"]})
                print(f"  {task_id} {entry['file']}: {examples[-1]}", flush=True)
    results["examples"] = examples
    save(args.out, results)
    print("## Example kernels through env.step\n")
    print(
        "| task | example | status | latency ms | baseline ms | speedup | qualified "
        "| profile s | step s |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for r in examples:
        numbers = (
            f"{r['latency_ms']:.3f} | {r['baseline_latency_ms']:.4f} | {r['speedup']:.4f}"
            if r["speedup"]
            else "- | - | -"
        )
        profile_s = f"{r['profile_s']:.1f}" if r["profile_s"] is not None else "-"
        print(
            f"| {r['task']} | {r['example']} | {r['status']} | {numbers} | {r['qualified']} "
            f"| {profile_s} | {r['step_s']:.1f} |"
        )

    gemm = (paths.examples_dir() / "naive" / "gemm.cu").read_text()
    # Reproducibility is about the timing: the repeats skip memcheck and the profile.
    timing_only = LocalGPUEvaluator(settings=JudgeSettings(memcheck=False, profile=False))
    repeats = [step(timing_only, "PTX-H100-GEMM", gemm) for _ in range(REPEATS)]
    speedups = [r["speedup"] for r in repeats if r["speedup"]]
    median = statistics.median(speedups)
    deviation = max(abs(s / median - 1) for s in speedups) * 100
    results["gemm_repeats"] = {"speedups": speedups, "median": median, "max_dev_pct": deviation}
    save(args.out, results)
    print(f"\n## Naive GEMM evaluated {REPEATS} times\n")
    print("speedups: " + ", ".join(f"{s:.5f}" for s in speedups))
    print(f"median {median:.5f}; largest deviation from the median {deviation:.2f}%")

    baseline_table(evaluator, results, args.out, "")


def baseline_table(
    evaluator: LocalGPUEvaluator, results: dict[str, Any], out: Path, pattern: str
) -> None:
    print("\n## Baseline latency per H100 task and workload, against the GPU's peaks\n")
    print(
        "| task | baseline | workload | latency ms | TFLOP/s | MFU | GB/s | bandwidth use "
        "| x bound |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    device = evaluator.device_info()
    peaks = peaks_for(str(device.get("name", "")), device.get("sm_count"))
    baselines: dict[str, Any] = {}
    for task in registry().values():
        if task.gpu != "H100" or pattern not in task.id:
            continue
        try:
            latencies = evaluator.baseline(task)
        except Exception as exc:
            baselines[task.id] = {"error": str(exc)}
            print(f"| {task.id} | {task.callables.baseline} | - | not measured: {exc} |")
            continue
        baselines[task.id] = latencies
        results["baselines"] = baselines
        save(out, results)
        for workload, latency in latencies.items():
            timed = WorkloadTiming(workload, latency, latency, 1.0, (latency,), "cupti")
            bound = speed_of_light(task, [timed], peaks) if peaks is not None else None
            against = (
                f"{bound.achieved_tflops:.1f} | {bound.mfu:.1%} | {bound.achieved_gbps:.0f} | "
                f"{bound.bandwidth_use:.1%} | {bound.of_bound:.2f}"
                if bound is not None
                else "- | - | - | - | -"
            )
            row = f"| {task.id} | {task.callables.baseline} | {workload} | {latency:.4f} |"
            print(f"{row} {against} |", flush=True)


def save(out: Path, results: dict[str, Any]) -> None:
    """Write what is measured so far: a run cut short still leaves its numbers."""
    (out / "gpu_evaluation.json").write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
