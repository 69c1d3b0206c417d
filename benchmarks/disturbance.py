"""Does GPU work in other processes move a timing, with and without the GPU lock?

The GPU lock (``ptxgym.device.lock``) gives every timing its GPU alone; everything else of ours that
touches the GPU holds it shared, and CUDA start-ups hold the GPU's start-up lock, which a timing
holds alone unless it lets start-ups beside it (``JudgeSettings.startups_beside_iters``). This
benchmark is the evidence for that split: it times cuBLAS's GEMM on the GEMM task's workload with
the judge's protocol (``ptxgym.evaluate.timing.Timer``, fresh inputs for every call), holding the
GPU exclusively as the judge's timings do, first with nothing else running, then while
``--processes`` background processes repeat one activity in a loop (``--size`` and ``--protocol``
time a longer GEMM, or with the GPU tests' shorter protocol).

Without the lock (what the lock keeps out, and what a timing that lets start-ups beside it meets;
each a fresh Python process per loop):

- ``startup``: make a CUDA context (``ptxgym.device.gpus.make_context``) and exit;
- ``startup-ncu``: the same under Nsight Compute (``--profile-from-start off``);
- ``startup-memcheck``: the same under compute-sanitizer memcheck;
- ``startup-worker``: a worker's start-up: the context, then its timer with CUPTI's activity
  set up (``ptxgym.evaluate.timing.Timer``);
- ``startup-count``: a count run's start-up: the context, then CUPTI's SASS metrics set up
  (``ptxgym.evaluate.cupti_helper.SassCounter.prepare``).

(Profiling outside the lock is not among them: two processes profiling at once make the driver
refuse one, docs/benchmarks.md, ninth session.)

With the lock, as the judge runs them (``ptxgym.evaluate.profile.PendingProfile`` and
``ptxgym.evaluate.sanitizer.PendingSanitizer`` on the example kernel, start-up to exit: the context
made holding the GPU shared, the call holding it alone):

- ``profile-runs``: whole profile runs;
- ``memcheck-runs``: whole memcheck runs.

Each activity is measured twice, with a quiet measurement after it, in each of ``--rounds``
rounds over the activities. Reported: each latency and
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
import time
from pathlib import Path
from typing import Any

UNLOCKED = ("startup", "startup-ncu", "startup-memcheck", "startup-worker", "startup-count")
LOCKED = ("profile-runs", "memcheck-runs")
ACTIVITIES = UNLOCKED + LOCKED
# What a background process runs, once per loop, as its own Python program.
_STARTUP = "from ptxgym.device.gpus import make_context; make_context(0)"
_WORKER_STARTUP = _STARTUP + "; from ptxgym.evaluate.timing import Timer; Timer()"
_COUNT_STARTUP = (
    _STARTUP + "; from ptxgym.evaluate.cupti_helper import SassCounter; "
    "SassCounter({helper!r}).prepare(0)"
)


def unlocked_command(activity: str) -> list[str]:
    """The command a background process repeats for an activity of ``UNLOCKED``."""
    from ptxgym.evaluate.profile import find_ncu
    from ptxgym.evaluate.sanitizer import find_compute_sanitizer

    ncu, sanitizer = find_ncu(), find_compute_sanitizer()
    if activity == "startup-ncu" and ncu is None:
        raise SystemExit("Nsight Compute (ncu) was not found")
    if activity == "startup-memcheck" and sanitizer is None:
        raise SystemExit("compute-sanitizer was not found")
    python = [sys.executable, "-c"]
    if activity == "startup":
        return [*python, _STARTUP]
    if activity == "startup-worker":
        return [*python, _WORKER_STARTUP]
    if activity == "startup-count":
        from ptxgym.evaluate.cupti_helper import build_helper

        # Built here, once, not by the background processes racing for the cache.
        return [*python, _COUNT_STARTUP.format(helper=str(build_helper()))]
    if activity == "startup-ncu":
        return [str(ncu), "--profile-from-start", "off", *python, _STARTUP]
    return [str(sanitizer), "--tool", "memcheck", *python, _STARTUP]


def background(activity: str, argument: str, until: float) -> None:
    """Repeat ``activity`` until the clock passes ``until``: an unlocked one runs the command
    ``argument`` (JSON); a locked one runs the judge's tool run on the library ``argument``."""
    if activity in UNLOCKED:
        command = json.loads(argument)
        while time.time() < until:
            subprocess.run(command, capture_output=True, check=False)
        return
    from ptxgym.device.lock import shared_gpu
    from ptxgym.evaluate.profile import PendingProfile
    from ptxgym.evaluate.sanitizer import PendingSanitizer
    from ptxgym.evaluate.single_call import CallJob
    from ptxgym.evaluate.worker import host_inputs
    from ptxgym.tasks import get_task

    task = get_task("PTX-H100-GEMM")
    payload = task.workloads[0].payload()
    with shared_gpu(0):  # the inputs, as the judge makes them: never beside a timing
        job = CallJob(task, argument, payload, host_inputs(task, payload, 1))
    while time.time() < until:
        run = PendingProfile(device=0) if activity == "profile-runs" else PendingSanitizer(device=0)
        result = run.finish(job)
        if not result.ok:
            print(f"{activity}: {result.reason}", file=sys.stderr)


class Victim:
    """cuBLAS's GEMM on the GEMM task's first workload (or ``size``³), timed with the judge's
    protocol (or ``protocol``: warm-up calls, calls per trial, trials), holding the GPU alone."""

    def __init__(
        self, size: int | None = None, protocol: tuple[int, int, int] | None = None
    ) -> None:
        import torch

        from ptxgym.device.gpus import make_context
        from ptxgym.device.lock import startup_hold, startup_lock_path
        from ptxgym.evaluate.timing import Timer
        from ptxgym.evaluate.worker import make_inputs
        from ptxgym.tasks import get_task

        with startup_hold(startup_lock_path(0)):
            make_context(0)
            self.timer = Timer()
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

    def _prepare(self, index: int) -> None:
        self.torch.cuda.synchronize()
        self.inputs = self.make_inputs(self.task, self.workload, 1000 + index, False)

    def _call(self, index: int) -> None:
        self.torch.matmul(self.inputs["A"], self.inputs["B"].t(), out=self.out)

    def measure(self) -> dict[str, Any]:
        from ptxgym.device.lock import exclusive_gpu

        with exclusive_gpu(0) as waited:
            result = self.timer.measure(self._call, self._prepare, **self.protocol)
        return {
            "latency_ms": result.latency_ms,
            "trials_ms": list(result.trial_medians_ms),
            "gpu_wait_s": waited,
        }


def compile_example(example: Path) -> str:
    """The example kernel's library, for the locked activities' tool runs."""
    from ptxgym.languages.cuda.compiler import compile_source
    from ptxgym.tasks import get_task

    build = compile_source(example.read_text(), get_task("PTX-H100-GEMM"))
    if not build.ok or build.library is None:
        raise SystemExit(f"the example did not compile:\n{build.log}")
    return build.library


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, default=Path("benchmarks/out"))
    parser.add_argument("--processes", type=int, default=8, help="background processes")
    parser.add_argument("--seconds", type=float, default=20.0, help="per activity")
    parser.add_argument("--activities", nargs="+", choices=ACTIVITIES, default=list(ACTIVITIES))
    parser.add_argument("--example", type=Path, default=Path("examples/expert/gemm.cu"))
    parser.add_argument("--size", type=int, help="time an M = N = K GEMM of this size instead")
    parser.add_argument(
        "--protocol",
        type=int,
        nargs=3,
        metavar=("WARMUP", "ITERS", "TRIALS"),
        help="instead of the judge's (the GPU tests use 2 5 3)",
    )
    parser.add_argument(
        "--rounds", type=int, default=1, help="rounds over the activities (each: 2 measured)"
    )
    args = parser.parse_args()
    if args.rounds < 1 or args.processes < 1 or args.seconds <= 0:
        parser.error("--rounds and --processes must be at least 1, --seconds above 0")
    args.out.mkdir(parents=True, exist_ok=True)
    victim = Victim(args.size, args.protocol)
    library = compile_example(args.example) if set(args.activities) & set(LOCKED) else ""
    # Each activity's background argument, made once (tools looked up, the CUPTI helper built)
    # before anything is measured.
    arguments = {
        activity: json.dumps(unlocked_command(activity)) if activity in UNLOCKED else library
        for activity in args.activities
    }
    results: dict[str, Any] = {
        "date": datetime.date.today().isoformat(),
        "gpu": victim.torch.cuda.get_device_name(0),
        "processes": args.processes,
        "gemm": victim.workload["axes"],
        "protocol": victim.protocol or "the judge's",
        "runs": [{"during": "nothing", **victim.measure()}],
    }
    for activity in args.activities * args.rounds:
        until = time.time() + args.seconds
        command = [sys.executable, __file__, "--background", activity, arguments[activity]]
        workers = [subprocess.Popen([*command, str(until)]) for _ in range(args.processes)]
        time.sleep(min(8.0, args.seconds / 3))  # the loops are going
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
        f"cuBLAS GEMM {results['gemm']}, protocol {results['protocol']}, holding the GPU alone; "
        f"{results['processes']} background processes per activity\n"
    )
    print("| during | GPU lock | latency ms | vs quiet mean | waited for the GPU s |")
    print("|---|---|---|---|---|")
    for run in results["runs"]:
        deviation = run["latency_ms"] / mean - 1
        lock = (
            "shared" if run["during"] in LOCKED else "-" if run["during"] == "nothing" else "none"
        )
        print(
            f"| {run['during']} | {lock} | {run['latency_ms']:.4f} | {deviation:+.2%} "
            f"| {run['gpu_wait_s']:.2f} |"
        )
    print(f"\nQuiet measurements: {len(quiet)}, spread (max − min) / mean {spread:.2%}")


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "--background":
        background(sys.argv[2], sys.argv[3], float(sys.argv[4]))
    else:
        main()
