"""Where an evaluation's CPU time goes, by the kind of process that spends it.

At 16 trajectories the H200 host's 16 CPU cores, not the GPU, bounded throughput: an evaluation
cost about 30-45 CPU-seconds (docs/benchmarks.md, ninth session). This benchmark measures, one
at a time and otherwise idle, the CPU seconds (user + system, as the kernel accounts them for
this process and its descendants) of:

- ``import torch``: a new Python process that imports torch and ends (every worker and tool
  run does it), and whether torch's compiled bytecode is on disk beside it (without it, every
  import compiles torch's Python again);
- ``compile``: nvcc on the example, into an empty build cache;
- ``memcheck run`` and ``profile run``: one tool run of the judge's, from its start-up to its
  end, with the example's call (the profile run's report reader included);
- ``evaluation, tools off``: an evaluation in a judge of this process with memcheck and the
  profile off: the worker's start-up (forked from a process that has imported torch,
  ``JudgeSettings.fork_workers``), and the judge's own part of correctness and timing; then
  the same with workers started afresh;
- ``evaluation, every stage on``: the same with the judge's default settings.

The evaluations are ``--evaluations`` in a row after one that builds the workload state; the
judge keeps one spare worker (and one spare run per tool) started ahead, so each evaluation
pays for one of each, started during it. Run on a GPU host: ``python benchmarks/cpu_cost.py
--out DIR``. Prints markdown for docs/benchmarks.md and writes OUT/cpu_cost.json.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import functools
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ptxgym.device.gpus import visible_gpus
from ptxgym.evaluate.judge import Judge
from ptxgym.evaluate.judge_settings import JudgeSettings
from ptxgym.evaluate.local_gpu import incompatibility
from ptxgym.evaluate.profile import PendingProfile
from ptxgym.evaluate.sanitizer import PendingSanitizer
from ptxgym.evaluate.single_call import CallJob
from ptxgym.evaluate.worker import host_inputs
from ptxgym.languages.cuda.compiler import compile_source
from ptxgym.outcome import Status
from ptxgym.sandbox.processes import stat_fields
from ptxgym.tasks import Task, get_task


def cpu_seconds() -> float:
    """User and system CPU seconds so far of this process and its descendants: its own, its
    reaped children's (with their reaped children's), and each live child's own and reaped
    children's. The last matters for workers forked by a forkserver: their parent is the
    forkserver, a live child of this process, which reaps them. Not counted: grandchildren
    still alive (a spare worker under the forkserver, the program a running tool started),
    and a child reaped between the two readings; where the kernel has no
    ``/proc/PID/task/TID/children``, live children add nothing."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    reaped = resource.getrusage(resource.RUSAGE_CHILDREN)
    total = own.ru_utime + own.ru_stime + reaped.ru_utime + reaped.ru_stime
    ticks = os.sysconf("SC_CLK_TCK")
    for children in Path("/proc/self/task").glob("*/children"):
        for pid in children.read_text().split():
            try:
                fields = stat_fields(Path(f"/proc/{pid}/stat"))
            except (OSError, IndexError):
                continue  # ended meanwhile
            # utime, stime, cutime, cstime: fields 14 to 17 of proc(5)
            total += sum(int(value) for value in fields[11:15]) / ticks
    return total


def measured(work: Callable[[], object], times: int = 1) -> dict[str, float]:
    """CPU and wall seconds of ``work`` per repetition, over ``times`` repetitions."""
    cpu, wall = cpu_seconds(), time.perf_counter()
    for _ in range(times):
        work()
    return {
        "cpu_s": (cpu_seconds() - cpu) / times,
        "wall_s": (time.perf_counter() - wall) / times,
    }


def torch_bytecode_cached() -> bool:
    """Whether torch's package has its compiled bytecode on disk (checked on its __init__)."""
    import importlib.util

    spec = importlib.util.find_spec("torch")
    if spec is None or spec.origin is None:
        return False
    return Path(importlib.util.cache_from_source(spec.origin)).is_file()


def checked_evaluation(judge: Judge, task: Task, library: str, label: str) -> None:
    """One evaluation, which must pass (and qualify, where the profile is on)."""
    verdict = judge.evaluate(task, library)
    if verdict.status is not Status.PASSED:
        raise SystemExit(f"{label}: {verdict.status.value}: {verdict.message}")
    if judge.settings.profile and (verdict.profile is None or not verdict.profile.qualified):
        raise SystemExit(f"{label}: the profile did not qualify the example")


def tool_and_evaluation_rows(task: Task, library: str, evaluations: int) -> dict[str, Any]:
    """The rows of the tool runs and the evaluations; stops at the first that did not work (a
    failed run costs less than one that did, so its seconds would mislead)."""
    payload = task.workloads[0].payload()
    job = CallJob(task, library, payload, host_inputs(task, payload, 1))
    rows: dict[str, Any] = {}

    def memcheck_run() -> None:
        report = PendingSanitizer(device=0).finish(job)
        if not report.ok:
            raise SystemExit(f"the memcheck run failed: {report.reason}")

    def profile_run() -> None:
        profile = PendingProfile(device=0).finish(job)
        if not profile.ok or not profile.qualified:
            raise SystemExit(f"the profile run failed or did not qualify: {profile.reason}")

    rows["memcheck run"] = measured(memcheck_run)
    rows["profile run"] = measured(profile_run)
    tools_off = JudgeSettings(memcheck=False, profile=False)
    spawned = dataclasses.replace(tools_off, fork_workers=False)
    for label, settings in (
        ("evaluation, tools off", tools_off),
        ("evaluation, tools off, workers spawned", spawned),
        ("evaluation, every stage on", JudgeSettings()),
    ):
        judge = Judge(0, dataclasses.replace(settings, spare_workers=1))
        evaluation = functools.partial(checked_evaluation, judge, task, library, label)
        try:
            evaluation()  # builds the workload state, starts the spares
            rows[label] = measured(evaluation, evaluations)
        finally:
            judge.close()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, default=Path("benchmarks/out"))
    parser.add_argument("--task", default="PTX-H100-GEMM")
    parser.add_argument("--example", type=Path, default=Path("examples/expert/gemm.cu"))
    parser.add_argument("--evaluations", type=int, default=3)
    args = parser.parse_args()
    task = get_task(args.task)
    if reason := incompatibility(task):
        raise SystemExit(f"cannot run here: {reason}")
    source = args.example.read_text()
    rows: dict[str, dict[str, float]] = {}
    rows["import torch"] = measured(
        lambda: subprocess.run([sys.executable, "-c", "import torch"], check=True)
    )

    # The build cache lives as long as the runs that load its library.
    with tempfile.TemporaryDirectory(prefix="ptxgym-cpu-cost-") as cache:
        builds = []
        rows["compile"] = measured(
            lambda: builds.append(compile_source(source, task, cache_root=Path(cache)))
        )
        build = builds[0]
        if not build.ok or build.library is None:
            raise SystemExit(f"the example did not compile:\n{build.log}")
        rows.update(tool_and_evaluation_rows(task, build.library, args.evaluations))

    gpus = visible_gpus()
    results: dict[str, Any] = {
        "date": datetime.date.today().isoformat(),
        "gpu": gpus[0].name if gpus else "unknown",
        "cores": os.cpu_count(),
        "task": args.task,
        "example": str(args.example),
        "torch_bytecode_cached": torch_bytecode_cached(),
        "rows": rows,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "cpu_cost.json").write_text(json.dumps(results, indent=1))
    print(f"# CPU cost by process kind, {results['date']}, {results['gpu']}, {args.task}")
    print(
        f"example {args.example}; {results['cores']} cores; one at a time, otherwise idle; "
        f"torch's bytecode cached on disk: {results['torch_bytecode_cached']}\n"
    )
    print("| what | CPU s | wall s |")
    print("|---|---|---|")
    for label, row in rows.items():
        print(f"| {label} | {row['cpu_s']:.2f} | {row['wall_s']:.2f} |")


if __name__ == "__main__":
    main()
