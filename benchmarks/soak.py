"""Soak test (issue 8): many consecutive steps on one env, hostile and honest candidates mixed.

Run on a GPU host: ``python benchmarks/soak.py --out DIR [--steps 500] [--size 1024]``. The env
is the GEMM task with a smaller workload (``--size``³, written as task data into a temporary
data folder), so that 500 steps fit in minutes; the protocol is the GPU tests' shortened one,
without memcheck and the profile. The candidates cycle through the expert GEMM, the naive GEMM,
and every attack of tests/hostile/ that reaches the GPU. Measured:

- every honest step is PASSED, and the expert GEMM's speedup stays stable;
- no attack earns more reward than the naive GEMM, a plain correct kernel;
- the judge's memory, open files and child processes, and the GPU's used memory, stay bounded
  (sampled every 25 steps);
- no canary file was written (an escape) and the secret never came back.

Prints markdown for docs/benchmarks.md and writes OUT/soak.json.
"""

from __future__ import annotations

import argparse
import collections
import datetime
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]


def small_task_data(size: int) -> Path:
    """A data folder whose GEMM task has one workload of ``size``³ (tasks are data)."""
    root = Path(tempfile.mkdtemp(prefix="ptxgym-soak-data-"))
    (root / "envs" / "ops").mkdir(parents=True)
    shutil.copytree(REPO / "envs" / "targets", root / "envs" / "targets")
    shutil.copy(REPO / "envs" / "devices.yaml", root / "envs" / "devices.yaml")
    gemm = yaml.safe_load((REPO / "envs" / "ops" / "gemm.yaml").read_text())
    for task in gemm["tasks"]:
        task["workloads"] = [
            {"name": f"m{size}-n{size}-k{size}", "axes": {"M": size, "N": size, "K": size}}
        ]
    (root / "envs" / "ops" / "gemm.yaml").write_text(yaml.safe_dump(gemm, sort_keys=False))
    for folder in ("packs", "examples"):
        (root / folder).symlink_to(REPO / folder)
    return root


def process_facts(pid: int) -> dict[str, int]:
    """Resident memory (KiB), open files and child processes of ``pid`` (Linux /proc)."""
    from ptxgym.sandbox.processes import stat_fields  # ptxgym only once PTXGYM_DATA is set (main)

    status = Path(f"/proc/{pid}/status").read_text()
    rss = next(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS"))
    files = len(os.listdir(f"/proc/{pid}/fd"))
    children = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            if int(stat_fields(stat)[1]) == pid:
                children += 1
        except (OSError, IndexError, ValueError):
            continue
    return {"rss_kib": rss, "open_files": files, "children": children}


def gpu_memory_used_mib() -> int:
    out = subprocess.run(
        ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout
    return int(out.split()[0]) if out.strip() else -1


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, default=Path("benchmarks/out"))
    parser.add_argument("--steps", type=int, default=500)
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument(
        "--max-seconds",
        type=float,
        default=None,
        help="stop after this long (the steps done are reported as such): for timed GPU hosts",
    )
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    os.environ["PTXGYM_DATA"] = str(small_task_data(args.size))
    sys.path.insert(0, str(REPO / "tests" / "hostile"))
    from catalogue import load_all, make_secret

    from ptxgym import paths
    from ptxgym.env import PTXKernelEnv
    from ptxgym.evaluate import local_gpu as gpu_evaluator
    from ptxgym.evaluate.build_step import build_candidate
    from ptxgym.evaluate.judge_settings import JudgeSettings

    # A 2-s stage deadline is ample for the small GEMM and keeps the hanging attacks cheap.
    # Every step uses a fresh worker, which takes seconds to start: with 4 started ahead, steps
    # of half a second waited for them (1.8 s per step on the H200); 8 keep up.
    settings = JudgeSettings(
        stage_timeout_s=2.0,
        warmup=2,
        iters=5,
        trials=3,
        memcheck=False,
        profile=False,
        spare_workers=8,
    )
    evaluator = gpu_evaluator.LocalGPUEvaluator(settings=settings)
    env = PTXKernelEnv(
        "PTX-H100-GEMM", turns=args.steps + 1, history="feedback-only", evaluator=evaluator
    )
    env.reset(seed=0)
    secret = make_secret(Path(tempfile.mkdtemp(prefix="ptxgym-soak-secret-")))
    canaries = paths.cache_dir() / "soak-canaries"
    canaries.mkdir(parents=True, exist_ok=True)
    attacks = [a for a in load_all() if a.stage == "gpu" or not a.defended]
    honest = {
        "expert": (REPO / "examples" / "expert" / "gemm.cu").read_text(),
        "naive": (REPO / "examples" / "naive" / "gemm.cu").read_text(),
    }
    # expert, attack, naive, attack, expert, ...: honest steps right after each attack.
    schedule: list[tuple[str, str]] = []
    attack_index = 0
    while len(schedule) < args.steps:
        kind = "expert" if len(schedule) % 4 == 0 else "naive"
        if len(schedule) % 2 == 1:
            attack = attacks[attack_index % len(attacks)]
            attack_index += 1
            source = attack.render(secret.path, canaries / f"{attack.name}.canary")
            schedule.append((f"attack:{attack.name}", source))
        else:
            schedule.append((kind, honest[kind]))

    # Every distinct source built once, in parallel, before the clock starts: the soak is about
    # evaluation, and nvcc's minutes would otherwise sit in its first steps.
    distinct = list(dict.fromkeys(source for _, source in schedule))
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 4) as pool:
        list(pool.map(lambda source: build_candidate(env.task, source, 180.0), distinct))

    records: list[dict[str, Any]] = []
    samples: list[dict[str, Any]] = []
    started = time.perf_counter()
    for step, (name, source) in enumerate(schedule):
        if args.max_seconds is not None and time.perf_counter() - started > args.max_seconds:
            print(f"stopped after {step} steps: --max-seconds {args.max_seconds:.0f}", flush=True)
            break
        begin = time.perf_counter()
        try:
            _, reward, _, _, info = env.step(source)
            record = {
                "step": step,
                "candidate": name,
                "status": info["status"],
                "reward": float(reward),
                "speedup": info["outcome"]["speedup"],
                "leaked": secret.token in json.dumps(info, default=str),
                "seconds": time.perf_counter() - begin,
                "stages": info["outcome"]["stage_seconds"],
            }
        except Exception as exc:  # a step must never raise: recorded as a failure
            record = {"step": step, "candidate": name, "status": f"raised {exc!r}"}
        records.append(record)
        if step % 25 == 0 or step == len(schedule) - 1:
            judge = gpu_evaluator.judge_for(0, settings)
            samples.append(
                {"step": step, **process_facts(judge.process.pid), "gpu_mib": gpu_memory_used_mib()}
            )
            print(json.dumps(samples[-1]), flush=True)
    wall = time.perf_counter() - started
    canaries_written = sorted(p.name for p in canaries.glob("*.canary"))
    summarise(args, records, samples, canaries_written, wall)


def summarise(
    args: argparse.Namespace,
    records: list[dict[str, Any]],
    samples: list[dict[str, Any]],
    canaries_written: list[str],
    wall: float,
) -> None:
    by_kind: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    per_attack: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    seconds: dict[str, list[float]] = collections.defaultdict(list)
    for record in records:
        kind = "attack" if record["candidate"].startswith("attack:") else record["candidate"]
        by_kind[kind][record["status"]] += 1
        if kind == "attack":
            per_attack[record["candidate"].removeprefix("attack:")][record["status"]] += 1
        if "seconds" in record:
            seconds[kind].append(record["seconds"])
    # Where a step's seconds go: waiting for a started worker, for the GPU, or the stages.
    stage_medians = {
        stage: statistics.median(r["stages"].get(stage, 0.0) for r in records if "stages" in r)
        for stage in ("worker_start", "checks_gpu_wait", "correctness", "gpu_wait", "timing")
        if any("stages" in r for r in records)
    }
    expert = [r["speedup"] for r in records if r["candidate"] == "expert" and r.get("speedup")]
    naive_rewards = [r["reward"] for r in records if r["candidate"] == "naive" and r.get("reward")]
    attacks = [r for r in records if r["candidate"].startswith("attack:")]
    best_attack = max(attacks, key=lambda r: r.get("reward") or 0.0) if attacks else None
    median = statistics.median(expert) if expert else None
    result = {
        "date": datetime.date.today().isoformat(),
        "steps": len(records),
        "size": args.size,
        "wall_s": wall,
        "statuses": {kind: dict(counter) for kind, counter in by_kind.items()},
        "median_step_s": {kind: statistics.median(values) for kind, values in seconds.items()},
        "median_stage_s": stage_medians,
        "attack_statuses": {name: dict(counter) for name, counter in sorted(per_attack.items())},
        "honest_not_passed": [
            r for r in records if r["candidate"] in ("expert", "naive") and r["status"] != "PASSED"
        ],
        "expert_speedup": {
            "median": median,
            "max_dev_pct": max(abs(s / median - 1) for s in expert) * 100 if median else None,
        },
        "plain_correct_reward": max(naive_rewards) if naive_rewards else None,
        "best_attack": best_attack,
        "leaks": [r for r in records if r.get("leaked")],
        "canaries_written": canaries_written,
        "samples": samples,
    }
    (args.out / "soak.json").write_text(json.dumps(result, indent=1, default=str))
    print(f"\n# Soak, {result['date']}: {len(records)} steps on one env, {wall:.0f} s\n")
    for kind, counter in sorted(by_kind.items()):
        print(f"- {kind}: " + ", ".join(f"{s} {n}" for s, n in sorted(counter.items())))
    print(f"- honest steps not PASSED: {len(result['honest_not_passed'])}")
    steps = ", ".join(f"{kind} {value:.2f}" for kind, value in result["median_step_s"].items())
    print(f"- median seconds per step: {steps}")
    print(
        "- median seconds per stage: " + ", ".join(f"{k} {v:.2f}" for k, v in stage_medians.items())
    )
    if median:
        print(
            f"- expert GEMM speedup: median {median:.4f}, largest deviation "
            f"{result['expert_speedup']['max_dev_pct']:.2f} %"
        )
    if best_attack is not None:
        print(
            f"- best attack reward {best_attack.get('reward')} ({best_attack['candidate']}, "
            f"{best_attack['status']}); plain correct kernel {result['plain_correct_reward']}"
        )
    print(f"- secret leaked: {len(result['leaks'])}; canaries written: {canaries_written or 0}")
    first, last = samples[0], samples[-1]
    print(
        f"- judge: RSS {first['rss_kib'] / 1024:.0f} → {last['rss_kib'] / 1024:.0f} MiB, "
        f"open files {first['open_files']} → {last['open_files']}, children "
        f"{first['children']} → {last['children']}; GPU memory used {first['gpu_mib']} → "
        f"{last['gpu_mib']} MiB"
    )


if __name__ == "__main__":
    main()
