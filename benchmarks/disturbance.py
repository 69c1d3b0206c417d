"""Does GPU-side work that holds no GPU lock move a timing?

The GPU lock (``ptxgym.gpu_lock``) keeps timings apart from every stage that runs a candidate or
a library; a process's start-up holds no lock. This benchmark is the evidence for such choices:
it times cuBLAS's GEMM on the GEMM task's workload with the judge's protocol
(``ptxgym.timing.Timer``, fresh inputs for every call) in this process, first with nothing else
running, then while ``--processes`` background processes repeat one activity in a loop
(``--size`` and ``--protocol`` time a longer GEMM, or with the GPU tests' shorter protocol):

- ``startup``: make a CUDA context (``ptxgym.gpus.make_context``), as workers and tool runs do;
- ``startup-ncu``: the same under Nsight Compute (``--profile-from-start off``);
- ``startup-memcheck``: the same under compute-sanitizer memcheck;
- ``profiler-warm-up``: under Nsight Compute with the judge's metrics, profile one trivial
  kernel. Nsight Compute's first profiled kernel in a process costs about a second, later ones a
  tenth of that (docs/benchmarks.md, sixth session); a profile run could pay it ahead of its
  word, if that does not move timings.

Each activity is measured twice, with a quiet measurement after it. Reported: each latency and
its deviation from the mean of the quiet ones, and the quiet ones' own spread. Run on a GPU host:
``python benchmarks/disturbance.py --out DIR``. Prints markdown; writes OUT/disturbance.json.
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ACTIVITIES = ("startup", "startup-ncu", "startup-memcheck", "profiler-warm-up")
# What a background process runs, once per loop, as its own Python program.
_STARTUP = "from ptxgym.gpus import make_context; make_context(0)"
_WARM_UP = (
    "import torch; from ptxgym.gpus import make_context; make_context(0); "
    "x = torch.ones(16, device='cuda'); torch.cuda.profiler.start(); x.add_(1); "
    "torch.cuda.synchronize(); torch.cuda.profiler.stop()"
)


def activity_command(activity: str, report: Path) -> list[str]:
    """The command a background process repeats for ``activity``."""
    from ptxgym.profile import PROFILE_METRICS, find_ncu
    from ptxgym.sanitizer import find_compute_sanitizer

    ncu, sanitizer = find_ncu(), find_compute_sanitizer()
    if activity in ("startup-ncu", "profiler-warm-up") and ncu is None:
        raise SystemExit("Nsight Compute (ncu) was not found")
    if activity == "startup-memcheck" and sanitizer is None:
        raise SystemExit("compute-sanitizer was not found")
    python = [sys.executable, "-c"]
    if activity == "startup":
        return [*python, _STARTUP]
    if activity == "startup-ncu":
        return [str(ncu), "--profile-from-start", "off", *python, _STARTUP]
    if activity == "startup-memcheck":
        return [str(sanitizer), "--tool", "memcheck", *python, _STARTUP]
    return [
        *(str(ncu), "--profile-from-start", "off", "--clock-control", "none"),
        *("--metrics", ",".join(PROFILE_METRICS), "--export", str(report), "--force-overwrite"),
        *python,
        _WARM_UP,
    ]


def background(command: list[str], until: float) -> None:
    """Run ``command`` again and again until the clock passes ``until``."""
    while time.time() < until:
        subprocess.run(command, capture_output=True, check=False)


class Victim:
    """cuBLAS's GEMM on the GEMM task's first workload (or ``size``³), timed with the judge's
    protocol (or ``protocol``: warm-up calls, calls per trial, trials)."""

    def __init__(
        self, size: int | None = None, protocol: tuple[int, int, int] | None = None
    ) -> None:
        import torch

        from ptxgym.gpus import make_context
        from ptxgym.tasks import get_task
        from ptxgym.timing import Timer
        from ptxgym.worker import make_inputs

        make_context(0)
        self.torch = torch
        self.task = get_task("PTX-H100-GEMM")
        workload = self.task.workloads[0]
        axes = dict.fromkeys(("M", "N", "K"), size) if size else dict(workload.axes)
        self.workload = {"axes": axes, "sequences": workload.sequences}
        self.make_inputs = make_inputs
        self.protocol = (
            dict(zip(("warmup", "iters", "trials"), protocol, strict=True)) if protocol else {}
        )
        self.out = torch.empty((axes["M"], axes["N"]), dtype=torch.bfloat16, device="cuda")
        self.inputs: dict[str, Any] = {}
        self.timer = Timer()

    def _prepare(self, index: int) -> None:
        self.torch.cuda.synchronize()
        self.inputs = self.make_inputs(self.task, self.workload, 1000 + index, False)

    def _call(self, index: int) -> None:
        self.torch.matmul(self.inputs["A"], self.inputs["B"].t(), out=self.out)

    def measure(self) -> dict[str, Any]:
        result = self.timer.measure(self._call, self._prepare, **self.protocol)
        return {"latency_ms": result.latency_ms, "trials_ms": list(result.trial_medians_ms)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, default=Path("benchmarks/out"))
    parser.add_argument("--processes", type=int, default=8, help="background processes")
    parser.add_argument("--seconds", type=float, default=20.0, help="per activity")
    parser.add_argument("--activities", nargs="+", choices=ACTIVITIES, default=list(ACTIVITIES))
    parser.add_argument("--size", type=int, help="time an M = N = K GEMM of this size instead")
    parser.add_argument(
        "--protocol",
        type=int,
        nargs=3,
        metavar=("WARMUP", "ITERS", "TRIALS"),
        help="instead of the judge's (the GPU tests use 2 5 3)",
    )
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    victim = Victim(args.size, args.protocol)
    results: dict[str, Any] = {
        "date": datetime.date.today().isoformat(),
        "gpu": victim.torch.cuda.get_device_name(0),
        "processes": args.processes,
        "gemm": victim.workload["axes"],
        "protocol": victim.protocol or "the judge's",
        "runs": [{"during": "nothing", **victim.measure()}],
    }
    folder = Path(tempfile.mkdtemp(prefix="ptxgym-disturbance-"))
    for activity in args.activities:
        until = time.time() + args.seconds
        workers = [
            subprocess.Popen(
                [
                    sys.executable,
                    __file__,
                    "--background",
                    json.dumps(activity_command(activity, folder / f"{activity}-{i}")),
                    str(until),
                ]
            )
            for i in range(args.processes)
        ]
        time.sleep(min(5.0, args.seconds / 4))  # the loops are going
        for _ in range(2):
            results["runs"].append({"during": activity, **victim.measure()})
        for worker in workers:
            worker.wait()
        results["runs"].append({"during": "nothing", **victim.measure()})
        (args.out / "disturbance.json").write_text(json.dumps(results, indent=1))
    report(results)


def report(results: dict[str, Any]) -> None:
    quiet = [run["latency_ms"] for run in results["runs"] if run["during"] == "nothing"]
    mean = statistics.fmean(quiet)
    spread = (max(quiet) - min(quiet)) / mean
    print(f"# Timing disturbance, {results['date']}, {results['gpu']}")
    print(
        f"cuBLAS GEMM {results['gemm']}, protocol {results['protocol']}; "
        f"{results['processes']} background processes per activity\n"
    )
    print("| during | latency ms | vs quiet mean |")
    print("|---|---|---|")
    for run in results["runs"]:
        deviation = run["latency_ms"] / mean - 1
        print(f"| {run['during']} | {run['latency_ms']:.4f} | {deviation:+.2%} |")
    print(f"\nQuiet measurements: {len(quiet)}, spread (max − min) / mean {spread:.2%}")


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--background":
        background(json.loads(sys.argv[2]), float(sys.argv[3]))
    else:
        main()
