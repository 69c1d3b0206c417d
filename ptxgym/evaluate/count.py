"""Which instructions really executed, counted by CUPTI's SASS metrics in a run of ours.

The alternative to the Nsight Compute profile (``ptxgym.evaluate.profile``), without its
per-process set-up: a single-call run (``ptxgym.evaluate.single_call``) started ahead of need
loads the CUPTI helper (``ptxgym.evaluate.cupti_helper``) before any candidate code, counts the
candidate's one call per instruction address, and writes the counts into its folder. The judge
joins them with the library's SASS listing, which it makes itself (``ptxgym.build.sass``): the
offset of each instruction of the target families gives its opcode, and so the executed count of
each target opcode, warp-level and predicated-on threads.

The counts are written by the candidate's own process, so the candidate could forge them (its
host code runs there). What the judge checks (``counts_profile``): every row must name an
instruction of the library (a function of its listing, an offset inside the function on an
instruction boundary), and no instruction may claim more predicated-on threads than 32 per
warp-level execution. A forged count that passes these names a real target instruction with
plausible counts: docs/security.md states this residual risk, and Nsight Compute, whose report
the candidate cannot write, stays available as the cross-check (``JudgeSettings.profile_method``).

A Triton candidate's listing has a section per cubin of its cache, several possibly holding a
kernel of one name (autotuning's variants): its counts are joined only with the cubins its
counted call loaded, as the run lists them (``LOADED_FILE``), and a name two of those give to
different code makes the counts unknown.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy

from ptxgym.build.result import DEFAULT_COMPILE_TIMEOUT_S
from ptxgym.build.sass import (
    FunctionListing,
    demangle,
    flops_per_warp,
    mnemonic,
    target_addresses,
)
from ptxgym.evaluate.cupti_helper import HelperUnavailable, build_helper
from ptxgym.evaluate.profile import (
    DEFAULT_TIMEOUT_S,
    families_executed,
    matrix_instructions,
    with_coverage,
)
from ptxgym.evaluate.single_call import (
    COUNTS_FILE,
    LOADED_FILE,
    CallJob,
    PendingCall,
)
from ptxgym.languages import get_language
from ptxgym.languages.base import ENTRY_TRITON
from ptxgym.outcome import InstructionProfile
from ptxgym.tasks import Task, get_task

if TYPE_CHECKING:
    from numpy.typing import NDArray

_INSTRUCTION_BYTES = 16
_THREADS_PER_WARP = 32
_MAX_COUNTS_BYTES = 16 << 20
_TAIL_CHARS = 1500


class CountsRefused(ValueError):
    """The counts do not fit the library's SASS: forged, or corrupted."""


def counts_profile(
    task: Task, listing: Mapping[str, FunctionListing], rows: Sequence[object]
) -> InstructionProfile:
    """The executed target opcodes of ``rows`` (``[function, offset, warp, threads]`` each, as a
    count run writes them) joined with ``listing``. Raises ``CountsRefused`` for rows that do not
    fit the listing. Rows of functions the listing does not hold (kernels of other modules) are
    left out."""
    thread_counts: Counter[str] = Counter()
    warp_counts: Counter[str] = Counter()
    matrix = matrix_instructions(task, listing)
    flops: int | None = 0
    # CUPTI may name a function as compiled (mangled) or as written: both find its listing.
    canonical = {alias: name for name, alias in demangle(list(listing)).items()}
    canonical.update({name: name for name in listing})
    named = {alias: listing[name] for alias, name in canonical.items()}
    # CUPTI gives one record per instruction and metric: the warp-level count and the threads'
    # come in rows of their own, summed here per instruction.
    summed: dict[tuple[str, int], list[int]] = {}
    for row in rows:
        if not (
            isinstance(row, list)
            and len(row) == 4
            and isinstance(row[0], str)
            and all(type(value) is int and value >= 0 for value in row[1:])
        ):
            raise CountsRefused(f"a row of counts is malformed: {str(row)[:120]}")
        totals = summed.setdefault((row[0], row[1]), [0, 0])
        totals[0] += row[2]
        totals[1] += row[3]
    matched = 0
    for (function, offset), (warps, threads) in summed.items():
        if function not in named:
            continue
        matched += 1
        where = named[function]
        if offset % _INSTRUCTION_BYTES or offset >= where.size:
            raise CountsRefused(f"a count names no instruction of {function} (offset {offset:#x})")
        if threads > _THREADS_PER_WARP * warps:
            raise CountsRefused(
                f"a count claims {threads} threads for {warps} warp-level executions "
                f"({function}, offset {offset:#x})"
            )
        if (text := where.targets.get(offset)) is not None:
            opcode = mnemonic(text)
            thread_counts[opcode] += threads
            warp_counts[opcode] += warps
            if warps and (canonical[function], offset) in matrix:
                per_warp = flops_per_warp(text)
                flops = None if flops is None or per_warp is None else flops + per_warp * warps
    if rows and not matched:
        # Not "nothing executed": the counts and the listing do not speak of the same code.
        names = sorted({str(row[0]) for row in rows if isinstance(row, list) and row})[:3]
        raise CountsRefused(f"no counted function is in the library's listing ({names})")
    return InstructionProfile(
        True,
        method="cupti",
        thread_counts=dict(thread_counts),
        warp_counts=dict(warp_counts),
        families=families_executed(task, thread_counts),
        flops_executed=flops,
    )


# Why a profile decided from the build's SASS alone was not counted (its method is "sass").
NO_TARGETS_NOTE = (
    "not run: the build's SASS holds none of the target instructions, so none of them can execute"
)


class PendingCount:
    """A count run started ahead of need: ``finish`` hands it one call's job and joins its
    counts with the library's listing; ``cancel`` drops it. Interchangeable with
    ``ptxgym.evaluate.profile.PendingProfile`` for the judge's tool runs."""

    def __init__(self, *, device: int, lock_startup: bool = True) -> None:
        self.failure: str | None = None
        self.call: PendingCall | None = None
        try:
            helper = build_helper()
        except HelperUnavailable as exc:
            self.failure = str(exc)
            return
        # The counted call holds the GPU shared: counts are exact whatever runs beside them
        # (four count runs at once on the H200 all counted exactly, issue 25), and never beside
        # a timing.
        self.call = PendingCall(
            device=device,
            prefix="ptxgym-count-",
            lock_startup=lock_startup,
            counter=helper,
            exclusive=False,
        )
        self.call.start(self.call.program)

    def finish(self, job: CallJob, timeout_s: float = DEFAULT_TIMEOUT_S) -> InstructionProfile:
        """Run ``job``'s call counted and join the counts; never raises for the candidate's or
        CUPTI's failures (they give an unknown profile)."""
        started = time.perf_counter()

        def unknown(reason: str) -> InstructionProfile:
            return InstructionProfile(
                False, reason, method="cupti", seconds=time.perf_counter() - started
            )

        if self.failure is not None or self.call is None:
            return unknown(self.failure or "the count was not started")
        try:
            listing = target_addresses(Path(job.library), job.task)
        except RuntimeError as exc:
            self.close()
            return unknown(f"the library's SASS could not be listed: {exc}")
        if not any(function.targets for function in listing.values()):
            # Absent cannot execute: no run needed to know that nothing of the families did.
            self.close()
            static = InstructionProfile(
                True,
                method="sass",
                note=NO_TARGETS_NOTE,
                families=families_executed(job.task, {}),
                flops_executed=0,
                seconds=time.perf_counter() - started,
            )
            return with_coverage(static, job.task, job.workload)
        try:
            code, output = self.call.run(job, timeout_s)
            if code is None:
                return unknown(f"the counted run did not finish within {timeout_s:.0f} s")
            counts = self.call.folder / COUNTS_FILE
            if code != 0 or not counts.is_file():
                tail = output[-_TAIL_CHARS:]
                return unknown(f"the counted run failed (exit code {code}): {tail}")
            if counts.stat().st_size > _MAX_COUNTS_BYTES:
                return unknown("the counted run wrote more counts than any library has")
            raw = counts.read_text(errors="replace")
            loaded, modules = self.call.folder / LOADED_FILE, ""
            if loaded.is_file() and loaded.stat().st_size <= _MAX_COUNTS_BYTES:
                modules = loaded.read_text(errors="replace")
        finally:
            self.close()
        try:
            rows = json.loads(raw)
            if not isinstance(rows, list):
                raise CountsRefused("the counts are not a list of rows")
            if job.entry == ENTRY_TRITON:
                # A Triton cache holds every variant compiled (autotuning's, other workloads'),
                # several under one name: only the cubins the counted call loaded are joined.
                listing = target_addresses(
                    Path(job.library), job.task, modules=_loaded_modules(modules)
                )
            profile = counts_profile(job.task, listing, rows)
        except RuntimeError as exc:
            return unknown(f"the counts cannot be attributed: {exc}")
        except (ValueError, CountsRefused) as exc:  # json's errors are ValueErrors too
            return unknown(f"the counts were refused: {exc}")
        timed = replace(
            profile, seconds=time.perf_counter() - started, call_seconds=self.call.seconds(output)
        )
        return with_coverage(timed, job.task, job.workload)

    def cancel(self) -> None:
        self.close()

    def close(self) -> None:
        """End the run if it still waits or runs, and remove its folder."""
        if self.call is not None:
            self.call.close()


def _loaded_modules(text: str) -> set[str]:
    """The cubins a Triton candidate's counted call loaded (``LOADED_FILE``, written in the
    candidate's process, as the counts are): names of its prepared cache, nothing else."""
    names = json.loads(text) if text else []
    if not isinstance(names, list) or not all(isinstance(name, str) for name in names):
        raise CountsRefused("the list of loaded kernels is malformed")
    return set(names)


def count_candidate(
    task: Task,
    library: str,
    workload: Mapping[str, Any],
    inputs: Mapping[str, NDArray[numpy.uint8]],
    *,
    device: int,
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> InstructionProfile:
    """Count one call of the candidate on ``workload`` (axes and sequences) with ``inputs``
    (made by ``ptxgym.evaluate.worker.host_inputs``), as ``profile_candidate`` profiles it."""
    job = CallJob(task, library, workload, inputs)
    return PendingCount(device=device).finish(job, timeout_s)


# Data, not a Python package: a folder name no import could take.
SELF_TEST_KERNELS = Path(__file__).with_name("self-test")
# What the self-test counts: with M rows, M / 64 warpgroups each execute one wgmma (4 warp-level
# HGMMA), and a wgmma on a branch no launch takes executes none.
_SELF_TEST_AXES = {"M": 128, "N": 128, "K": 64}


def self_test(device: int, capability: tuple[int, int]) -> str | None:
    """None when CUPTI counts executed instructions right on ``device`` (of compute
    ``capability``), else why not: two kernels of known counts (``SELF_TEST_KERNELS``: one
    executes a wgmma per warpgroup, one never does), built as candidates of the Hopper GEMM task
    and counted like them. A judge counts with CUPTI only after this passes."""
    task = get_task("PTX-H100-GEMM")
    if tuple(task.target.compute_capability) != capability:
        return (
            f"the self-test has Hopper kernels only; this GPU is sm_{capability[0]}{capability[1]}"
        )
    workload = {"axes": _SELF_TEST_AXES, "sequences": {}}
    elements = {"A": _SELF_TEST_AXES["M"], "B": _SELF_TEST_AXES["N"]}
    inputs = {
        name: numpy.zeros(rows * _SELF_TEST_AXES["K"] * 2, numpy.uint8)  # bf16 [rows, K]
        for name, rows in elements.items()
    }
    expected = {"wgmma_tma.cu": 4 * _SELF_TEST_AXES["M"] // 64, "wgmma_never_taken.cu": 0}
    for kernel, warps in expected.items():
        build = get_language().build(
            (SELF_TEST_KERNELS / kernel).read_text(), task, timeout_s=DEFAULT_COMPILE_TIMEOUT_S
        )
        if not build.ok or build.library is None:
            return f"the self-test kernel {kernel} did not build: {build.log[-300:]}"
        counted = count_candidate(task, build.library, workload, inputs, device=device)
        if not counted.ok:
            return f"counting {kernel} failed: {counted.reason[-300:]}"
        if counted.warp_counts.get("HGMMA", 0) != warps:
            return (
                f"{kernel} executes {warps} warp-level HGMMA; CUPTI counted "
                f"{counted.warp_counts.get('HGMMA', 0)}"
            )
    return None
