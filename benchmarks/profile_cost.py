"""What the instruction profile costs, by metric set: where its seconds go after the word.

Run on a GPU host: ``python benchmarks/profile_cost.py --out DIR``. The example kernel is
compiled once; ``--repeats`` profile runs per metric set are all started together and given
time to make their CUDA contexts under Nsight Compute (as the judge's runs started ahead have),
then each is handed the job in turn, alone on the GPU. Reported per set, as medians: the call
under the tool (its replays), the GPU part around it (the candidate's library and inputs), the
tail (the program's exit and the report's writing), the report's reading, and the whole from
the word to the counts; and whether the set's counts qualify the kernel. The judge's set is the
first, then with the details it collects on request; the others show what the opcode counts
cost alone.

Then, with the judge's set, what a run's *first* profiled kernel costs against later ones: one
Nsight Compute run of a program that calls the candidate three times, each between
``cudaProfilerStart`` and ``cudaProfilerStop``; and one whose program first profiles a trivial
kernel of its own (a warm-up a run could do ahead of its word).

Prints markdown for docs/benchmarks.md and writes OUT/profile_cost.json.
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ptxgym.device.gpus import visible_gpus
from ptxgym.evaluate.local_gpu import incompatibility
from ptxgym.evaluate.profile import (
    PROFILE_METRICS,
    THREAD_METRIC,
    PendingProfile,
    find_ncu,
    profile_metrics,
)
from ptxgym.evaluate.single_call import CallJob
from ptxgym.evaluate.worker import host_inputs
from ptxgym.languages.cuda.compiler import compile_source
from ptxgym.outcome import InstructionProfile
from ptxgym.tasks import get_task

METRIC_SETS: dict[str, tuple[str, ...]] = {
    "judge's (both opcode metrics, duration and launch facts)": PROFILE_METRICS,
    "judge's with details (throughput, occupancy)": profile_metrics(details=True),
    "thread opcode metric only": (THREAD_METRIC,),
    # Warp-level counts by opcode class from hardware counters, without binary instrumentation
    # (they cannot tell a predicated-off instruction from one that ran).
    "hardware opcode-class counters": (
        "sm__sass_inst_executed_op_shared_gmma.sum",
        "sm__sass_inst_executed_op_tma_ld.sum",
    ),
}
CONTEXT_WAIT_S = 40.0  # for every waiting run to have made its context under the tool
PROFILED_CALLS = 3
_SECONDS_MARK = "profiled-call-seconds "


def record(result: InstructionProfile) -> dict[str, Any]:
    """Where one run's seconds went after the word."""
    call = result.call_seconds
    gpu = call.get("gpu", 0.0) + call.get("gpu_wait", 0.0)
    return {
        "ok": result.ok,
        "reason": result.reason[-300:],
        "qualified": result.qualified,
        "seconds": result.seconds,
        "call": call.get("call"),
        "load_and_inputs": call.get("load", 0.0) + call.get("inputs", 0.0),
        "tail": result.seconds - gpu - result.read_seconds,
        "read": result.read_seconds,
        "context_before_word": call.get("context"),
        "ready_before_word": call.get("ready"),
    }


def profiled_calls(task_id: str, library: str, warm_up: bool) -> None:
    """Child mode, run under Nsight Compute: call the candidate ``PROFILED_CALLS`` times, each
    profiled (after a trivial kernel of our own, profiled first, if ``warm_up``), and print the
    seconds of each."""
    import torch

    from ptxgym.device.gpus import make_context
    from ptxgym.evaluate.timing import seconds_into
    from ptxgym.evaluate.worker import Entry, allocate_outputs, make_inputs

    make_context(0)
    task = get_task(task_id)
    workload = task.workloads[0]
    axes = {**task.definition.const_axes, **workload.axes}
    seconds: dict[str, float] = {}

    def timed(name: str, launch: Callable[[], object]) -> None:
        torch.cuda.synchronize()  # earlier work (the inputs) is not the call's
        with seconds_into(seconds, name):
            torch.cuda.profiler.start()
            launch()
            torch.cuda.synchronize()
            torch.cuda.profiler.stop()

    if warm_up:
        ones = torch.ones(16, device="cuda")
        timed("warm_up", lambda: ones.add_(1))
    entry = Entry(library, task)
    inputs = make_inputs(task, workload.payload(), 1, False)
    outputs = allocate_outputs(task, axes)
    stream = torch.cuda.Stream()

    def launch() -> int:
        with torch.cuda.stream(stream):
            return entry(inputs, outputs, axes, stream.cuda_stream)

    for call in range(PROFILED_CALLS):
        timed(f"call{call}", launch)
    print(_SECONDS_MARK + json.dumps(seconds), flush=True)


def describe_calls(calls: Any) -> str:
    """One run's profiled calls as text (or why there are none)."""
    if not isinstance(calls, dict) or "error" in calls:
        return f"failed: {calls}"
    return ", ".join(f"{name} {seconds:.2f} s" for name, seconds in calls.items())


def first_kernel_cost(task_id: str, library: str, report: Path) -> dict[str, Any]:
    """The seconds of each profiled call in one Nsight Compute run, without and with a
    warm-up kernel first."""
    ncu = find_ncu()
    if ncu is None:
        return {"any": {"error": "Nsight Compute (ncu) was not found"}}
    runs: dict[str, Any] = {}
    for label in ("cold", "warm-up first"):
        command = [
            *(ncu, "--profile-from-start", "off", "--clock-control", "none"),
            *("--metrics", ",".join(PROFILE_METRICS), "--export", str(report)),
            *("--force-overwrite", sys.executable, __file__, "--profiled-calls", library),
            *("--task", task_id, *(["--warm-up"] if label != "cold" else [])),
        ]
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        lines = [line for line in done.stdout.splitlines() if line.startswith(_SECONDS_MARK)]
        runs[label] = (
            json.loads(lines[-1].removeprefix(_SECONDS_MARK))
            if lines
            else {"error": (done.stdout + done.stderr)[-1000:]}
        )
    return runs


def median(records: list[dict[str, Any]], key: str) -> float | None:
    values = [r[key] for r in records if r["ok"] and isinstance(r[key], int | float)]
    return statistics.median(values) if values else None


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, default=Path("benchmarks/out"))
    parser.add_argument("--task", default="PTX-H100-GEMM")
    parser.add_argument("--example", type=Path, default=Path("examples/expert/gemm.cu"))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--profiled-calls", metavar="LIBRARY", help=argparse.SUPPRESS)
    parser.add_argument("--warm-up", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.profiled_calls:  # the program profiled by first_kernel_cost
        profiled_calls(args.task, args.profiled_calls, args.warm_up)
        return
    task = get_task(args.task)
    if reason := incompatibility(task):
        raise SystemExit(f"cannot run here: {reason}")
    build = compile_source(args.example.read_text(), task)
    if not build.ok or build.library is None:
        raise SystemExit(f"the example did not compile:\n{build.log}")
    workload = task.workloads[0]
    job = CallJob(task, build.library, workload.payload(), host_inputs(task, workload.payload(), 1))
    gpus = visible_gpus()
    results: dict[str, Any] = {
        "date": datetime.date.today().isoformat(),
        "gpu": gpus[0].name if gpus else "unknown",
        "task": args.task,
        "example": str(args.example),
        "sets": {},
    }
    args.out.mkdir(parents=True, exist_ok=True)
    waiting = {
        name: [PendingProfile(device=0, metrics=metrics) for _ in range(args.repeats)]
        for name, metrics in METRIC_SETS.items()
    }
    time.sleep(CONTEXT_WAIT_S)
    for name in waiting:
        results["sets"][name] = {"metrics": METRIC_SETS[name], "runs": []}
    for turn in range(args.repeats):  # the sets take turns, so that none waits longer
        for name, runs in waiting.items():
            results["sets"][name]["runs"].append(record(runs[turn].finish(job)))
        (args.out / "profile_cost.json").write_text(json.dumps(results, indent=1))
    print(f"# Profile cost by metric set, {results['date']}, {results['gpu']}, {args.task}")
    print(f"example {args.example}, workload {workload.name}, median of {args.repeats} runs\n")
    columns = ("call", "load_and_inputs", "tail", "read", "seconds")
    print("| metric set | ok | qualified | " + " | ".join(columns) + " |")
    print("|---" * (len(columns) + 3) + "|")
    for name, entry in results["sets"].items():
        runs = entry["runs"]
        cells = []
        for column in columns:
            value = median(runs, column)
            cells.append("-" if value is None else f"{value:.2f}")
        qualified = sorted({str(r["qualified"]) for r in runs})
        ok = sum(r["ok"] for r in runs)
        print(f"| {name} | {ok}/{len(runs)} | {', '.join(qualified)} | " + " | ".join(cells) + " |")
    for entry in results["sets"].values():
        for run in entry["runs"]:
            if not run["ok"]:
                print(f"\nfailed run: {run['reason']}")
    results["first_kernel"] = first_kernel_cost(
        args.task, build.library, args.out / "first-kernel.ncu-rep"
    )
    (args.out / "profile_cost.json").write_text(json.dumps(results, indent=1))
    print("\nSeconds of each profiled call in one run (the judge's set):\n")
    for label, calls in results["first_kernel"].items():
        print(f"- {label}: {describe_calls(calls)}")


if __name__ == "__main__":
    main()
