"""The record of one evaluated step: its status and what each stage found."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any

from ptxgym.build.result import CompileResult
from ptxgym.evaluate.correctness import CheckReport
from ptxgym.evaluate.profile import InstructionProfile
from ptxgym.evaluate.roofline import SpeedOfLight
from ptxgym.evaluate.sanitizer import SanitizerReport
from ptxgym.evaluate.timing import WorkloadTiming


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
