"""Which instructions really executed: the Nsight Compute profile of a correct candidate.

For a candidate that passed, the judge runs one more disposable process under Nsight Compute:
``ptxgym.evaluate.single_call`` calls the candidate once between ``cudaProfilerStart`` and
``cudaProfilerStop``, so only the candidate's own launches are profiled (not input generation,
references or the L2 flush). Nsight Compute collects, per SASS opcode, the predicate-enabled thread
executions (``sass__thread_inst_executed_true_per_opcode``) and the warp-level executions beside
them, and the facts that help the next attempt: always those of ``FACT_METRICS`` (each kernel's
duration, registers and launch shape), and with ``details`` those of ``DETAIL_METRICS``
(throughput against the GPU's peaks, occupancy). They are named one by one rather than as
sections, since every metric costs time while the GPU is held alone: the details need hardware
counter passes of their own, about 0.4 s per step on the H200 (docs/benchmarks.md).

The report goes to a folder of its own, which the profiled program cannot write (its writes are
confined to its own folder, ``ptxgym.sandbox.landlock``), so it can neither forge the report nor
turn its path into a link to another file. It is read through Nsight Compute's Python report
interface (``ncu_report``) in a confined process of its own, started with the profile so that its
start-up (Python, the report library) is done by the time the report is there.

A family executed when every opcode group of its ``all_of`` has a pattern with a non-zero count
(``ptxgym.tasks.InstructionFamily``). Qualified = any family executed. A profile that fails or
times out is ``unknown``: it never qualifies, and the step still completes.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ptxgym import paths
from ptxgym.build.sass import (
    FunctionListing,
    family_present,
    flops_per_warp,
    matches_any,
    mnemonic,
    target_addresses,
)
from ptxgym.evaluate.single_call import CallJob, PendingCall
from ptxgym.outcome import InstructionProfile, KernelFacts
from ptxgym.sandbox.isolation import python_environment, restrict_files, seal
from ptxgym.sandbox.processes import ProcessGroup, wait_for_word
from ptxgym.tasks import Task

if TYPE_CHECKING:
    import numpy
    from numpy.typing import NDArray

THREAD_METRIC = "sass__thread_inst_executed_true_per_opcode"
WARP_METRIC = "sass__inst_executed_per_opcode"
# The metrics reported per kernel, under the names KernelFacts gives them. Always collected:
# the launch statistics (no replay pass) and the duration.
FACT_METRICS = {
    "duration_us": "gpu__time_duration.sum",
    "registers_per_thread": "launch__registers_per_thread",
    "grid_size": "launch__grid_size",
    "block_size": "launch__block_size",
}
# Collected on request (JudgeSettings.profile_details): hardware counters needing passes of
# their own.
DETAIL_METRICS = {
    "sm_throughput_pct": "sm__throughput.avg.pct_of_peak_sustained_elapsed",
    "memory_throughput_pct": "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed",
    "dram_throughput_pct": "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed",
    "achieved_occupancy_pct": "sm__warps_active.avg.pct_of_peak_sustained_active",
    "theoretical_occupancy_pct": "sm__maximum_warps_per_active_cycle_pct",
}
_ALL_FACTS = {**FACT_METRICS, **DETAIL_METRICS}
# What the judge collects by default: both opcode metrics and the facts.
PROFILE_METRICS = (THREAD_METRIC, WARP_METRIC, *FACT_METRICS.values())
DEFAULT_TIMEOUT_S = 120.0
EXIT_NOT_WANTED = 4  # the reader was not told to read before the judge went away
_TAIL_CHARS = 1500


def profile_metrics(details: bool = False) -> tuple[str, ...]:
    """The metrics a profile collects: the opcode counts and facts, plus the details if asked."""
    return PROFILE_METRICS + (tuple(DETAIL_METRICS.values()) if details else ())


def families_executed(task: Task, counts: Mapping[str, int]) -> dict[str, bool]:
    """For each target family: did every group of its ``all_of`` execute some opcode?"""
    return {
        key: family_present(counts, family)
        for key, family in task.target.instruction_families.items()
    }


def matrix_instructions(
    task: Task, listing: Mapping[str, FunctionListing]
) -> dict[tuple[str, int], str]:
    """The compute family's matrix instructions of ``listing`` (those of the first group of its
    ``all_of``: HGMMA on Hopper, UTC*MMA on Blackwell), by (function, offset): their text."""
    family = task.target.instruction_families.get("compute")
    if family is None:
        return {}
    patterns = family.all_of[0]
    return {
        (function, offset): text
        for function, where in listing.items()
        for offset, text in where.targets.items()
        if matches_any(mnemonic(text), patterns)
    }


def with_coverage(
    profile: InstructionProfile, task: Task, workload: Mapping[str, Any]
) -> InstructionProfile:
    """``profile`` with the coverage of its ``flops_executed`` (the matrix instructions' work,
    None when not measured) against the task's FLOP model on ``workload`` (its axes and
    sequences)."""
    flops = profile.flops_executed
    work = task.flops_of(workload["axes"], workload.get("sequences", {}))
    return replace(
        profile,
        coverage=None if flops is None else flops / work,
        min_coverage=task.min_coverage,
    )


def find_ncu() -> str | None:
    """The Nsight Compute command line: ``$PTXGYM_NCU``, else on PATH, in CUDA's bin folder, or
    in /opt/nvidia."""
    if found := paths.cuda_tool("ncu", override="PTXGYM_NCU"):
        return found
    if os.environ.get("PTXGYM_NCU"):
        return None  # the named file is missing: no fallback behind the user's back
    installs = sorted(glob.glob("/opt/nvidia/nsight-compute/*/ncu"))
    return installs[-1] if installs else None


def _report_module_dir(ncu: str) -> Path | None:
    """Where ``ncu_report.py`` ships: ``extras/python`` of the Nsight Compute install that ``ncu``
    belongs to. ``ncu`` may be a symbolic link or a wrapper script (CUDA's bin/ncu execs the
    install under CUDA's folder), so the installs beside CUDA and in /opt/nvidia are searched
    too, the one beside the real binary first."""
    folder = Path(ncu).resolve().parent
    cuda_home = Path(os.environ.get("CUDA_HOME", "/usr/local/cuda"))
    candidates = [folder / "extras" / "python", folder.parent / "extras" / "python"]
    for pattern in (
        str(folder.parent / "nsight-compute*"),
        str(cuda_home / "nsight-compute*"),
        "/opt/nvidia/nsight-compute/*",
    ):
        candidates += [Path(p) / "extras" / "python" for p in sorted(glob.glob(pattern))[::-1]]
    return next((c for c in candidates if (c / "ncu_report.py").is_file()), None)


class PendingProfile:
    """An Nsight Compute run started ahead of need (``ptxgym.evaluate.single_call.PendingCall``),
    with its report reader: ``finish`` hands it one call's job and reads the report; ``cancel``
    drops it."""

    def __init__(
        self, *, device: int, metrics: Sequence[str] = PROFILE_METRICS, lock_startup: bool = True
    ) -> None:
        """Start the run on ``device``, collecting ``metrics`` (the judge's come from
        ``profile_metrics``; other sets are for measuring what each costs:
        benchmarks/profile_cost.py). ``lock_startup``: as ``PendingCall``'s."""
        self.failure: str | None = None
        self.call: PendingCall | None = None
        ncu = find_ncu()
        self.reader_path = _report_module_dir(ncu) if ncu is not None else None
        if ncu is None:
            self.failure = "Nsight Compute (ncu) was not found"
            return
        if self.reader_path is None:
            self.failure = f"Nsight Compute's Python report interface was not found beside {ncu}"
            return
        # The run keeps its own temporary folder (where Nsight Compute keeps its lock between
        # instances), so it takes turns with the others through ptxgym.device.lock.profiler_turn.
        self.call = PendingCall(
            device=device,
            prefix="ptxgym-profile-",
            under_profiler=True,
            lock_startup=lock_startup,
        )
        self.report_folder = Path(tempfile.mkdtemp(prefix="ptxgym-profile-report-"))
        self.report = self.report_folder / "profile.ncu-rep"
        self.call.start(
            [
                ncu,
                "--profile-from-start",
                "off",
                "--clock-control",
                "none",
                "--target-processes",
                "all",
                "--metrics",
                ",".join(metrics),
                "--export",
                str(self.report),
                "--force-overwrite",
                *self.call.program,
            ]
        )
        self._read_word = self.report_folder / "read"
        self.reader = ProcessGroup(
            [
                *(sys.executable, "-m", "ptxgym.evaluate.profile", "read", str(self.report)),
                *("--when", str(self._read_word), "--judge", str(os.getpid())),
            ],
            env=python_environment(self.report_folder, self.reader_path),
            cwd=self.report_folder,
        )

    def finish(self, job: CallJob, timeout_s: float = DEFAULT_TIMEOUT_S) -> InstructionProfile:
        """Run ``job``'s call under the profiler and read its report; never raises for the
        candidate's or the profiler's failures (they give an unknown profile)."""
        started = time.perf_counter()

        def unknown(reason: str) -> InstructionProfile:
            return InstructionProfile(False, reason, seconds=time.perf_counter() - started)

        if self.failure is not None or self.call is None:
            return unknown(self.failure or "the profile was not started")
        try:
            code, output = self.call.run(job, timeout_s)
            if code is None:
                return unknown(f"the profile did not finish within {timeout_s:.0f} s")
            if code != 0 or not self.report.is_file():
                tail = output[-_TAIL_CHARS:]
                return unknown(f"the profiled run failed (exit code {code}): {tail}")
            profiled_call = self.call.seconds(output)
            remaining = max(30.0, timeout_s - (time.perf_counter() - started))
            reading = time.perf_counter()
            self._read_word.touch()
            code, output = self.reader.wait(remaining)
            if code != 0:
                return unknown(f"reading the profile failed: {output[-_TAIL_CHARS:]}")
            read_seconds = time.perf_counter() - reading
        finally:
            self.close()
        try:
            counts = json.loads(output.strip().splitlines()[-1])
            thread_counts = {str(k): int(v) for k, v in counts["thread"].items()}
            warp_counts = {str(k): int(v) for k, v in counts["warp"].items()}
            kernels = tuple(_kernel_facts(kernel) for kernel in counts["kernels"])
        except (ValueError, KeyError, IndexError, TypeError, AttributeError):
            return unknown("the profile reader's output could not be parsed")
        if not kernels:
            return unknown("no kernel launch of the candidate was profiled")
        profile = InstructionProfile(
            True,
            method="ncu",
            thread_counts=thread_counts,
            warp_counts=warp_counts,
            kernels=kernels,
            families=families_executed(job.task, thread_counts),
            seconds=time.perf_counter() - started,
            read_seconds=read_seconds,
            call_seconds=profiled_call,
            flops_executed=_opcode_flops(job, warp_counts),
        )
        return with_coverage(profile, job.task, job.workload)

    def cancel(self) -> None:
        self.close()

    def close(self) -> None:
        """End the profiled program and the reader (whichever still run), and remove both
        folders."""
        if self.call is not None:
            self.call.close()
            self.reader.kill()
            shutil.rmtree(self.report_folder, ignore_errors=True)


def profile_candidate(
    task: Task,
    library: str,
    workload: Mapping[str, Any],
    inputs: Mapping[str, NDArray[numpy.uint8]],
    *,
    device: int,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    details: bool = False,
) -> InstructionProfile:
    """Profile one call of the candidate on ``workload`` (axes and sequences) with ``inputs``
    (made by ``ptxgym.evaluate.worker.host_inputs``); ``details``: also ``DETAIL_METRICS``."""
    job = CallJob(task, library, workload, inputs)
    return PendingProfile(device=device, metrics=profile_metrics(details)).finish(job, timeout_s)


def _opcode_flops(job: CallJob, warp_counts: Mapping[str, int]) -> int | None:
    """The matrix instructions' work from per-opcode counts (what Nsight Compute gives): only
    when every matrix instruction of the library has one shape, so each execution did the same
    work; None otherwise, or when the library cannot be listed."""
    try:
        matrix = matrix_instructions(job.task, target_addresses(Path(job.library), job.task))
    except RuntimeError:
        return None
    if not matrix:
        return 0
    shapes = {flops_per_warp(text) for text in matrix.values()}
    opcodes = {mnemonic(text) for text in matrix.values()}
    if len(shapes) != 1 or None in shapes:
        return None
    (per_warp,) = shapes
    assert per_warp is not None
    return per_warp * sum(warp_counts.get(opcode, 0) for opcode in opcodes)


def _kernel_facts(kernel: Mapping[str, Any]) -> KernelFacts:
    metrics = kernel["metrics"]
    values = {
        fact: float(metrics[metric])
        for fact, metric in _ALL_FACTS.items()
        if isinstance(metrics.get(metric), int | float)
    }
    if "duration_us" in values:  # Nsight Compute reports the duration in nanoseconds
        values["duration_us"] /= 1000.0
    return KernelFacts(str(kernel["name"]), **values)


def _read_report(report_path: str) -> int:
    """Sum the per-opcode counts over every profiled kernel, and list each kernel's facts (those
    of ``FACT_METRICS`` and ``DETAIL_METRICS`` it has); print them as one JSON line."""
    import ncu_report

    report = ncu_report.load_report(report_path)
    thread: dict[str, int] = {}
    warp: dict[str, int] = {}
    kernels = []
    for range_index in range(report.num_ranges()):
        profiled_range = report.range_by_idx(range_index)
        for action_index in range(profiled_range.num_actions()):
            action = profiled_range.action_by_idx(action_index)
            facts: dict[str, float] = {}
            for metric_name in _ALL_FACTS.values():
                metric = action.metric_by_name(metric_name)
                if metric is not None:
                    facts[metric_name] = float(metric.as_double())
            kernels.append({"name": action.name(), "metrics": facts})
            for metric_name, totals in ((THREAD_METRIC, thread), (WARP_METRIC, warp)):
                metric = action.metric_by_name(metric_name)
                if metric is None:
                    continue
                opcodes = metric.correlation_ids()
                for index in range(metric.num_instances()):
                    opcode = opcodes.as_string(index)
                    totals[opcode] = totals.get(opcode, 0) + int(metric.as_uint64(index))
    print(json.dumps({"thread": thread, "warp": warp, "kernels": kernels}))
    return 0


def main(argv: list[str]) -> int:
    """``python -m ptxgym.evaluate.profile read REPORT [--when WORD --judge PID]``: the report
    reader's process. With ``--when`` it gets ready (the report library, its confinement) and waits
    until the file WORD exists, giving up when process PID (the judge) is gone."""
    parser = argparse.ArgumentParser(prog="python -m ptxgym.evaluate.profile")
    commands = parser.add_subparsers(dest="command", required=True)
    read = commands.add_parser("read", help="print a report's opcode counts and kernel facts")
    read.add_argument("report")
    read.add_argument("--when", type=Path, help="wait until this file exists")
    read.add_argument("--judge", type=int, default=os.getppid(), help="give up when it is gone")
    arguments = parser.parse_args(argv)
    import ncu_report  # noqa: F401 (the slow part of the start-up, done before the word)

    if arguments.when is not None:
        # The report is untrusted data (the profiled candidate shaped it): its reader reads and
        # writes only in its own folder (and the system's files) and starts nothing
        # (ptxgym.sandbox.isolation).
        restrict_files(Path.cwd())
        seal(network=False)
        if not wait_for_word(arguments.when, arguments.judge):
            return EXIT_NOT_WANTED
    return _read_report(arguments.report)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
