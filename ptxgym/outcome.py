"""The record of one evaluated step: its status and what each stage found.

``Outcome`` is what an evaluator returns and what the reward, the feedback and the records read.
Its parts are here too, each the report of one stage of the judge: ``WorkloadTiming`` (timing),
``CheckReport`` with its ``OutputCheck``s (correctness), ``SanitizerReport`` (compute-sanitizer),
``InstructionProfile`` with its ``KernelFacts`` (the instruction count or profile) and
``SpeedOfLight`` (the timed call against the GPU's ``Peaks``). The stages that fill them live in
``ptxgym.evaluate`` and import them from here, so what an evaluation says is defined in one
place, below everything that makes or reads it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any

from ptxgym.build.result import CompileResult


@dataclass(frozen=True)
class WorkloadTiming:
    """Candidate and baseline latency on one workload, and the protocol both were timed with:
    ``warmup_calls`` untimed and ``timed_calls`` timed calls per trial, one trial per entry of
    ``trial_medians_ms`` (``JudgeSettings``; 0 where a record predates them)."""

    workload: str
    latency_ms: float
    baseline_latency_ms: float
    speedup: float
    trial_medians_ms: tuple[float, ...]
    method: str
    warmup_calls: int = 0
    timed_calls: int = 0


@dataclass(frozen=True)
class Mismatch:
    """One badly wrong element: where, what the kernel wrote, what was expected."""

    index: tuple[int, ...]
    got: float
    expected: float


@dataclass(frozen=True)
class OutputCheck:
    """The comparison of one output tensor."""

    name: str
    ok: bool
    problem: str = ""  # "shape", "dtype", "numerical" or ""
    detail: str = ""
    max_abs_error: float = 0.0
    max_rel_error: float = 0.0
    mismatched: int = 0
    non_finite: int = 0
    total: int = 0
    worst: tuple[Mismatch, ...] = field(default_factory=tuple)
    # The largest |out - ref| / (atol + rtol * |ref|) over the finite elements: at most 1 when
    # they all pass, else the factor the tolerance would have to grow by (inf where an exact
    # output differs). Says how far a failing kernel is, and what a task's tolerance asks.
    worst_ratio: float = 0.0


@dataclass(frozen=True)
class CheckReport:
    """The comparison of every output of one call on one input set."""

    stage: str
    workload: str
    outputs: tuple[OutputCheck, ...]

    @property
    def ok(self) -> bool:
        return all(o.ok for o in self.outputs)

    @property
    def first_problem(self) -> str:
        return next((o.problem for o in self.outputs if not o.ok), "")


@dataclass(frozen=True)
class SanitizerReport:
    """What one compute-sanitizer tool found in one call of the candidate."""

    tool: str
    ok: bool  # the tool ran to its summary; when False, ``reason`` says why
    errors: int = 0
    findings: tuple[str, ...] = ()
    reason: str = ""
    seconds: float = 0.0
    # Of ``seconds``, where the call's part went (``ptxgym.evaluate.single_call.call_seconds``).
    call_seconds: dict[str, float] = field(default_factory=dict)

    @property
    def clean(self) -> bool | None:
        """True or False when the tool ran; None when memory safety is unknown."""
        return self.errors == 0 if self.ok else None


@dataclass(frozen=True)
class KernelFacts:
    """Nsight Compute's summary of one profiled kernel launch (None where it was not reported,
    or not collected: the throughputs and occupancies are details, collected on request)."""

    name: str
    duration_us: float | None = None
    sm_throughput_pct: float | None = None
    memory_throughput_pct: float | None = None
    dram_throughput_pct: float | None = None
    achieved_occupancy_pct: float | None = None
    theoretical_occupancy_pct: float | None = None
    registers_per_thread: float | None = None
    grid_size: float | None = None
    block_size: float | None = None


@dataclass(frozen=True)
class InstructionProfile:
    """Executed SASS opcode counts of one call, and what they say about the target families."""

    ok: bool
    reason: str = ""  # why the profile is unknown, when it is
    # What counted: "ncu" (Nsight Compute's instrumented run), "cupti" (CUPTI's SASS metrics
    # in a run of ours, ptxgym.evaluate.count) or "sass" (nothing ran: the build's SASS holds
    # none of the target instructions, ``note`` says so).
    method: str = "ncu"
    # Why the method is not the one asked for (the judge fell back to Nsight Compute), or "".
    note: str = ""
    thread_counts: dict[str, int] = field(default_factory=dict)
    warp_counts: dict[str, int] = field(default_factory=dict)
    kernels: tuple[KernelFacts, ...] = ()
    families: dict[str, bool] = field(default_factory=dict)
    # The operator's floating-point work the compute family's instructions did, as a part of the
    # task's FLOP model on the profiled workload (``Task.flops``); None where not measured (a
    # shape the SASS text does not give, or per-opcode counts over instructions of different
    # shapes). Below ``min_coverage`` the compute family does not qualify.
    flops_executed: int | None = None
    coverage: float | None = None
    min_coverage: float = 0.0
    seconds: float = 0.0
    # Of ``seconds``, the part spent reading the report after Nsight Compute ended.
    read_seconds: float = 0.0
    # Of ``seconds``, where the profiled call's part went (``single_call.call_seconds``).
    call_seconds: dict[str, float] = field(default_factory=dict)
    # What Nsight Compute's audit of CUPTI counts found (ptxgym.evaluate.count_audit): "" when
    # not audited, "agreed: ...", "disagreed" (then ``ok`` is False and ``reason`` says how), or
    # "inconclusive: ..." when the audit could not be made.
    audit: str = ""

    @property
    def qualified(self) -> bool | None:
        """True or False when measured; None (unknown, never qualifying) when it failed. The
        compute family qualifies when it executed and, where its coverage was measured, did at
        least ``min_coverage`` of the operator's work; another family when it executed."""
        if not self.ok:
            return None
        computed = self.families.get("compute", False) and (
            self.coverage is None or self.coverage >= self.min_coverage
        )
        return computed or any(v for key, v in self.families.items() if key != "compute")


FAULT_RATIO = 0.8
"""A latency below this part of the bound is a measurement fault. Below 1, since the peaks are
the datasheets' at the boost clock, which a GPU may exceed a little."""


@dataclass(frozen=True)
class Peaks:
    """What a GPU can do at most, and where the numbers come from."""

    device: str
    tflops: float  # dense bf16 tensor-core TFLOP/s
    dram_gbps: float
    source: str


@dataclass(frozen=True)
class SpeedOfLight:
    """A timed call against the GPU's peaks (sums over the task's workloads)."""

    flops: int
    bytes: int
    latency_ms: float
    bound_ms: float
    limit: str  # "compute" or "memory": which peak sets the bound
    achieved_tflops: float
    achieved_gbps: float
    mfu: float  # achieved FLOP/s over the compute peak
    bandwidth_use: float  # achieved bytes/s over the DRAM peak
    peaks: Peaks

    @property
    def of_bound(self) -> float:
        """The latency in multiples of the bound (1 is the speed of light)."""
        return self.latency_ms / self.bound_ms

    @property
    def fault(self) -> bool:
        """Faster than the GPU can be: the timing missed work."""
        return self.latency_ms < FAULT_RATIO * self.bound_ms


class Status(StrEnum):
    """One status per step (DESIGN §4), from the earliest failing stage."""

    FORMAT_ERROR = "FORMAT_ERROR"
    POLICY_VIOLATION = "POLICY_VIOLATION"
    COMPILE_ERROR = "COMPILE_ERROR"
    COMPILED = "COMPILED"
    RUNTIME_ERROR = "RUNTIME_ERROR"
    TIMEOUT = "TIMEOUT"
    MEMORY_ERROR = "MEMORY_ERROR"
    INCORRECT_SHAPE = "INCORRECT_SHAPE"
    INCORRECT_DTYPE = "INCORRECT_DTYPE"
    INCORRECT_NUMERICAL = "INCORRECT_NUMERICAL"
    PASSED = "PASSED"

    @property
    def compiled(self) -> bool:
        """The candidate was built into a library."""
        return self not in (Status.FORMAT_ERROR, Status.POLICY_VIOLATION, Status.COMPILE_ERROR)

    @property
    def ran(self) -> bool:
        """The candidate ran to completion on the GPU (whatever its outputs)."""
        return self in (
            Status.INCORRECT_SHAPE,
            Status.INCORRECT_DTYPE,
            Status.INCORRECT_NUMERICAL,
            Status.PASSED,
        )

    @property
    def correct(self) -> bool:
        return self is Status.PASSED


@dataclass(frozen=True)
class Outcome:
    """Everything a step learned about one candidate.

    ``qualified`` is None when it is unknown (not profiled, or the profile failed): unknown never
    counts as qualified; ``profile`` holds the executed-opcode counts behind it. For a
    performance task (``instructions_required`` False) qualification does not apply and
    ``qualified`` is None; the reward and the metrics read that flag, never the None. Latencies are
    sums over the task's workloads and ``speedup`` is baseline over candidate; ``timings`` has
    each workload's figures. ``checks`` holds every output comparison made, the failing one last;
    ``sanitizers`` what compute-sanitizer's tools found. ``stage_seconds``: wall seconds per stage
    (compile, state, worker_start, checks_gpu_wait, correctness, checks_gpu: the worker's shared
    hold of the GPU for its checks, gpu_wait: waiting for the GPU alone, timing, worker_gpu: its
    hold of the GPU alone, from its timing to its end; memcheck, racecheck, profile,
    profile_read: the part of profile spent reading its report, and count_audit: Nsight
    Compute's audit of CUPTI counts, when one ran). Each tool run also says
    where its call's seconds went: ``memcheck_context``, ``memcheck_gpu_wait`` and
    ``memcheck_gpu`` (likewise for racecheck and profile; ``single_call.call_seconds``).
    ``isolation``: which confinement steps took effect in the worker (network_isolated,
    writes_confined, reads_confined, system_calls_filtered; see ptxgym.sandbox.isolation).
    ``tools_workload``: the workload whose inputs the sanitizers and the profile ran on (the
    task's first; a pooled task's other workloads are checked and timed but not covered by
    them); empty when none ran.
    """

    task_id: str
    status: Status
    message: str
    evaluator: str
    compile: CompileResult | None = None
    latency_ms: float | None = None
    baseline_latency_ms: float | None = None
    speedup: float | None = None
    qualified: bool | None = None
    # False for a performance task: no target instruction family is required (docs/tasks.md).
    instructions_required: bool = True
    checks: tuple[CheckReport, ...] = ()
    timings: tuple[WorkloadTiming, ...] = ()
    sanitizers: tuple[SanitizerReport, ...] = ()
    profile: InstructionProfile | None = None
    worker_log: str = ""
    seconds: float = 0.0
    stage_seconds: dict[str, float] = field(default_factory=dict)
    isolation: dict[str, bool] = field(default_factory=dict)
    tools_workload: str = ""
    # The timed workloads against the GPU's peaks (achieved TFLOP/s and GB/s, MFU, bandwidth
    # use, the roofline bound); None where nothing was timed or the device is not listed.
    speed_of_light: SpeedOfLight | None = None

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (``info`` and trajectory records use it)."""
        data = asdict(self)
        data["status"] = self.status.value
        return data
