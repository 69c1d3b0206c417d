"""Evaluation at training speed: throughput, step latency by stage, workload reuse, GPU efficiency.

Run on a GPU host: ``python benchmarks/throughput.py --out DIR`` (scripts/gpu_host.sh bench runs
it). Every step submits a distinct source (the example kernel plus a comment naming the
trajectory and step), so every step really compiles, as in RL training. Measured:

- evaluations per hour at each concurrency (trajectories stepping at once, one env each, all
  sharing one GPU evaluator; ``--level-evaluations`` evaluations per level), with p50 step
  latency, the p50 of each stage, the GPU held alone (per evaluation: its median, and the mean
  of each stage that holds it; and as a share of the level's wall time: the bound concurrency
  cannot raise), and the machine's busy CPU cores; beside the level's whole wall, the steady
  rate (the first and last round of steps left out: the start's compile burst and the end's
  stragglers, as over a training run of hours);
- whether the measured speedups move with concurrency (they must not: timings take turns);
- workload reuse, for each task of ``--reuse`` with a kernel that solves it: the same sequential
  steps with the judge rebuilding each workload's inputs, references and baseline for every
  request (``JudgeSettings(reuse_state=False)``);
- GPU efficiency: the time the protocol's own kernel runs need (candidate latency × its calls)
  over the GPU wall time per evaluation at the highest concurrency;
- the targets (docs/benchmarks.md), each said met or not: evaluations per hour at the most
  trajectories, that rate against one trajectory's in the same run, the median speedups of the
  two levels within ±2 % of each other, and the cached step's p50.

Prints markdown for docs/benchmarks.md and writes OUT/throughput.json; each step's end goes to
stderr as it happens, so a run cut short still shows how far it got.
"""

from __future__ import annotations

import argparse
import collections
import datetime
import json
import math
import os
import secrets
import statistics
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from ptxgym.device.lock import lock_path
from ptxgym.device.occupancy import OccupancySampler
from ptxgym.env import PTXKernelEnv
from ptxgym.evaluate.evaluator import Evaluator
from ptxgym.evaluate.judge_settings import JudgeSettings
from ptxgym.evaluate.local_gpu import LocalGPUEvaluator
from ptxgym.evaluate.single_call import CALL_SECONDS_KEYS, JUDGE_SIDE_KEYS
from ptxgym.evaluate.timing import TIMING_PHASES, TRIALS
from ptxgym.tasks import get_task

STAGES = (
    "compile",
    "queued",
    "judged",
    "state",
    "worker_start",
    "checks_gpu_wait",
    "correctness",
    "correctness_compare",
    "checks_gpu",
    "gpu_wait",
    "timing",
    "worker_gpu",
    "spares_start",
    "tools_wait",
    "arena_pin",
    "memcheck",
    "profile",
    "profile_read",
)


# The parts of a step that are not the env's own work: the build, the judge's queue, the judge.
OUTSIDE_THE_ENV = ("compile", "queued", "judged")
# Written into every distinct step's source: the build cache outlives a run, so without it a
# second run on the same host would find the first one's builds and time no compiling.
RUN_TAG = secrets.token_hex(4)
# The targets a run is held to (docs/benchmarks.md): evaluations per hour at the most
# trajectories, and that rate over one trajectory's; the median speedup at the most trajectories
# within this share of one trajectory's (timings take turns, so concurrency must not move them);
# the p50 of a step whose build is cached, in seconds.
TARGET_PER_HOUR = 2000.0
TARGET_SCALING = 2.5
TARGET_SPEEDUP_AGREEMENT = 0.02
TARGET_CACHED_P50_S = 2.0


def trajectory(
    evaluator: Evaluator,
    task_id: str,
    source: str,
    label: str,
    steps: int,
    distinct: bool = True,
) -> list[dict[str, Any]]:
    """One env stepping ``steps`` sources, distinct (each compiles) or all the same (the build
    cache answers after the first); the per-step record of each."""
    env = PTXKernelEnv(task_id, turns=max(steps, 1), evaluator=evaluator)
    env.reset(seed=0)
    records = []
    for step in range(steps):
        started = time.perf_counter()
        step_source = f"{source}\n// run {RUN_TAG}, {label} step {step}\n" if distinct else source
        info = env.step(step_source)[4]
        outcome = info["outcome"]
        records.append(
            {
                "status": info["status"],
                "step_s": time.perf_counter() - started,
                "speedup": outcome["speedup"],
                "latency_ms": outcome["latency_ms"],
                "qualified": outcome["qualified"],
                # Whether the build cache answered (a distinct step's never should).
                "cached_build": bool((outcome["compile"] or {}).get("cached")),
                # Why the profile is unknown, when it is (a load-dependent failure shows here).
                "profile_reason": (outcome["profile"] or {}).get("reason", ""),
                "profile_method": (outcome["profile"] or {}).get("method", ""),
                # What counted the instructions, with the judge's note where it fell back.
                "counted_by": counted_by(outcome["profile"]),
                "stages": outcome["stage_seconds"],
                # The step's seconds outside the build and the judge (its queue included):
                # the env's own work (reward, feedback, records).
                "outside_judge_s": time.perf_counter()
                - started
                - sum(outcome["stage_seconds"].get(s, 0.0) for s in OUTSIDE_THE_ENV),
                "in_judge_s": outcome["stage_seconds"].get("judged", 0.0),
                "ended_at": time.perf_counter(),
            }
        )
        # As each step ends, so that a run cut short still shows how far it got and how.
        # A failure of the expert kernel is the judge's or the load's doing: say what it was.
        why = f" ({outcome['message'][:400]})" if info["status"] != "PASSED" else ""
        retried = " (judged again alone)" if "shared_attempt" in outcome["stage_seconds"] else ""
        counted = records[-1]["counted_by"][:400]
        print(
            f"{label} step {step}: {info['status']} in {records[-1]['step_s']:.1f} s, "
            f"GPU alone {exclusive_s(records[-1]):.2f} s, counted by {counted}{retried}{why}",
            file=sys.stderr,
            flush=True,
        )
    env.close()
    return records


def counted_by(profile: dict[str, Any] | None) -> str:
    """What counted a step's instructions (its outcome's ``profile``), with the judge's note
    where that is not the method asked for (it fell back)."""
    parts = (profile.get("method", ""), profile.get("note", "")) if profile else ()
    return ": ".join(filter(None, parts)) or "not profiled"


# Where each tool run's seconds went (ptxgym.evaluate.single_call.call_seconds), and the timing's
# (ptxgym.evaluate.timing.TimingResult.phase_seconds).
TOOL_CALL_STAGES = tuple(
    f"{tool}_{part}"
    for tool in ("memcheck", "profile")
    for part in CALL_SECONDS_KEYS + JUDGE_SIDE_KEYS
) + tuple(f"timing_{phase}" for phase in TIMING_PHASES)


# The stages during which an evaluation may hold the GPU alone (ptxgym.device.lock): one GPU can
# do at most 3600 / (their sum) evaluations per hour, whatever the concurrency. The worker holds
# it alone for its timing (its checks share it), as does a Nsight Compute profile for its call;
# the sanitizers' calls and a CUPTI count share it.
EXCLUSIVE_STAGES = ("worker_gpu", "profile_gpu")


def exclusive_s(record: dict[str, Any]) -> float:
    """Seconds one evaluation held the GPU alone."""
    stages: dict[str, float] = record["stages"]
    return stages.get("worker_gpu", 0.0) + (
        stages.get("profile_gpu", 0.0) if record["profile_method"] == "ncu" else 0.0
    )


def p50_latency(records: list[dict[str, Any]]) -> dict[str, Any]:
    """The median step and the median of each stage over ``records``."""
    return {
        "p50_step_s": statistics.median(r["step_s"] for r in records),
        # Means, not medians: evaluations per hour = judge concurrency / mean seconds in the
        # judge, when its queue is never empty.
        "mean_in_judge_s": statistics.fmean(r["in_judge_s"] for r in records),
        "mean_outside_judge_s": statistics.fmean(r["outside_judge_s"] for r in records),
        "p50_stage_s": {
            stage: statistics.median(r["stages"].get(stage, 0.0) for r in records)
            for stage in STAGES + TOOL_CALL_STAGES
        },
    }


def busy_cpu_seconds() -> float:
    """The machine's busy CPU seconds so far, all cores: the first line of /proc/stat (in clock
    ticks) less idle and iowait, its fourth and fifth fields."""
    fields = [int(value) for value in Path("/proc/stat").read_text().split("\n")[0].split()[1:]]
    return (sum(fields) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


# What a process is: first by its command name (a tool's own arguments name our folders too),
# then by what its command line runs.
_KINDS_BY_COMMAND = {
    "ncu": "Nsight Compute",
    "compute-sanitiz": "compute-sanitizer",
    "cuobjdump": "SASS listing",
    "nvdisasm": "SASS listing",
}
_TOOLCHAIN = {"nvcc", "cicc", "ptxas", "cudafe++", "fatbinary", "nvlink", "cc1plus", "gcc", "g++"}
_KINDS_BY_ARGUMENTS = (
    (("ptxgym.evaluate.single_call", "/ptxgym-memcheck-"), "memcheck run (Python)"),
    (("ptxgym.evaluate.single_call", "/ptxgym-racecheck-"), "racecheck run (Python)"),
    (("ptxgym.evaluate.single_call", "/ptxgym-profile-"), "profile run (Python)"),
    (("ptxgym.evaluate.single_call", "/ptxgym-count-"), "count run (Python)"),
    (("ptxgym.evaluate.judge_server",), "judge (its server process)"),
    (("ptxgym.evaluate.profile", " read "), "profile report reader"),
    (("multiprocessing.forkserver",), "worker (or its forkserver)"),
    (("multiprocessing.spawn",), "worker (or its forkserver)"),
)


def process_kind(pid: int, command: str) -> str:
    """What process ``pid`` (command name ``command``) is, for ``CpuByProcessKind``."""
    if pid == os.getpid():
        return "the benchmark's process (envs, builds' clients)"
    if command in _KINDS_BY_COMMAND:
        return _KINDS_BY_COMMAND[command]
    if command in _TOOLCHAIN or command.startswith(("ld", "collect2", "as")):
        return "compiler toolchain"
    try:
        arguments = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        arguments = ""
    for markers, kind in _KINDS_BY_ARGUMENTS:
        if all(marker in arguments for marker in markers):
            return kind
    return f"other: {command}"


class CpuByProcessKind:
    """The CPU seconds (user + system) that the machine's processes spent over a level, by kind
    of process, sampled from /proc every ``interval_s``. A process is classified when first
    seen, and again when it runs another program (its command line is gone once it ends). It
    counts from its first sample (less what it had spent when the level began) to its last, so
    the ends of processes, and processes that begin and end between samples, are missed:
    ``unsampled`` is the machine's busy total less the sum."""

    def __init__(self, interval_s: float = 0.25) -> None:
        self.interval_s = interval_s
        self._ticks = os.sysconf("SC_CLK_TCK")
        self._kinds: dict[int, str] = {}
        self._commands: dict[int, str] = {}
        self._start = self._sample()
        self._last: dict[int, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _sample(self) -> dict[int, float]:
        """CPU seconds of each live process, each classified on first sight."""
        seen = {}
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                text = stat.read_text()
                fields = text.rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
            pid = int(stat.parent.name)
            command = text[text.index("(") + 1 : text.rindex(")")]
            if self._commands.get(pid) != command:  # new, or a program run since (exec)
                self._commands[pid] = command
                self._kinds[pid] = process_kind(pid, command)
            cpu_ticks = int(fields[11]) + int(fields[12])  # utime, stime: fields 14, 15
            seen[pid] = cpu_ticks / self._ticks
        return seen

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._last.update(self._sample())

    def stop(self, busy_s: float) -> dict[str, float]:
        """End the sampling; CPU seconds by kind (those of at least 0.05 s), the largest
        first, with ``unsampled``."""
        self._stop.set()
        self._thread.join()
        self._last.update(self._sample())
        by_kind: collections.defaultdict[str, float] = collections.defaultdict(float)
        for pid, seconds in self._last.items():
            spent = seconds - self._start.get(pid, 0.0)
            if spent > 0:
                by_kind[self._kinds[pid]] += spent
        largest_first = sorted(by_kind.items(), key=lambda item: item[1], reverse=True)
        kinds = {kind: cpu for kind, cpu in largest_first if cpu >= 0.05}
        return {**kinds, "unsampled": busy_s - sum(by_kind.values())}


def kind_of_pid(pid: int) -> str:
    """``process_kind`` of a live process known only by its id (a holder of the GPU lock)."""
    try:
        command = Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return "a process gone before it was named"
    return process_kind(pid, command)


def steady_rate(ends_s: list[float], trajectories: int) -> dict[str, float] | None:
    """Evaluations per hour with the first and the last round of steps left out: from the
    ``trajectories``-th step's end to the end of the step ``trajectories`` before the last.

    The level's whole wall also holds its start, when every trajectory compiles at once with the
    GPU idle, and its end, when fewer trajectories are left; a training run of hours is the
    middle. Counted by steps, not per trajectory, since the judge does not serve trajectories
    in turn (one may finish all its steps before another's first ends). None when the middle is
    empty (fewer than two rounds and one step)."""
    ends = sorted(ends_s)
    first, last = trajectories - 1, len(ends) - 1 - trajectories
    if first < 0 or last <= first or ends[last] <= ends[first]:
        return None
    return {
        "per_hour": (last - first) / (ends[last] - ends[first]) * 3600,
        "evaluations": last - first,
        "window_s": ends[last] - ends[first],
    }


def run_level(
    evaluator: LocalGPUEvaluator, task_id: str, source: str, trajectories: int, steps: int
) -> dict[str, Any]:
    busy_before = busy_cpu_seconds()
    sampler = CpuByProcessKind()
    lock_occupancy = OccupancySampler(lock_path(evaluator.device), kind_of_pid)
    started = time.perf_counter()
    try:
        with ThreadPoolExecutor(max_workers=trajectories) as pool:
            futures = [
                # Labels distinct across levels too: a source another level built would find
                # its build cached, and that trajectory would step faster than training does.
                pool.submit(
                    trajectory, evaluator, task_id, source, f"{trajectories}:t{index}", steps
                )
                for index in range(trajectories)
            ]
            records = [record for future in futures for record in future.result()]
    finally:
        wall = time.perf_counter() - started
        busy = busy_cpu_seconds() - busy_before
        cpu_by_kind = sampler.stop(busy)
        occupancy = lock_occupancy.stop()
    speedups = [r["speedup"] for r in records if r["speedup"]]
    ends_s = sorted(r["ended_at"] - started for r in records)
    exclusive = [exclusive_s(r) for r in records]
    mean_exclusive = statistics.fmean(exclusive)
    return {
        "trajectories": trajectories,
        "evaluations": len(records),
        "wall_s": wall,
        "per_hour": len(records) / wall * 3600,
        # The GPU held alone, per evaluation and as a share of the level's wall time: at 100 %
        # the level is at the bound that concurrency cannot raise.
        "p50_exclusive_s": statistics.median(exclusive),
        # The mean of each stage that holds the GPU alone: their sum times the evaluations is
        # the level's time held alone, which a tail (a stage that waits while holding it) can
        # raise well above the median.
        "mean_exclusive_stage_s": {
            stage: statistics.fmean(r["stages"].get(stage, 0.0) for r in records)
            for stage in EXCLUSIVE_STAGES
        },
        "exclusive_share": sum(exclusive) / wall,
        # What the GPU lock did over the level (ptxgym.device.occupancy): the share of its time
        # in each state, and per evaluation how long a waiting timing waited on shared holders,
        # by what held it. Throughput is bounded by the time alone plus that wait.
        "lock_shares": occupancy.shares(),
        "lock_samples": occupancy.samples,
        "timing_waited_on_s": {
            kind: seconds / len(records)
            for kind, seconds in sorted(
                occupancy.waited_on.items(), key=lambda item: item[1], reverse=True
            )
        },
        "steady": steady_rate(ends_s, trajectories),
        # When each step ended, from the level's start: the steady rate, recomputable.
        "step_ends_s": ends_s,
        # What the level could do at most, the GPU held alone all the time at its mean hold
        # per evaluation: concurrency cannot go past it, only the hold's length can.
        # None when no evaluation held it (every step failed before the GPU).
        "ceiling_per_hour": 3600 / mean_exclusive if mean_exclusive > 0 else None,
        # The machine's busy cores over the level, beside the cores this process may use: near
        # all of them, the stages that hold the GPU alone also wait for a CPU.
        "busy_cores": busy / wall,
        # Where the busy CPU seconds went, per evaluation, by kind of process.
        "cpu_s_per_evaluation": {kind: cpu / len(records) for kind, cpu in cpu_by_kind.items()},
        "cores": len(os.sched_getaffinity(0)),
        "statuses": sorted({r["status"] for r in records}),
        **p50_latency(records),
        "median_speedup": statistics.median(speedups) if speedups else None,
        # The speedups' standard deviation over their mean: does concurrency add noise?
        "speedup_spread": (
            statistics.stdev(speedups) / statistics.fmean(speedups) if len(speedups) > 1 else 0.0
        ),
        "speedups": speedups,
        # Each evaluation's stage seconds, for what the medians above cannot tell (which
        # stages grow together, where a tail comes from).
        "stage_seconds": [r["stages"] for r in records],
        "latency_ms": statistics.median(r["latency_ms"] for r in records if r["latency_ms"]),
        "qualified": sorted({str(r["qualified"]) for r in records}),
        "unknown_profiles": dict(
            collections.Counter(
                r["profile_reason"][:300] or "not profiled"
                for r in records
                if r["qualified"] is None
            )
        ),
        "profile_methods": dict(collections.Counter(r["counted_by"] for r in records)),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, default=Path("benchmarks/out"))
    parser.add_argument("--task", default="PTX-H100-GEMM")
    parser.add_argument("--example", type=Path, default=Path("examples/expert/gemm.cu"))
    parser.add_argument(
        "--concurrency",
        type=int,
        nargs="*",
        default=[1, 4, 16, 48],
        help="trajectories at once, one level each; none: measure step latency and reuse only",
    )
    parser.add_argument(
        "--cached-steps", type=int, default=3, help="steps of the same source (0: none)"
    )
    parser.add_argument("--reuse-steps", type=int, default=3, help="steps per reuse setting")
    parser.add_argument(
        "--reuse",
        nargs="*",
        metavar="TASK=EXAMPLE",
        default=[
            "PTX-H100-GEMM=examples/expert/gemm.cu",
            "PTX-H100-MHAFwd-d128=examples/expert/mha_fwd_d128.cu",
            # Five workloads, each with references and a baseline of its own to build. The
            # expert kernel: the naive one holds the GPU alone 37 s per evaluation (H200).
            "PTX-H100-GQADecode=examples/expert/gqa_decode.cu",
        ],
        help="the tasks whose workload reuse is measured, each with a kernel that solves it "
        "(default: the expert GEMM, MHA forward and GQA decode; --reuse alone: none)",
    )
    parser.add_argument(
        "--judge-concurrency",
        type=int,
        default=JudgeSettings.concurrency,
        help="evaluations in flight in the judge (JudgeSettings.concurrency); at 16 "
        "trajectories on the H200, 4 beat 1, 2, 3, 6 and 8 (docs/benchmarks.md, twenty-sixth "
        "and twenty-seventh sessions)",
    )
    parser.add_argument(
        "--spare-workers",
        type=int,
        default=JudgeSettings.spare_workers,
        help="workers kept started ahead of need (JudgeSettings.spare_workers)",
    )
    parser.add_argument(
        "--spare-tool-runs",
        type=int,
        default=JudgeSettings.spare_tool_runs,
        help="sanitizer and count runs kept waiting beyond one per evaluation in flight "
        "(JudgeSettings.spare_tool_runs)",
    )
    parser.add_argument(
        "--check-streams",
        action="store_true",
        help="the judge compares on a CUDA stream per thread (JudgeSettings.check_streams)",
    )
    parser.add_argument(
        "--unlocked-startups",
        action="store_true",
        help="workers and tool runs make their CUDA contexts without the GPU's start-up lock "
        "(JudgeSettings.lock_startups=False)",
    )
    parser.add_argument(
        "--startups-beside-iters",
        type=int,
        default=JudgeSettings.startups_beside_iters,
        metavar="ITERS",
        help="timings of at least ITERS calls per trial let CUDA start-ups run beside them "
        "(JudgeSettings.startups_beside_iters, default the judge's 50 timed calls; 0: every "
        "timing keeps them out)",
    )
    parser.add_argument(
        "--startup-linger-s",
        type=float,
        default=JudgeSettings.startup_linger_s,
        help="the judge keeps the start-up lock this long after a timing for its next, so "
        "start-ups come in batches (JudgeSettings.startup_linger_s)",
    )
    parser.add_argument(
        "--spawn-workers",
        action="store_true",
        help="workers started afresh, not forked from a process that has imported torch "
        "(JudgeSettings.fork_workers=False)",
    )
    parser.add_argument(
        "--spare-profile-runs",
        type=int,
        default=JudgeSettings.spare_profile_runs,
        help="profile runs kept waiting (JudgeSettings.spare_profile_runs); the judge's "
        "concurrency plus one waited before 84b461d",
    )
    parser.add_argument(
        "--exclusive-chain-s",
        type=float,
        default=JudgeSettings.exclusive_chain_s,
        help="how long the judge's exclusive holders hand the GPU on unreleased "
        "(JudgeSettings.exclusive_chain_s; 0: released after every hold, as before cb4f168)",
    )
    parser.add_argument(
        "--profile-method",
        choices=("ncu", "cupti"),
        default=JudgeSettings.profile_method,
        help="what counts the executed instructions (JudgeSettings.profile_method)",
    )
    parser.add_argument(
        "--level-evaluations",
        type=int,
        default=32,
        help="evaluations per level of several trajectories (each steps this many over their "
        "number, at least once), so that the level's rate is not only its start-up",
    )
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    source = args.example.read_text()
    task = get_task(args.task)
    settings = JudgeSettings(
        concurrency=args.judge_concurrency,
        spare_workers=args.spare_workers,
        spare_tool_runs=args.spare_tool_runs,
        check_streams=args.check_streams,
        lock_startups=not args.unlocked_startups,
        startups_beside_iters=args.startups_beside_iters or None,
        startup_linger_s=args.startup_linger_s,
        fork_workers=not args.spawn_workers,
        spare_profile_runs=args.spare_profile_runs,
        exclusive_chain_s=args.exclusive_chain_s,
        profile_method=args.profile_method,
    )
    evaluator = LocalGPUEvaluator(settings=settings)
    results: dict[str, Any] = {
        "date": datetime.date.today().isoformat(),
        "device": evaluator.device_info(),
        "task": args.task,
        "example": str(args.example),
        "settings": settings.__dict__,
    }
    out = args.out / "throughput.json"
    if args.concurrency or args.cached_steps:
        # A first step starts the judge and builds the workload state (baseline included).
        results["first_step"] = trajectory(evaluator, args.task, source, "warm-up", 1)[0]
    # Step latency without compiling: the same source again (a cache hit), every stage on.
    if args.cached_steps:
        steps = args.cached_steps + 1  # the first of them builds (or finds) nothing new: dropped
        cached = trajectory(evaluator, args.task, source, "cached", steps, distinct=False)[1:]
        results["cached"] = p50_latency(cached)
    # Workload reuse, per task: sequential steps of the correctness and timing stages alone (no
    # sanitizer or profile, whose cost does not depend on the state), with and without reuse.
    # The same cached build in both, so that only the evaluation differs.
    reuse: dict[str, Any] = {}
    results["reuse"] = reuse
    for pair in args.reuse:
        task_id, example = pair.split("=", 1)
        example_source = Path(example).read_text()
        per_setting: dict[str, Any] = {"example": example}
        for label, reuse_state in (("reuse", True), ("rebuild", False)):
            plain = JudgeSettings(
                memcheck=False,
                profile=False,
                reuse_state=reuse_state,
                lock_startups=settings.lock_startups,
                startups_beside_iters=settings.startups_beside_iters,
                startup_linger_s=settings.startup_linger_s,
                fork_workers=settings.fork_workers,
            )
            sequential = LocalGPUEvaluator(settings=plain)
            records = trajectory(
                sequential, task_id, example_source, label, args.reuse_steps + 1, distinct=False
            )[1:]
            sequential.close()
            seconds = [r["step_s"] for r in records]
            per_setting[label] = {
                "per_hour": len(seconds) / sum(seconds) * 3600,
                "step_s": seconds,
                "statuses": sorted({r["status"] for r in records}),
                "state_s": [r["stages"].get("state", 0.0) for r in records],
            }
        per_setting["gain"] = per_setting["reuse"]["per_hour"] / per_setting["rebuild"]["per_hour"]
        reuse[task_id] = per_setting
        out.write_text(json.dumps(results, indent=1))

    levels = []
    for trajectories in args.concurrency:
        # One trajectory is steady from its first step; several all compile at once at first,
        # with the GPU idle, so they step long enough for that to be a small part.
        steps = 4 if trajectories == 1 else math.ceil(args.level_evaluations / trajectories)
        levels.append(run_level(evaluator, args.task, source, trajectories, steps))
        results["levels"] = levels
        out.write_text(json.dumps(results, indent=1))
        # Its summary, for a run cut short (the per-step lists are in the JSON file).
        bulky = ("speedups", "stage_seconds", "step_ends_s")
        print(json.dumps({k: v for k, v in levels[-1].items() if k not in bulky}), flush=True)

    if levels:
        results["gpu_efficiency"] = gpu_efficiency(levels, settings, len(task.workloads))
    out.write_text(json.dumps(results, indent=1))
    report(results)


def gpu_efficiency(
    levels: list[dict[str, Any]], settings: JudgeSettings, workloads: int
) -> dict[str, Any]:
    """The protocol's own kernel time per evaluation over the GPU wall time per evaluation, at
    the level with the highest throughput."""
    calls_per_evaluation = (
        (TRIALS + 1)  # the correctness checks
        + settings.warmup
        + settings.iters * settings.trials
        + int(settings.memcheck)
        + int(settings.profile)
    ) * workloads
    busiest = max(levels, key=lambda level: level["per_hour"])
    needed_s = busiest["latency_ms"] / 1000 * calls_per_evaluation
    gpu_wall_s = busiest["wall_s"] / busiest["evaluations"]
    return {
        "needed_s": needed_s,
        "gpu_wall_s_per_evaluation": gpu_wall_s,
        "efficiency": needed_s / gpu_wall_s,
        "at_trajectories": busiest["trajectories"],
    }


def startup_policy(settings: dict[str, Any]) -> str:
    """How the run's CUDA start-ups met its timings (``settings``: the run's JudgeSettings'
    fields), in words."""
    judge = JudgeSettings(**settings)
    if not judge.lock_startups:
        return "without the lock"
    if judge.startups_beside_timings:
        return f"beside timings of {judge.startups_beside_iters}+ calls per trial"
    linger = judge.startup_linger_s
    return f"locked, batched by lingers of {linger:g} s" if linger > 0 else "locked"


def target_lines(results: dict[str, Any]) -> list[str]:
    """Each target the run measured, its value, and whether it was met; the rate, scaling and
    speedup targets compare the level of the most trajectories with one trajectory's."""

    def verdict(met: bool) -> str:
        return "met" if met else "NOT met"

    lines = []
    levels = results.get("levels") or []
    if levels:
        top = max(levels, key=lambda level: level["trajectories"])
        lines.append(
            f"{top['per_hour']:,.0f} evaluations/hour at {top['trajectories']} trajectories "
            f"(≥ {TARGET_PER_HOUR:,.0f}: {verdict(top['per_hour'] >= TARGET_PER_HOUR)})"
        )
        one = next((level for level in levels if level["trajectories"] == 1), None)
        if one is not None and one is not top:
            scaling = top["per_hour"] / one["per_hour"]
            lines.append(
                f"{scaling:.2f}x one trajectory's rate (≥ {TARGET_SCALING:g}x: "
                f"{verdict(scaling >= TARGET_SCALING)})"
            )
            moved = top["median_speedup"] / one["median_speedup"] - 1
            lines.append(
                f"median speedup {top['median_speedup']:.4f} against {one['median_speedup']:.4f} "
                f"at one trajectory, {moved:+.2%} (within ±{TARGET_SPEEDUP_AGREEMENT:.0%}: "
                f"{verdict(abs(moved) <= TARGET_SPEEDUP_AGREEMENT)})"
            )
    if "cached" in results:
        p50 = results["cached"]["p50_step_s"]
        lines.append(
            f"cached step p50 {p50:.2f} s (≤ {TARGET_CACHED_P50_S:g} s: "
            f"{verdict(p50 <= TARGET_CACHED_P50_S)})"
        )
    return lines


def report(results: dict[str, Any]) -> None:
    print(f"\n# Throughput, {results['date']}, {results['device']['name']}, {results['task']}")
    if "first_step" in results:
        first = results["first_step"]["step_s"]
        startups = startup_policy(results["settings"])
        workers = "forked" if results["settings"]["fork_workers"] else "spawned"
        print(
            f"example {results['example']}; first step {first:.1f} s; CUDA start-ups {startups}; "
            f"workers {workers}; profile runs waiting "
            f"{results['settings']['spare_profile_runs']}; workers waiting "
            f"{results['settings']['spare_workers']}; tool runs waiting beyond one per "
            f"evaluation {results['settings']['spare_tool_runs']}; comparisons on "
            f"{'a stream per thread' if results['settings']['check_streams'] else 'one stream'}; "
            f"judge concurrency "
            f"{results['settings']['concurrency']}; exclusive chain "
            f"{results['settings']['exclusive_chain_s']:g} s\n"
        )
    if results.get("levels"):
        report_levels(results["levels"])
    if "cached" in results:
        cached = results["cached"]
        stages = ", ".join(f"{stage} {cached['p50_stage_s'][stage]:.2f}" for stage in STAGES)
        calls = ", ".join(
            f"{stage} {cached['p50_stage_s'][stage]:.2f}" for stage in TOOL_CALL_STAGES
        )
        print(
            f"\nStep latency with a cached build (same source, every stage on): p50 "
            f"{cached['p50_step_s']:.2f} s; p50 per stage: {stages}; the tool runs' parts and "
            f"the timing's: {calls}"
        )
    if results["reuse"]:
        report_reuse(results["reuse"])
    if targets := target_lines(results):
        print("\nTargets:\n")
        print("\n".join(f"- {line}" for line in targets))
    if "gpu_efficiency" not in results:
        return
    efficiency = results["gpu_efficiency"]
    print(
        f"GPU efficiency at {efficiency['at_trajectories']} trajectories: the protocol's kernel "
        f"runs need {efficiency['needed_s']:.3f} s per evaluation; the GPU wall time per "
        f"evaluation is {efficiency['gpu_wall_s_per_evaluation']:.2f} s: "
        f"{efficiency['efficiency']:.1%}"
    )


def report_reuse(reuse: dict[str, Any]) -> None:
    print(
        "\nWorkload reuse (correctness + timing only, sequential steps of one cached build; "
        "rebuild = inputs, references and baseline built for every request):\n"
    )
    print("| task | example | with reuse /h | rebuilding /h | gain | p50 state s rebuilding |")
    print("|---|---|---|---|---|---|")
    for task_id, entry in reuse.items():
        print(
            f"| {task_id} | {entry['example']} | {entry['reuse']['per_hour']:.0f} "
            f"| {entry['rebuild']['per_hour']:.0f} | {entry['gain']:.2f}x "
            f"| {statistics.median(entry['rebuild']['state_s']):.2f} |"
        )


def steady_cell(steady: dict[str, float] | None, base: dict[str, float] | None) -> str:
    """The steady rate, its ratio to the first level's and the evaluations it counts."""
    if steady is None:
        return "–"
    ratio = f"{steady['per_hour'] / base['per_hour']:.2f}x, " if base is not None else ""
    counted = f"{steady['evaluations']} in {steady['window_s']:.0f} s"
    return f"{steady['per_hour']:.0f} ({ratio}{counted})"


def report_levels(levels: list[dict[str, Any]]) -> None:
    print(
        "| trajectories | evaluations | wall s | evaluations/hour | p50 step s | median speedup "
        "| steady evaluations/hour | speedup spread | p50 GPU alone s | GPU alone share "
        "| busy cores |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    base = levels[0]
    for level in levels:
        print(
            f"| {level['trajectories']} | {level['evaluations']} | {level['wall_s']:.1f} "
            f"| {level['per_hour']:.0f} ({level['per_hour'] / base['per_hour']:.2f}x) "
            f"| {level['p50_step_s']:.2f} | {level['median_speedup']:.4f} "
            f"| {steady_cell(level['steady'], base['steady'])} "
            f"| {level['speedup_spread']:.2%} | {level['p50_exclusive_s']:.2f} "
            f"| {level['exclusive_share']:.0%} "
            f"| {level['busy_cores']:.1f} of {level['cores']} |"
        )
    print(
        "\nCeiling (the GPU held alone all the time, at the level's mean hold per evaluation): "
        + ", ".join(
            f"{level['ceiling_per_hour']:.0f}/h at {level['trajectories']} "
            f"({level['ceiling_per_hour'] / base['per_hour']:.2f}x)"
            for level in levels
            if level["ceiling_per_hour"] is not None
        )
    )
    print(
        "\nThe GPU's locks over the level (alone / shared while a timing waited / shared / "
        "free), and per evaluation the seconds a waiting timing waited on each kind of shared "
        "holder (the judge's are its workers' checks):\n"
    )
    for level in levels:
        shares = " / ".join(f"{share:.0%}" for share in level["lock_shares"].values())
        waited = ", ".join(f"{k} {v:.2f}" for k, v in level["timing_waited_on_s"].items())
        print(f"- at {level['trajectories']}: {shares}; waited on: {waited or 'nothing'}")
    print(
        "\nMean seconds per evaluation in the judge, and in the env outside the build and the "
        "judge: "
        + ", ".join(
            f"{level['mean_in_judge_s']:.2f} and {level['mean_outside_judge_s']:.2f} at "
            f"{level['trajectories']}"
            for level in levels
        )
    )
    for level in levels:
        methods = ", ".join(f"{k} {v}" for k, v in level["profile_methods"].items())
        print(f"- at {level['trajectories']}, counted by: {methods}")
    for level in levels:
        for reason, count in level["unknown_profiles"].items():
            print(f"\nAt {level['trajectories']}: {count} profile(s) unknown: {reason}")
    print("\nCPU seconds per evaluation, by kind of process:\n")
    for level in levels:
        kinds = ", ".join(f"{k} {v:.1f}" for k, v in level["cpu_s_per_evaluation"].items())
        print(f"- at {level['trajectories']}: {kinds}")
    print("\np50 seconds per stage:\n")
    print("| trajectories | " + " | ".join(STAGES) + " |")
    print("|---" * (len(STAGES) + 1) + "|")
    for level in levels:
        cells = " | ".join(f"{level['p50_stage_s'][stage]:.2f}" for stage in STAGES)
        print(f"| {level['trajectories']} | {cells} |")


if __name__ == "__main__":
    main()
