"""Baseline latencies cached on disk, keyed by everything they depend on.

A baseline (cuBLAS, cuDNN, FlashInfer) takes seconds to measure and does not change while the GPU,
driver, libraries, problem and timing protocol stay the same, so the judge keeps each in
``<cache>/baselines.json`` under a key that names all of them. The protocol enters the key as its
counts, the order of warm-up and timed calls that ``ptxgym.evaluate.timing.CallSchedule`` derives
from them (so a new schedule with the same counts misses the old entries), and ``TIMING_VERSION``
for what the schedule does not show (how a call is prepared and timed).
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ptxgym import paths
from ptxgym.evaluate.timing import CallSchedule
from ptxgym.tasks import Task, WorkloadSpec

# Bump when how a call is prepared or timed changes, to invalidate cached baselines (a change
# of which calls are timed changes the key by itself).
TIMING_VERSION = 2


def baseline_key(
    device: dict[str, Any],
    libraries: dict[str, str],
    task: Task,
    workload: WorkloadSpec,
    protocol: Mapping[str, int],
) -> str:
    """What a cached baseline latency depends on: GPU, driver, libraries, problem, and the
    timing ``protocol`` (its warm-up, iteration and trial counts, and the schedule of timed
    calls they make)."""
    schedule = CallSchedule(protocol["warmup"], protocol["iters"], protocol["trials"])
    timed = hashlib.sha256(json.dumps(schedule.timed).encode()).hexdigest()[:16]
    return json.dumps(
        [
            device["name"],
            device["driver"],
            {"torch": device["torch"], "cuda": device["cuda"], "cudnn": device["cudnn"]},
            libraries,
            task.callables.baseline,
            task.callables.params,
            # Every axis, const ones included: the head dim is a const axis, not part of the
            # workload, and d64/d96/d128 must not share a cached baseline.
            task.axis_values(workload),
            workload.sequences,
            {**protocol, "timed_calls": timed, "version": TIMING_VERSION},
            device["timing_method"],
        ],
        sort_keys=True,
    )


def _cache_path() -> Path:
    return paths.cache_dir() / "baselines.json"


def cached_baseline(key: str) -> tuple[float, str] | None:
    """The cached latency (ms) and timing method under ``key``, if any."""
    try:
        entry = json.loads(_cache_path().read_text())[key]
        return float(entry["latency_ms"]), str(entry["method"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def store_baseline(key: str, latency_ms: float, method: str) -> None:
    """Cache a measured baseline; the file is replaced atomically (readers never see half)."""
    path = _cache_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        data = {}
    data[key] = {"latency_ms": latency_ms, "method": method, "measured": time.time()}
    temporary = path.with_suffix(f".{os.getpid()}.tmp")
    temporary.write_text(json.dumps(data, indent=1))
    os.replace(temporary, path)
