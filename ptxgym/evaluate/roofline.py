"""How far a timed kernel is from what the GPU can physically do: the speed-of-light bound.

The work of a workload is the task's FLOP model (``Task.flops``) and the bytes it must move at
least (``Task.bytes_of``: the task's byte model, by default every input read once and every
output written once; the timing flushes L2 before each call, so they come from DRAM). The GPU's
peaks are data (``envs/devices.yaml``: dense bf16 tensor-core FLOP/s and DRAM bandwidth from
NVIDIA's datasheets, the compute peak scaled down for a device that reports fewer SMs, as a MIG
slice does). The bound of a workload
is the larger of its FLOPs at the compute peak and its bytes at the bandwidth; a pooled task's
bound, FLOPs and bytes are sums over its workloads, as its latency is.

A latency under ``FAULT_RATIO`` of the bound is not a fast kernel but a measurement fault
(work the timer did not see): the evaluator reports it as such, never as a speedup. What a
bound says (``SpeedOfLight``, ``Peaks``) is defined with the outcome (``ptxgym.outcome``).
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache
from typing import Any

import yaml

from ptxgym import paths
from ptxgym.outcome import FAULT_RATIO as FAULT_RATIO  # still given here, where it was first
from ptxgym.outcome import Peaks, SpeedOfLight, WorkloadTiming
from ptxgym.tasks import Task


@cache
def _devices() -> tuple[dict[str, Any], ...]:
    """The devices of ``envs/devices.yaml``; none for a data folder without it (a user's own
    task files, ``PTXGYM_DATA``): no bounds then, rather than no evaluation."""
    listing = paths.envs_dir() / "devices.yaml"
    if not listing.is_file():
        return ()
    return tuple(yaml.safe_load(listing.read_text(encoding="utf-8"))["devices"])


def peaks_for(name: str, sm_count: int | None = None) -> Peaks | None:
    """The peaks of the device called ``name`` (as it reports itself), with ``sm_count`` SMs;
    None for a device ``envs/devices.yaml`` does not list."""
    for entry in _devices():
        if entry["match"] in name:
            scale = min(1.0, sm_count / entry["sms"]) if sm_count else 1.0
            return Peaks(
                name,
                float(entry["bf16_dense_tflops"]) * scale,
                float(entry["dram_gbps"]),
                str(entry["source"]) + (f", scaled to {sm_count} SMs" if scale < 1 else ""),
            )
    return None


def speed_of_light(
    task: Task, timings: Sequence[WorkloadTiming], peaks: Peaks
) -> SpeedOfLight | None:
    """The timed workloads of ``task`` against ``peaks``; None without timings."""
    if not timings:
        return None
    workloads = {workload.name: workload for workload in task.workloads}
    flops = bytes_ = 0
    bound_ms = latency_ms = 0.0
    compute_ms = memory_ms = 0.0
    for timing in timings:
        workload = workloads[timing.workload]
        work = task.flops_of(workload.axes, workload.sequences)
        moved = task.bytes_of(workload.axes, workload.sequences)
        compute, memory = work / (peaks.tflops * 1e9), moved / (peaks.dram_gbps * 1e6)
        flops, bytes_ = flops + work, bytes_ + moved
        compute_ms, memory_ms = compute_ms + compute, memory_ms + memory
        bound_ms += max(compute, memory)
        latency_ms += timing.latency_ms
    seconds = latency_ms / 1e3
    return SpeedOfLight(
        flops=flops,
        bytes=bytes_,
        latency_ms=latency_ms,
        bound_ms=bound_ms,
        limit="compute" if compute_ms >= memory_ms else "memory",
        achieved_tflops=flops / seconds / 1e12,
        achieved_gbps=bytes_ / seconds / 1e9,
        mfu=flops / seconds / (peaks.tflops * 1e12),
        bandwidth_use=bytes_ / seconds / (peaks.dram_gbps * 1e9),
        peaks=peaks,
    )
