"""The Ray evaluation pool on one GPU against two (issue 30): throughput, speedups, a judge killed.

Run on a host with two GPUs: ``python benchmarks/ray_scaling.py --out DIR``. A dry run on a
machine without a GPU (compile-only judges, one per "GPU" of a level, serving the task's
generation): ``python benchmarks/ray_scaling.py --out DIR --judge compile-only --gpus 1 2
--trajectories 2 4 --steps 1``; there, evaluations per hour measure the builds, not GPUs, and
the scaling verdict is left out.

For each pool size of ``--gpus`` (a fresh ``RayEvaluator`` each, in the same run and the same
Ray cluster, with the same builders), after a warm-up that reaches every judge (a GPU judge
builds its workload state on its first request), every trajectory count of ``--trajectories``
is one level: that many envs stepping at once through the pool, each step a distinct source
(the example kernel plus a comment naming the run, pool, level, trajectory and step), so that
every step really compiles and no pool finds another's builds in the cache. Measured:

- per level: evaluations, wall seconds, evaluations per hour (and the rate from the first
  answer on, which leaves out the first round of builds, when the judges idle), p50 step
  seconds, statuses, median speedup, and the requests each judge took;
- per trajectory count: the largest pool's evaluations per hour over one GPU's, against 90 % of
  linear scaling (two GPUs: at least 1.8x);
- a judge killed (``--kill``, on by default): the largest level is run once more on the largest
  pool, and once a quarter of its requests are answered a judge is killed, one seen holding a
  request (or, if none is seen before half are answered, the one the next request goes to, so
  that a request meets the death). The check: submitted == answered == the level's
  evaluations, nothing failed, cancelled or answered twice, at least one actor death, and the
  run finished; replacements and retries are reported. A repeat, so that the measured levels
  are not slowed by the replacement;
- with ``--local`` (issue 29), the same levels first through the evaluator an env makes on its
  own host (``LocalGPUEvaluator``, with the judge's concurrency; compile-only in a dry run), and
  at each trajectory count the one-GPU pool's evaluations per hour over the local one's, which
  must be at least 0.9 (within 10 %); and, with GPU judges, each example kernel (below) a few
  times through the local evaluator and through a pool of one Ray GPU judge, one after the
  other on the same GPU: the same statuses and median speedups within 2 % (with no
  ``--trajectories`` count, this comparison alone);
- with GPU judges (``--speedup-examples``), each example kernel (expert GEMM, expert MHA
  forward d128, expert GQA decode) evaluated a few times on each GPU of this machine directly
  (``LocalGPUEvaluator(device)``): the median speedup per device and the largest relative
  difference between devices, flagged above 2 %.

Writes OUT/ray_scaling.json as it goes (each step's end also goes to stderr, so a run cut short
still shows how far it got), then prints markdown for docs/benchmarks.md and writes it to
OUT/ray_scaling.md. Exits 1 when a check failed or a level could not be measured. The whole run
takes ten minutes or more on GPUs; it can be split, each part with its own ``--out``: each
trajectory count a full comparison of its own (``--trajectories 16 --no-kill
--no-speedup-examples``, then ``--trajectories 32 --no-speedup-examples``), and the per-device
speedups alone (``--trajectories`` with no count: no pool is started).
"""

from __future__ import annotations

import argparse
import collections
import datetime
import json
import logging
import math
import os
import socket
import statistics
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path
from types import ModuleType
from typing import Any

from ptxgym import paths
from ptxgym.env import PTXKernelEnv
from ptxgym.evaluate.compile_only import CompileOnlyEvaluator
from ptxgym.evaluate.evaluator import Evaluator
from ptxgym.evaluate.judge_settings import JudgeSettings
from ptxgym.evaluate.local_gpu import LocalGPUEvaluator, gpu_of, incompatibility
from ptxgym.evaluate.ray_actors import task_generation
from ptxgym.evaluate.ray_connection import import_ray
from ptxgym.evaluate.ray_pool import PoolStats, RayEvaluator
from ptxgym.tasks import Task, get_task

# A level's evaluations when --steps is not given (steps = this over its trajectories).
LEVEL_EVALUATIONS = 32
# The share of linear scaling the largest pool must reach: two GPUs at least 1.8x one.
SCALING_EFFICIENCY = 0.9
# How much slower than the local evaluator one GPU behind the Ray pool may be (issue 29).
LOCAL_EFFICIENCY = 0.9
# How far apart the devices' median speedups of one example may be.
SPEEDUP_TOLERANCE = 0.02
# The examples whose speedups are compared across devices, with the task each solves.
SPEEDUP_EXAMPLES = (
    ("PTX-H100-GEMM", "expert/gemm.cu"),
    ("PTX-H100-MHAFwd-d128", "expert/mha_fwd_d128.cu"),
    ("PTX-H100-GQADecode", "expert/gqa_decode.cu"),
)
# How long to wait after the kill level for the killed judge's replacement (a GPU judge's
# start loads torch and CUDA); the wait ends as soon as it is replaced.
REPLACEMENT_WAIT_S = 300.0
# How often the killer looks at the judges' loads: a GPU judge holds a request for seconds, a
# compile-only one for milliseconds.
KILL_POLL_S = 0.002
# The counters of PoolStats a level's difference is taken of.
COUNTERS = (
    "submitted",
    "answered",
    "failed",
    "cancelled",
    "retried",
    "actor_deaths",
    "replaced",
    "duplicate_answers",
)


def parse_arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="The Ray evaluation pool on one GPU against two: throughput, speedups, "
        "a judge killed."
    )
    parser.add_argument("--out", type=Path, default=Path("benchmarks/out"))
    parser.add_argument("--gpus", type=int, nargs="+", default=[1, 2], help="pool sizes")
    parser.add_argument(
        "--trajectories",
        type=int,
        nargs="*",
        default=[16, 32],
        help="envs at once, one level each; none: no pool, only the per-device speedups",
    )
    parser.add_argument(
        "--steps",
        type=int,
        default=None,
        help=f"steps per trajectory (default: {LEVEL_EVALUATIONS} evaluations per level over "
        "its trajectories, rounded up)",
    )
    parser.add_argument("--task", default="PTX-H100-GEMM")
    parser.add_argument("--example", type=Path, default=paths.examples_dir() / "expert" / "gemm.cu")
    parser.add_argument("--judge", choices=("gpu", "compile-only"), default="gpu")
    parser.add_argument(
        "--arch",
        default=None,
        help="what compile-only judges serve (default: the task's generation, e.g. sm_90)",
    )
    parser.add_argument(
        "--kill",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="kill a judge during a repeat of the largest level on the largest pool",
    )
    parser.add_argument(
        "--speedup-examples",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="compare the example kernels' speedups across this machine's GPUs "
        "(default: on with --judge gpu)",
    )
    parser.add_argument(
        "--speedup-steps", type=int, default=3, help="evaluations per example and device"
    )
    parser.add_argument(
        "--judge-concurrency",
        type=int,
        default=JudgeSettings.concurrency,
        help="evaluations one GPU judge runs at once (JudgeSettings.concurrency), and the "
        "requests the pool sends it at once",
    )
    parser.add_argument(
        "--builders",
        type=int,
        default=None,
        help="builder actors (default: the cluster's CPUs left by the largest pool's judges, "
        "over --builds-per-builder)",
    )
    parser.add_argument(
        "--builds-per-builder",
        type=int,
        default=None,
        help="builds each builder runs at once (default: 4, or the CPUs left if fewer)",
    )
    parser.add_argument(
        "--local",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="also run the levels through the local evaluator, and compare one Ray GPU with it",
    )
    parser.add_argument(
        "--ray-address",
        default=None,
        help="a running cluster (auto, ray://HOST:PORT); default: a local one sized from "
        "this machine",
    )
    return parser.parse_args(argv)


def cuda_device_count() -> int:
    """The GPUs this process may use (CUDA_VISIBLE_DEVICES respected)."""
    count = 0
    while gpu_of(count) is not None:
        count += 1
    return count


def connect_ray(address: str | None, judge: str) -> ModuleType:
    """Ray, connected to ``address`` or to a new local cluster of this machine's cores and,
    for GPU judges, its GPUs, counted here so that Ray's own detection cannot leave them out."""
    ray = import_ray()
    if address is not None:
        ray.init(address=address)
    else:
        gpus = cuda_device_count() if judge == "gpu" else None
        ray.init(num_cpus=os.cpu_count() or 1, num_gpus=gpus, include_dashboard=False)
    return ray


def build_capacity(ray: ModuleType, args: argparse.Namespace) -> tuple[int, int]:
    """(builders, builds per builder): the same for every pool of the run, so that only the
    judges differ between them. By default they take the cluster's CPUs that the largest
    pool's GPU judges leave (a GPU judge asks Ray for one CPU)."""
    cpus = int(ray.cluster_resources().get("CPU", 1))
    judge_cpus = max(args.gpus) if args.judge == "gpu" else 0
    spare = max(1, cpus - judge_cpus)
    per_builder: int = args.builds_per_builder or min(4, spare)
    return args.builders or max(1, spare // per_builder), per_builder


def start_pool(
    args: argparse.Namespace, gpus: int, builders: int, per_builder: int, arch: str
) -> RayEvaluator:
    settings = JudgeSettings(concurrency=args.judge_concurrency)
    if args.judge == "gpu":
        return RayEvaluator(
            judge="gpu",
            gpus=gpus,
            builders=builders,
            builds_per_builder=per_builder,
            max_in_flight=args.judge_concurrency,
            settings=settings,
        )
    return RayEvaluator(
        judge="compile-only",
        arches=(arch,) * gpus,
        builders=builders,
        builds_per_builder=per_builder,
        max_in_flight=args.judge_concurrency,
    )


def warm_up(evaluator: RayEvaluator, task: Task, source: str, judges: int) -> dict[str, Any]:
    """One request, then two per judge at once (the build cached by then): the least-loaded
    dispatch sends each judge at least one, so every GPU judge has its workload state built
    before a level is timed."""
    started = time.perf_counter()
    outcomes = [evaluator.evaluate(task, source)]
    futures = [evaluator.submit(task, source) for _ in range(2 * judges)]
    outcomes += [future.result() for future in futures]
    loads = evaluator.stats().judges
    return {
        "seconds": time.perf_counter() - started,
        "statuses": dict(collections.Counter(outcome.status.value for outcome in outcomes)),
        "judges_reached": sum(1 for load in loads if load.requests > 0),
    }


def counters(stats: PoolStats) -> dict[str, int]:
    return {name: getattr(stats, name) for name in COUNTERS}


class Level:
    """One level's trajectories, stepping at once through one evaluator; their step records
    are collected as each step ends, so a level cut short by a failure keeps what it did."""

    def __init__(
        self, evaluator: Evaluator, task_id: str, source: str, label: str, steps: int
    ) -> None:
        self.evaluator = evaluator
        self.task_id = task_id
        self.source = source
        self.label = label
        self.steps = steps
        self.records: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self.started = time.perf_counter()

    def trajectory(self, index: int) -> None:
        env = PTXKernelEnv(self.task_id, turns=self.steps, evaluator=self.evaluator)
        try:
            env.reset(seed=index)
            for step in range(self.steps):
                begun = time.perf_counter()
                info = env.step(f"{self.source}\n// {self.label} t{index} step {step}\n")[4]
                ended = time.perf_counter()
                record = {
                    "status": info["status"],
                    "step_s": ended - begun,
                    "end_s": ended - self.started,
                    "speedup": info["outcome"]["speedup"],
                }
                with self._lock:
                    self.records.append(record)
                # As each step ends, so that a run cut short still shows how far it got.
                print(
                    f"{self.label} t{index} step {step}: {info['status']} in "
                    f"{record['step_s']:.1f} s",
                    file=sys.stderr,
                    flush=True,
                )
        finally:
            env.close()  # leaves the evaluator open: the env was given it


def run_level(
    evaluator: RayEvaluator,
    task_id: str,
    source: str,
    label: str,
    trajectories: int,
    steps: int,
    kill: bool = False,
) -> dict[str, Any]:
    """``trajectories`` envs of ``steps`` steps each, at once, through the pool; with ``kill``,
    a judge is killed during the level and the pool's answers are checked."""
    before = evaluator.stats()
    evaluations = trajectories * steps
    done = threading.Event()
    killed: dict[str, Any] = {}
    killer = None
    if kill:
        killer = threading.Thread(
            target=kill_a_judge, args=(evaluator, before.answered, evaluations, done, killed)
        )
        killer.start()
    try:
        result = play_level(evaluator, task_id, source, label, trajectories, steps)
    finally:
        done.set()
        if killer is not None:
            killer.join()
    if kill:
        wait_for_replacement(evaluator, before)
    after = evaluator.stats()
    result["pool"] = {
        name: value - counters(before)[name] for name, value in counters(after).items()
    }
    result["judge_requests"] = [
        now.requests - then.requests for now, then in zip(after.judges, before.judges, strict=True)
    ]
    if kill:
        result["kill"] = kill_check(result, evaluations, killed)
    return result


def play_level(
    evaluator: Evaluator, task_id: str, source: str, label: str, trajectories: int, steps: int
) -> dict[str, Any]:
    """``trajectories`` envs of ``steps`` steps each, at once, through ``evaluator``: what they
    came to."""
    level = Level(evaluator, task_id, source, label, steps)
    with ThreadPoolExecutor(max_workers=trajectories) as players:
        futures = [players.submit(level.trajectory, index) for index in range(trajectories)]
        errors = [exc for future in futures if (exc := future.exception()) is not None]
    wall = time.perf_counter() - level.started
    records = level.records
    return {
        "trajectories": trajectories,
        "steps": steps,
        "evaluations": len(records),
        "wall_s": wall,
        "per_hour": len(records) / wall * 3600,
        "after_first_answer_per_hour": after_first_answer_per_hour(records),
        "p50_step_s": statistics.median(r["step_s"] for r in records) if records else None,
        "statuses": dict(collections.Counter(r["status"] for r in records)),
        "median_speedup": median_speedup(records),
        "error": f"{type(errors[0]).__name__}: {errors[0]}" if errors else None,
        "failed_trajectories": len(errors),
    }


def after_first_answer_per_hour(records: list[dict[str, Any]]) -> float | None:
    """Evaluations per hour from the first step's end to the last: without the first round of
    builds, when every judge idles, which is as long for one GPU as for two and so dilutes
    their ratio."""
    ends = sorted(float(r["end_s"]) for r in records)
    if len(ends) < 2 or ends[-1] <= ends[0]:
        return None
    return (len(ends) - 1) / (ends[-1] - ends[0]) * 3600


def median_speedup(records: list[dict[str, Any]]) -> float | None:
    speedups = [r["speedup"] for r in records if r["speedup"]]
    return statistics.median(speedups) if speedups else None


def kill_a_judge(
    evaluator: RayEvaluator,
    answered_before: int,
    evaluations: int,
    level_done: threading.Event,
    killed: dict[str, Any],
) -> None:
    """Once a quarter of the level's requests are answered, kill a judge seen holding one; if
    none is seen before half are answered (a compile-only judge holds one for milliseconds),
    the judge the next request goes to (the least loaded), so that a request meets the death.
    What was killed goes into ``killed``; nothing, when the level ended first."""
    ray = import_ray()
    quarter, half = max(1, evaluations // 4), max(1, evaluations // 2)
    started = time.perf_counter()
    while not level_done.is_set():
        if evaluator.stats().answered - answered_before >= quarter:
            break
        time.sleep(0.05)
    while not level_done.is_set():
        stats = evaluator.stats()
        loads = list(enumerate(stats.judges))
        busy = [index for index, load in loads if load.alive and load.in_flight > 0]
        if busy or stats.answered - answered_before >= half:
            alive = [(index, load) for index, load in loads if load.alive]
            target = (
                busy[0]
                if busy
                else min(alive, key=lambda pair: (pair[1].in_flight, pair[1].requests))[0]
            )
            judge = [member for member in evaluator.members() if member.role == "judge"][target]
            ray.kill(judge.handle)
            killed.update(
                member=judge.describe(),
                held_a_request=bool(busy),
                answered_before_kill=stats.answered - answered_before,
                at_s=time.perf_counter() - started,
            )
            print(f"killed {judge.describe()}", file=sys.stderr, flush=True)
            return
        time.sleep(KILL_POLL_S)


def wait_for_replacement(evaluator: RayEvaluator, before: PoolStats) -> None:
    """Until every actor that died since ``before`` is replaced, or REPLACEMENT_WAIT_S."""
    deadline = time.monotonic() + REPLACEMENT_WAIT_S
    while time.monotonic() < deadline:
        stats = evaluator.stats()
        if stats.replaced - before.replaced >= stats.actor_deaths - before.actor_deaths:
            return
        time.sleep(0.1)


def kill_check(level: dict[str, Any], evaluations: int, killed: dict[str, Any]) -> dict[str, Any]:
    """Every request of the kill level answered exactly once, the death seen, the run ended."""
    pool = level["pool"]
    checks = {
        "a judge was killed": bool(killed),
        "every trajectory finished": level["error"] is None and level["evaluations"] == evaluations,
        "submitted == answered == evaluations": pool["submitted"]
        == pool["answered"]
        == evaluations,
        "nothing failed, cancelled or answered twice": pool["failed"]
        == pool["cancelled"]
        == pool["duplicate_answers"]
        == 0,
        "at least one actor death": pool["actor_deaths"] >= 1,
    }
    return {
        "killed": killed,
        "checks": checks,
        "passed": all(checks.values()),
        "replaced": pool["replaced"],
        "retried": pool["retried"],
    }


def scaling_ratios(
    levels: list[dict[str, Any]], pool_sizes: list[int], trajectory_counts: list[int], judge: str
) -> list[dict[str, Any]]:
    """At each trajectory count, the largest pool's evaluations per hour over the one-GPU
    pool's (the smallest pool's, when no pool has one GPU); no ratio where either level was
    not measured in full. The verdict is on the whole levels' rates; the rates from the first
    answer on are beside them, to tell the pool's scaling from the first round of builds."""
    sizes = sorted(set(pool_sizes))
    if len(sizes) < 2:
        return []
    base_gpus = 1 if 1 in sizes else sizes[0]
    largest_gpus = sizes[-1]
    required = SCALING_EFFICIENCY * largest_gpus / base_gpus
    measured = {
        (level["gpus"], level["trajectories"]): level
        for level in levels
        if level.get("error") is None
    }
    ratios = []
    for trajectories in trajectory_counts:
        base = measured.get((base_gpus, trajectories))
        largest = measured.get((largest_gpus, trajectories))
        ratio = steady_ratio = None
        if base is not None and largest is not None:
            ratio = largest["per_hour"] / base["per_hour"]
            steady = (base["after_first_answer_per_hour"], largest["after_first_answer_per_hour"])
            if None not in steady:
                steady_ratio = steady[1] / steady[0]
        if ratio is None:
            verdict = "no result"
        elif judge != "gpu":
            verdict = "dry run"  # compile-only judges: the builds are measured, not GPUs
        else:
            verdict = "PASS" if ratio >= required else "FAIL"
        ratios.append(
            {
                "trajectories": trajectories,
                "base_gpus": base_gpus,
                "largest_gpus": largest_gpus,
                "base_per_hour": base["per_hour"] if base else None,
                "largest_per_hour": largest["per_hour"] if largest else None,
                "ratio": ratio,
                "after_first_answer_ratio": steady_ratio,
                "required": required,
                "verdict": verdict,
            }
        )
    return ratios


def example_speedups(devices: int, steps: int) -> list[dict[str, Any]]:
    """Each example kernel on each of this machine's GPUs, through ``LocalGPUEvaluator``."""
    settings = JudgeSettings(memcheck=False, profile=False)
    runs = {
        f"device {device}": (LocalGPUEvaluator(device, settings=settings), device)
        for device in range(devices)
    }
    return compare_examples(runs, steps)


def examples_against_local(steps: int) -> list[dict[str, Any]]:
    """Each example kernel through the local evaluator and through a Ray pool of one GPU judge
    on the same GPU (Ray must be connected): the same outcomes and speedups are expected."""
    settings = JudgeSettings(memcheck=False, profile=False)
    runs: dict[str, tuple[Evaluator, int]] = {
        "local": (LocalGPUEvaluator(0, settings=settings), 0),
        "Ray": (RayEvaluator(judge="gpu", gpus=1, settings=settings), 0),
    }
    return compare_examples(runs, steps)


def compare_examples(runs: dict[str, tuple[Evaluator, int]], steps: int) -> list[dict[str, Any]]:
    """Each example kernel evaluated ``steps`` times through each evaluator (labelled, with the
    device it times on), one after the other (timings must not share the GPU or the host): the
    median speedup of each, the statuses, and the largest relative difference between them.
    Memcheck and the profile are off: they do not change a speedup. Closes the evaluators."""
    examples = []
    try:
        for task_id, example in SPEEDUP_EXAMPLES:
            source = (paths.examples_dir() / example).read_text(encoding="utf-8")
            per_run = [
                evaluator_speedups(evaluator, label, device, task_id, source, steps)
                for label, (evaluator, device) in runs.items()
            ]
            medians = [entry["median"] for entry in per_run if entry["median"] is not None]
            difference = (
                (max(medians) - min(medians)) / min(medians) if len(medians) == len(runs) else None
            )
            statuses = {tuple(sorted(entry["statuses"].items())) for entry in per_run}
            same_statuses = len(statuses) == 1
            examples.append(
                {
                    "task": task_id,
                    "example": example,
                    "runs": per_run,
                    "largest_difference": difference,
                    "same_statuses": same_statuses,
                    "within_tolerance": difference is not None
                    and difference <= SPEEDUP_TOLERANCE
                    and same_statuses,
                }
            )
    finally:
        for evaluator, _ in runs.values():
            evaluator.close()
    return examples


def evaluator_speedups(
    evaluator: Evaluator, label: str, device: int, task_id: str, source: str, steps: int
) -> dict[str, Any]:
    """``steps`` evaluations of ``source`` through ``evaluator``; a device that cannot run the
    task is a result (its error), not the run's end."""
    statuses: collections.Counter[str] = collections.Counter()
    speedups: list[float] = []
    entry: dict[str, Any] = {"label": label, "statuses": statuses, "speedups": speedups}
    # Said plainly, without starting a judge in vain.
    entry["error"] = incompatibility(get_task(task_id), device)
    if entry["error"] is None:
        try:
            # From NVML, for either evaluator, without asking a judge.
            if gpu := gpu_of(device):
                entry["name"] = gpu.name
            env = PTXKernelEnv(task_id, turns=steps, evaluator=evaluator)
            try:
                env.reset(seed=0)
                for step in range(steps):
                    info = env.step(source)[4]  # the same source: a cached build, timed again
                    speedup = info["outcome"]["speedup"]
                    statuses[info["status"]] += 1
                    if speedup:
                        speedups.append(speedup)
                    print(
                        f"{task_id} through {label}, step {step}: {info['status']} {speedup}",
                        file=sys.stderr,
                        flush=True,
                    )
            finally:
                env.close()
        except Exception as exc:
            entry["error"] = f"{type(exc).__name__}: {exc}"
    entry["median"] = statistics.median(speedups) if speedups else None
    return entry


def measure_pools(
    ray: ModuleType,
    args: argparse.Namespace,
    results: dict[str, Any],
    save: Callable[[], None],
) -> None:
    """Every pool of ``--gpus`` in turn, each with every level, and the kill on the largest."""
    task = get_task(args.task)
    source = args.example.read_text(encoding="utf-8")
    arch = args.arch or task_generation(task)
    builders, per_builder = build_capacity(ray, args)
    results["builders"] = {"builders": builders, "builds_per_builder": per_builder}
    # Names this run in every source, so that no step finds a build of an earlier run.
    run_name = f"ray_scaling {time.time_ns()}"
    largest_pool = max(args.gpus)
    for gpus in args.gpus:
        pool: dict[str, Any] = {"gpus": gpus, "error": None}
        results["pools"].append(pool)
        evaluator = None
        try:
            evaluator = start_pool(args, gpus, builders, per_builder, arch)
            pool["members"] = [member.describe() for member in evaluator.members()]
            pool["warm_up"] = warm_up(evaluator, task, source, gpus)
            save()
            for trajectories in args.trajectories:
                steps = args.steps or math.ceil(LEVEL_EVALUATIONS / trajectories)
                label = f"{run_name} {gpus} GPU(s) {trajectories} trajectories"
                level = measure_level(evaluator, args.task, source, label, trajectories, steps)
                results["levels"].append({"gpus": gpus, **level})
                save()
            if args.kill and gpus == largest_pool:
                trajectories = max(args.trajectories)
                steps = args.steps or math.ceil(LEVEL_EVALUATIONS / trajectories)
                label = f"{run_name} {gpus} GPU(s) {trajectories} trajectories, kill"
                level = measure_level(
                    evaluator, args.task, source, label, trajectories, steps, kill=True
                )
                results["kill"] = {"gpus": gpus, **level}
                save()
            pool["final_stats"] = asdict(evaluator.stats())
        except Exception as exc:  # a pool that cannot start is recorded; the next one runs
            pool["error"] = f"{type(exc).__name__}: {exc}"
            print(f"{gpus} GPU(s): {pool['error']}", file=sys.stderr, flush=True)
        finally:
            if evaluator is not None:
                evaluator.close()
            save()


def measure_local(
    args: argparse.Namespace, results: dict[str, Any], save: Callable[[], None]
) -> None:
    """Every level of ``--trajectories`` through the evaluator an env makes on its own host:
    ``LocalGPUEvaluator`` with the GPU judges' concurrency (compile-only in a dry run), warmed
    up by one step, so that its judge has built the workload state before a level is timed."""
    task = get_task(args.task)
    source = args.example.read_text(encoding="utf-8")
    run_name = f"ray_scaling local {time.time_ns()}"
    evaluator: Evaluator
    if args.judge == "gpu":
        evaluator = LocalGPUEvaluator(settings=JudgeSettings(concurrency=args.judge_concurrency))
    else:
        evaluator = CompileOnlyEvaluator()
    try:
        evaluator.evaluate(task, source)
        for trajectories in args.trajectories:
            steps = args.steps or math.ceil(LEVEL_EVALUATIONS / trajectories)
            label = f"{run_name} {trajectories} trajectories"
            try:
                level = play_level(evaluator, args.task, source, label, trajectories, steps)
            except Exception as exc:  # recorded; the run goes on
                level = {"trajectories": trajectories, "error": f"{type(exc).__name__}: {exc}"}
            results["local_levels"].append(level)
            save()
    finally:
        evaluator.close()


def against_local(
    levels: list[dict[str, Any]], local_levels: list[dict[str, Any]], judge: str
) -> list[dict[str, Any]]:
    """At each trajectory count measured both ways, the one-GPU pool's evaluations per hour over
    the local evaluator's, against ``LOCAL_EFFICIENCY``."""
    pool = {
        level["trajectories"]: level
        for level in levels
        if level.get("gpus") == 1 and level.get("error") is None
    }
    comparisons = []
    for local in local_levels:
        trajectories = local["trajectories"]
        ray = pool.get(trajectories)
        ratio = None
        if ray is not None and local.get("error") is None:
            ratio = ray["per_hour"] / local["per_hour"]
        if ratio is None:
            verdict = "no result"
        elif judge != "gpu":
            verdict = "dry run"
        else:
            verdict = "PASS" if ratio >= LOCAL_EFFICIENCY else "FAIL"
        comparisons.append(
            {
                "trajectories": trajectories,
                "local_per_hour": local.get("per_hour"),
                "ray_per_hour": ray["per_hour"] if ray is not None else None,
                "local_median_speedup": local.get("median_speedup"),
                "ray_median_speedup": ray.get("median_speedup") if ray is not None else None,
                "ratio": ratio,
                "verdict": verdict,
            }
        )
    return comparisons


def measure_level(
    evaluator: RayEvaluator,
    task_id: str,
    source: str,
    label: str,
    trajectories: int,
    steps: int,
    kill: bool = False,
) -> dict[str, Any]:
    """``run_level``, or what stopped it (the level is recorded; the run goes on)."""
    try:
        return run_level(evaluator, task_id, source, label, trajectories, steps, kill)
    except Exception as exc:
        print(f"{label}: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        return {
            "trajectories": trajectories,
            "steps": steps,
            "error": f"{type(exc).__name__}: {exc}",
        }


def report(results: dict[str, Any]) -> list[str]:
    """The run as markdown for docs/benchmarks.md."""
    lines = [f"# Ray pool, one GPU against more, {results['date']}, {results['host']}", ""]
    if "builders" in results:
        lines.append(
            f"{results['judge']} judges; task {results['task']}, example {results['example']}; "
            f"builders {results['builders']['builders']} x "
            f"{results['builders']['builds_per_builder']} builds; Ray cluster "
            f"{results['cluster']}."
        )
    if results["judge"] != "gpu" and results["levels"]:
        lines.append(
            "Dry run with compile-only judges: evaluations per hour measure the builds "
            "(the same builders for every pool), not GPUs; no scaling verdict."
        )
    for pool in results["pools"]:
        if pool["error"]:
            lines.append(f"\n{pool['gpus']} GPU(s): the pool failed: {pool['error']}")
        elif "members" in pool:
            judges = [member for member in pool["members"] if member.startswith("judge")]
            lines.append(f"\n{pool['gpus']} GPU(s): {'; '.join(judges)}")
    if results["levels"]:
        lines += [
            "",
            "| GPUs | trajectories | steps | evaluations | wall s | evaluations/hour "
            "| from first answer /h | p50 step s | statuses | median speedup "
            "| requests per judge |",
            "|---|---|---|---|---|---|---|---|---|---|---|",
        ]
    lines += [level_row(level) for level in results["levels"]]
    if results["ratios"]:
        lines += [
            "",
            "| trajectories | base /h | largest pool /h | ratio | from first answer "
            "| required | verdict |",
            "|---|---|---|---|---|---|---|",
        ]
        for ratio in results["ratios"]:
            lines.append(
                f"| {ratio['trajectories']} | {number(ratio['base_per_hour'], '.0f')} "
                f"({ratio['base_gpus']} GPU) | {number(ratio['largest_per_hour'], '.0f')} "
                f"({ratio['largest_gpus']} GPUs) | {number(ratio['ratio'], '.2f')}x "
                f"| {number(ratio['after_first_answer_ratio'], '.2f')}x "
                f"| {ratio['required']:.2f}x | {ratio['verdict']} |"
            )
    if results["against_local"]:
        lines += [
            "",
            "One GPU through the Ray pool against the local evaluator (LocalGPUEvaluator) at "
            f"the same trajectories (required: at least {LOCAL_EFFICIENCY:.1f}x):",
            "",
            "| trajectories | local /h | Ray, 1 GPU /h | ratio | median speedup local | "
            "median speedup Ray | verdict |",
            "|---|---|---|---|---|---|---|",
        ]
        for row in results["against_local"]:
            lines.append(
                f"| {row['trajectories']} | {number(row['local_per_hour'], '.0f')} "
                f"| {number(row['ray_per_hour'], '.0f')} | {number(row['ratio'], '.2f')}x "
                f"| {number(row['local_median_speedup'], '.4f')} "
                f"| {number(row['ray_median_speedup'], '.4f')} | {row['verdict']} |"
            )
    if "kill" in results:
        lines += ["", *kill_lines(results["kill"])]
    if results.get("speedups"):
        lines += ["", *speedup_lines(results["speedups"], "on each GPU (LocalGPUEvaluator)")]
    if results.get("examples_against_local"):
        lines += [
            "",
            *speedup_lines(
                results["examples_against_local"],
                "through the local evaluator and a Ray pool of one GPU judge",
            ),
        ]
    return lines


def level_row(level: dict[str, Any]) -> str:
    if "wall_s" not in level:
        return (
            f"| {level['gpus']} | {level['trajectories']} | {level['steps']} "
            f"| failed: {level['error']} | | | | | | | |"
        )
    statuses = ", ".join(f"{status} {count}" for status, count in level["statuses"].items())
    if level["error"]:
        statuses += f"; {level['failed_trajectories']} trajectories failed: {level['error']}"
    return (
        f"| {level['gpus']} | {level['trajectories']} | {level['steps']} "
        f"| {level['evaluations']} | {level['wall_s']:.1f} | {level['per_hour']:.0f} "
        f"| {number(level['after_first_answer_per_hour'], '.0f')} "
        f"| {number(level['p50_step_s'], '.2f')} | {statuses} "
        f"| {number(level['median_speedup'], '.4f')} "
        f"| {', '.join(str(count) for count in level['judge_requests'])} |"
    )


def kill_lines(level: dict[str, Any]) -> list[str]:
    if "kill" not in level:
        return [f"Kill check: the level failed: {level['error']}"]
    check = level["kill"]
    killed = check["killed"]
    pool = level["pool"]
    if killed:
        state = "holding a request" if killed["held_a_request"] else "idle, the next one's"
        where = f"{killed['member']} ({state}, after {killed['answered_before_kill']} answers)"
    else:
        where = "no judge (the level ended first)"
    failed = [name for name, ok in check["checks"].items() if not ok]
    return [
        f"Kill check, {level['gpus']} GPU(s), {level['trajectories']} trajectories x "
        f"{level['steps']} steps (a repeat of that level): killed {where}; submitted "
        f"{pool['submitted']}, answered {pool['answered']}, failed {pool['failed']}, cancelled "
        f"{pool['cancelled']}, answered twice {pool['duplicate_answers']}; actor deaths "
        f"{pool['actor_deaths']}, replaced {check['replaced']}, retried {check['retried']}; "
        f"{level['evaluations']} evaluations in {level['wall_s']:.1f} s "
        f"({level['per_hour']:.0f}/h). "
        + ("**PASS**" if check["passed"] else f"**FAIL**: not {'; not '.join(failed)}")
    ]


def speedup_lines(examples: list[dict[str, Any]], what: str) -> list[str]:
    labels = [entry["label"] for entry in examples[0]["runs"]]
    lines = [
        f"Median speedup of each example {what} (memcheck and profile off):",
        "",
        "| task | example | "
        + " | ".join(labels)
        + f" | largest difference | same statuses | within {SPEEDUP_TOLERANCE:.0%} |",
        "|---|---|" + "---|" * len(labels) + "---|---|---|",
    ]
    for example in examples:
        cells = []
        for entry in example["runs"]:
            if entry["error"]:
                cells.append(f"failed: {entry['error'][:200]}")
            else:
                statuses = ", ".join(f"{s} {n}" for s, n in entry["statuses"].items())
                cells.append(f"{number(entry['median'], '.4f')} ({statuses})")
        lines.append(
            f"| {example['task']} | {example['example']} | {' | '.join(cells)} "
            f"| {number(example['largest_difference'], '.2%')} "
            f"| {'yes' if example['same_statuses'] else '**no**'} "
            f"| {'yes' if example['within_tolerance'] else '**no**'} |"
        )
    return lines


def number(value: float | None, spec: str) -> str:
    return "n/a" if value is None else format(value, spec)


def all_checks_hold(results: dict[str, Any]) -> bool:
    """Every pool and level measured, every scaling verdict and the kill check passed, every
    example's speedups within the tolerance."""
    measured = all(pool["error"] is None for pool in results["pools"]) and all(
        level.get("error") is None for level in results["levels"]
    )
    scaling = all(
        row["verdict"] in ("PASS", "dry run")
        for row in results["ratios"] + results.get("against_local", [])
    )
    measured = measured and all(
        level.get("error") is None for level in results.get("local_levels", [])
    )
    kill = "kill" not in results or results["kill"].get("kill", {}).get("passed", False)
    speedups = all(
        example["within_tolerance"]
        for example in results.get("speedups", []) + results.get("examples_against_local", [])
    )
    return measured and scaling and kill and speedups


def main(argv: list[str] | None = None) -> int:
    args = parse_arguments(argv)
    if args.judge == "gpu" and args.ray_address is None and cuda_device_count() == 0:
        raise SystemExit(
            "ray_scaling.py with GPU judges needs an NVIDIA GPU on this machine, and none is "
            "visible (--judge compile-only for a dry run, --ray-address for a cluster's GPUs)"
        )
    # The pool's own warnings (a death, a replacement, a retry) go to stderr with the steps.
    logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s")
    args.out.mkdir(parents=True, exist_ok=True)
    out = args.out / "ray_scaling.json"
    results: dict[str, Any] = {
        "date": datetime.date.today().isoformat(),
        "host": socket.gethostname(),
        "judge": args.judge,
        "task": args.task,
        "example": str(args.example),
        "gpus": args.gpus,
        "trajectories": args.trajectories,
        "pools": [],
        "levels": [],
        "ratios": [],
        "local_levels": [],
        "against_local": [],
    }

    def save() -> None:
        out.write_text(json.dumps(results, indent=1), encoding="utf-8")

    if args.trajectories and args.local:
        measure_local(args, results, save)
    # --local with GPU judges also compares the example kernels one by one (issue 29's ±2 %),
    # with or without levels of trajectories.
    compare_with_local = args.local and args.judge == "gpu"
    if args.trajectories or compare_with_local:
        ray = connect_ray(args.ray_address, args.judge)
        try:
            resources = ray.cluster_resources()
            results["cluster"] = {name: resources.get(name, 0) for name in ("CPU", "GPU")}
            if args.trajectories:
                measure_pools(ray, args, results, save)
            if compare_with_local:
                results["examples_against_local"] = examples_against_local(args.speedup_steps)
                save()
        finally:
            ray.shutdown()
    results["ratios"] = scaling_ratios(results["levels"], args.gpus, args.trajectories, args.judge)
    results["against_local"] = against_local(results["levels"], results["local_levels"], args.judge)
    save()
    compare_speedups = (
        args.judge == "gpu" if args.speedup_examples is None else args.speedup_examples
    )
    if compare_speedups:
        results["speedups"] = example_speedups(max(args.gpus), args.speedup_steps)
        save()
    markdown = "\n".join(report(results)) + "\n"
    (args.out / "ray_scaling.md").write_text(markdown, encoding="utf-8")
    print(markdown)
    return 0 if all_checks_hold(results) else 1


if __name__ == "__main__":
    sys.exit(main())
