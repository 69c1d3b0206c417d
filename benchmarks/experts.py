"""Every expert kernel through the judge with `ptxgym eval`'s default settings: issue 27's table.

Run on a GPU host: ``python benchmarks/experts.py --out DIR [--which shipped|drafts|all]
[--only TEXT]``. The shipped kernels are examples/manifest.yaml's experts (CUDA); the drafts are
examples/expert/drafts/manifest.yaml's. Each is evaluated once for each task it solves, with
memcheck and the instruction count on (`JudgeSettings()`, as `ptxgym eval ID FILE` does), so a
row is what a user of `ptxgym eval` would see. Prints markdown for docs/benchmarks.md: status,
qualified and what executed, latency against the library's, speedup (the range over workloads
for a pooled task), TFLOP/s and MFU, memcheck, and for a failed check how many times its
tolerance the worst element is; writes every outcome to OUT/experts.json.

``--set NAME=VALUE`` (repeatable) evaluates a variant: each chosen kernel's
``constexpr <type> NAME = ...;`` gets VALUE (a kernel without that constant is an error), so
that variants are timed on one host against the file as it is (e.g. ``--only gemm_cluster --set
kGroupM=16``). The row names the settings.
"""

from __future__ import annotations

import argparse
import datetime
import json
import re
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))  # the manifests' reader, shared with the tests

from expert_examples import DRAFT_TASKS, EXPERTS  # noqa: E402

from ptxgym import paths  # noqa: E402
from ptxgym.device.gpus import visible_gpus  # noqa: E402
from ptxgym.evaluate.local_gpu import LocalGPUEvaluator, incompatibility  # noqa: E402
from ptxgym.tasks import get_task  # noqa: E402


def kernels(which: str, only: str | None) -> list[tuple[str, str]]:
    """(file under examples/, task id) of the chosen kernels, shipped first."""
    chosen: list[tuple[str, str]] = []
    if which in ("shipped", "all"):
        chosen += [(file, task_id) for file, task_id, _ in EXPERTS]
    if which in ("drafts", "all"):
        chosen += [(f"expert/drafts/{file}", task_id) for file, task_id in DRAFT_TASKS]
    return [(file, task) for file, task in chosen if only is None or only in f"{file} {task}"]


def with_settings(source: str, settings: dict[str, str], file: str) -> str:
    """``source`` with each named ``constexpr`` constant set to its value."""
    for name, value in settings.items():
        pattern = re.compile(rf"(\bconstexpr\s+[\w:]+\s+{re.escape(name)}\s*=\s*)[^;]+;")
        source, found = pattern.subn(lambda match, v=value: f"{match.group(1)}{v};", source)
        if found != 1:
            raise SystemExit(f"{file}: {found} definitions of constexpr {name} (one is needed)")
    return source


def parse_settings(pairs: list[str]) -> dict[str, str]:
    settings = {}
    for pair in pairs:
        name, _, value = pair.partition("=")
        if not re.fullmatch(r"[A-Za-z_]\w*", name) or not value.strip():
            raise SystemExit(f"--set {pair!r}: NAME=VALUE is needed")
        settings[name] = value.strip()
    return settings


def worst_ratios(outcome: dict[str, Any]) -> dict[str, float]:
    """For each output that failed a check, the largest worst_ratio over its checks."""
    ratios: dict[str, float] = {}
    for report in outcome.get("checks") or []:
        for output in report["outputs"]:
            if not output["ok"]:
                name = f"{report['stage']}:{output['name']}"
                ratios[name] = max(ratios.get(name, 0.0), output.get("worst_ratio", 0.0))
    return ratios


def row(file: str, task_id: str, outcome: dict[str, Any], seconds: float) -> dict[str, Any]:
    """The table's numbers of one evaluation."""
    profile = outcome.get("profile") or {}
    light = outcome.get("speed_of_light") or {}
    speedups = [timing["speedup"] for timing in outcome.get("timings") or []]
    memcheck = [s for s in outcome.get("sanitizers") or [] if s["tool"] == "memcheck"]
    return {
        "file": file,
        "task": task_id,
        "status": outcome["status"],
        "message": outcome["message"],
        "qualified": outcome.get("qualified"),
        "executed_warps": profile.get("warp_counts") or {},
        "coverage": profile.get("coverage"),
        "profile_method": profile.get("method"),
        "latency_ms": outcome.get("latency_ms"),
        "baseline_latency_ms": outcome.get("baseline_latency_ms"),
        "speedup": outcome.get("speedup"),
        "workload_speedups": speedups,
        "tflops": light.get("achieved_tflops"),
        "mfu": light.get("mfu"),
        "memcheck_errors": memcheck[0]["errors"] if memcheck and memcheck[0]["ok"] else None,
        "worst_ratios": worst_ratios(outcome),
        "seconds": seconds,
    }


def markdown(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| kernel | task | status | qualified (executed warps) | latency ms | library ms "
        "| speedup | TFLOP/s | MFU | memcheck errors | worst failed element (x tolerance) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        executed = ", ".join(f"{op} {n:,}" for op, n in sorted(r["executed_warps"].items()))
        speedup = "–"
        if r["speedup"] is not None:
            speedup = f"{r['speedup']:.3f}"
            if len(r["workload_speedups"]) > 1:
                low, high = min(r["workload_speedups"]), max(r["workload_speedups"])
                speedup += f" ({low:.3f}-{high:.3f})"
        numbers = [
            f"{r[key]:.4f}" if r[key] is not None else "–"
            for key in ("latency_ms", "baseline_latency_ms")
        ]
        tflops = f"{r['tflops']:.0f}" if r["tflops"] is not None else "–"
        mfu = f"{r['mfu']:.1%}" if r["mfu"] is not None else "–"
        memcheck = "–" if r["memcheck_errors"] is None else str(r["memcheck_errors"])
        failed = ", ".join(f"{name} {ratio:.3g}" for name, ratio in r["worst_ratios"].items())
        lines.append(
            f"| {r['file']} | {r['task']} | {r['status']} | {r['qualified']} ({executed}) "
            f"| {numbers[0]} | {numbers[1]} | {speedup} | {tflops} | {mfu} | {memcheck} "
            f"| {failed or '–'} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, default=Path("benchmarks/out"))
    parser.add_argument("--which", choices=("shipped", "drafts", "all"), default="all")
    parser.add_argument("--only", help="only the kernels whose file or task id holds this text")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a variant: the kernels' constexpr NAME set to VALUE (repeatable)",
    )
    args = parser.parse_args()
    settings = parse_settings(args.set)
    args.out.mkdir(parents=True, exist_ok=True)
    chosen = kernels(args.which, args.only)
    if not chosen:
        raise SystemExit(f"no expert kernel matches --which {args.which} --only {args.only}")
    if not visible_gpus():
        raise SystemExit("benchmarks/experts.py needs an NVIDIA GPU: none is visible")
    evaluator = LocalGPUEvaluator()
    results: dict[str, Any] = {"date": datetime.date.today().isoformat()}
    results["device"] = evaluator.device_info()
    rows, outcomes = [], []
    label = "".join(f" [{name}={value}]" for name, value in settings.items())
    sources = {
        file: with_settings((paths.examples_dir() / file).read_text(), settings, file)
        for file, _ in chosen
    }
    try:
        for file, task_id in chosen:
            task = get_task(task_id)
            reason = incompatibility(task)
            if reason is not None:
                print(f"{file} {task_id}: skipped ({reason})", flush=True)
                continue
            started = time.perf_counter()
            outcome = evaluator.evaluate(task, sources[file]).to_dict()
            rows.append(row(file + label, task_id, outcome, time.perf_counter() - started))
            outcomes.append({"file": file + label, "task": task_id, "outcome": outcome})
            done = rows[-1]
            print(f"{file} {task_id}: {done['status']}, speedup {done['speedup']}", flush=True)
            # After each kernel, so that a call cut short keeps what it measured.
            results["rows"], results["outcomes"] = rows, outcomes
            (args.out / "experts.json").write_text(json.dumps(results, indent=1))
    finally:
        evaluator.close()
    print(f"\n# Expert kernels, {results['date']}, {results['device']['name']}\n")
    print(markdown(rows))


if __name__ == "__main__":
    main()
