"""The judge's rules for its conversation with a worker: which message is due next, what each
must hold, and how far a worker's timing may be believed.

Candidate host code runs inside the worker, next to the worker's end of the channel: it can
write frames on the channel's socket and read all of the worker's memory, so any message may be
forged. The judge therefore knows the whole conversation in advance (``Script``) and takes a
message only when it is the one due next, each once, in order, with exactly its fields, and, for
outputs, exactly the task's tensors (names, dtypes, shapes):

1. for each workload in turn, one ``check`` per correctness stage, in order: the outputs of a
   call on the stage's inputs, and the inputs that call changed (``modified_inputs``);
2. for each workload in turn, its timed loop. For every call, warm-up included: ``calling``
   right before the call (no answer), and ``ran`` once it is over and the device synchronised.
   The judge answers ``ran`` with ``keep`` for the timed calls whose outputs it checks (chosen
   before the loop, and told only once the call is over) and ``next`` for the others. A
   ``keep`` is followed at once by that call's ``timed-check``: its outputs, before any other
   call runs. After the loop, one ``timing``: every timed call's device time;
3. one ``done``.

The judge answers ``continue`` to each ``check``, ``timed-check`` and ``timing``. An ``error``
may come at any point: it ends the evaluation as a RUNTIME_ERROR with the worker's words,
whatever they say. Anything else (an unknown kind, another workload, stage or call, a repeat, a
missing or extra field, other tensors) breaks the protocol: ``ProtocolError``, raised before the
script moves on, so ``Script.due`` names the message that was due.

What the worker claims of time is bounded by the judge's own clock (``judged_latency``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ptxgym.evaluate.timing import TIMING_METHODS, TIMING_PHASES, CallSchedule, latency_of
from ptxgym.tasks import Task, WorkloadSpec

if TYPE_CHECKING:
    import torch

# What an ``error`` may say, at most: the feedback shows it.
MAX_ERROR_CHARS = 2000
# The judge's clock (perf_counter) and the worker's timer (CUPTI's device timestamps, or the
# worker's perf_counter in the fallback) are different clocks, read at different points: a
# claimed call may pass the judge's bracket of it by this much before it is impossible.
_CLOCK_SLACK_MS = 0.05
_CLOCK_RATE_SLACK = 1e-3

# The kinds of message a worker sends; each of the script's steps is one of them.
CHECK, CALLING, RAN, TIMED_CHECK, TIMING, DONE, ERROR = (
    "check",
    "calling",
    "ran",
    "timed-check",
    "timing",
    "done",
    "error",
)
_FIELDS = {
    CHECK: frozenset({"kind", "workload", "stage", "modified_inputs"}),
    CALLING: frozenset({"kind", "workload", "call"}),
    RAN: frozenset({"kind", "workload", "call"}),
    TIMED_CHECK: frozenset({"kind", "workload", "call"}),
    TIMING: frozenset({"kind", "workload", "method", "call_ms", "phase_seconds"}),
    DONE: frozenset({"kind"}),
    ERROR: frozenset({"kind", "message"}),
}
_WITH_OUTPUTS = (CHECK, TIMED_CHECK)


class ProtocolError(Exception):
    """The worker sent something other than the message due, or claimed the impossible."""


class TimingDisagreement(Exception):
    """The worker's timing and the judge's clock disagree by more than a call's host side
    may add; the message says by how much."""


# A tensor as the protocol expects it: its dtype's name and its shape.
Layout = tuple[str, tuple[int, ...]]


def output_layouts(task: Task, workload: WorkloadSpec) -> dict[str, Layout]:
    """The task's outputs for ``workload``: name -> (dtype, shape)."""
    axes = task.axis_values(workload)
    return {
        name: (spec.dtype, tuple(axes[axis] for axis in spec.shape))
        for name, spec in task.definition.outputs.items()
    }


@dataclass(frozen=True)
class WorkloadScript:
    """One workload's part of the conversation: its correctness stages in order, its outputs,
    and the timed calls (indices from the first warm-up call) whose outputs the judge keeps."""

    name: str
    stages: tuple[str, ...]
    outputs: Mapping[str, Layout]
    kept: frozenset[int]


@dataclass(frozen=True)
class Due:
    """One message of the script: its kind, and the workload, stage or call it is about."""

    kind: str
    workload: str = ""
    stage: str = ""
    call: int = -1
    warmup: bool = False

    @property
    def where(self) -> str:
        """The part of the evaluation this message closes, as the feedback names it."""
        if self.kind == CHECK:
            return f"{self.workload}/{self.stage}"
        if self.kind in (CALLING, RAN, TIMED_CHECK):
            return f"{self.workload}/{'warm-up' if self.warmup else 'timed'} call {self.call}"
        if self.kind == TIMING:
            return f"{self.workload}/timing"
        return "the end of the evaluation"

    def __str__(self) -> str:
        return {
            CHECK: f"the check of {self.where}",
            CALLING: f"'calling' before {self.where}",
            RAN: f"'ran' after {self.where}",
            TIMED_CHECK: f"the outputs of {self.where}",
            TIMING: f"the timing of {self.workload}",
        }.get(self.kind, "'done'")


@dataclass(frozen=True)
class Message:
    """A message the script took: the step it was, and what it carried."""

    due: Due
    outputs: dict[str, torch.Tensor] = field(default_factory=dict)  # check, timed-check
    modified_inputs: tuple[str, ...] = ()  # check
    method: str = ""  # timing
    call_ms: tuple[float, ...] = ()  # timing
    phase_seconds: dict[str, float] = field(default_factory=dict)  # timing


@dataclass(frozen=True)
class WorkerError:
    """The worker's own report that the candidate failed (a CUDA error, an exception)."""

    message: str


class Script:
    """The whole conversation the judge expects from one worker, message by message."""

    def __init__(
        self,
        workloads: Sequence[WorkloadScript],
        inputs: Sequence[str],
        warmup: int,
        iters: int,
        trials: int,
    ) -> None:
        self.schedule = CallSchedule(warmup, iters, trials)
        self.timed_calls = iters * trials
        self._inputs = frozenset(inputs)
        self._outputs = {workload.name: workload.outputs for workload in workloads}
        self._steps = _steps(workloads, self.schedule)
        self._next = 0

    @property
    def due(self) -> Due:
        """The message due next."""
        return self._steps[self._next]

    def accept(
        self, header: Mapping[str, Any], tensors: Mapping[str, torch.Tensor]
    ) -> Message | WorkerError:
        """The message, if it is the one due (or an ``error``); a ProtocolError otherwise."""
        kind = header.get("kind")
        if kind == ERROR:
            _exact_fields(header, ERROR)
            _no_tensors(tensors)
            text = header["message"]
            if not isinstance(text, str):
                raise ProtocolError("an 'error' whose message is not text")
            return WorkerError(text[:MAX_ERROR_CHARS])
        due = self.due
        if kind != due.kind:
            raise ProtocolError(f"a message of kind {_shown(kind)} came instead")
        _exact_fields(header, due.kind)
        if "workload" in header and header["workload"] != due.workload:
            raise ProtocolError(f"it names workload {_shown(header['workload'])}")
        message = self._read(due, header, tensors)
        self._next += 1
        return message

    def _read(
        self, due: Due, header: Mapping[str, Any], tensors: Mapping[str, torch.Tensor]
    ) -> Message:
        if due.kind in _WITH_OUTPUTS:
            _exact_outputs(tensors, self._outputs[due.workload])
        else:
            _no_tensors(tensors)
        if due.kind == CHECK:
            if header["stage"] != due.stage:
                raise ProtocolError(f"it names stage {_shown(header['stage'])}")
            return Message(due, dict(tensors), modified_inputs=self._modified(header))
        if due.kind in (CALLING, RAN, TIMED_CHECK):
            call = header["call"]
            if type(call) is not int or call != due.call:
                raise ProtocolError(f"it names call {_shown(call)}")
            return Message(due, dict(tensors))
        if due.kind == TIMING:
            method = header["method"]
            if method not in TIMING_METHODS:
                raise ProtocolError(f"timing method {_shown(method)} is not one of ours")
            return Message(
                due,
                method=str(method),
                call_ms=_call_times(header["call_ms"], self.timed_calls),
                phase_seconds=_phase_seconds(header["phase_seconds"]),
            )
        return Message(due)

    def _modified(self, header: Mapping[str, Any]) -> tuple[str, ...]:
        names = header["modified_inputs"]
        if (
            not isinstance(names, list)
            or not all(isinstance(name, str) and name in self._inputs for name in names)
            or len(set(names)) != len(names)
        ):
            raise ProtocolError("'modified_inputs' is not a list of distinct input names")
        return tuple(names)


def _steps(workloads: Sequence[WorkloadScript], schedule: CallSchedule) -> list[Due]:
    steps = [Due(CHECK, w.name, stage=stage) for w in workloads for stage in w.stages]
    for workload in workloads:
        for call in range(schedule.calls):
            warming = not schedule.is_timed(call)
            steps.append(Due(CALLING, workload.name, call=call, warmup=warming))
            steps.append(Due(RAN, workload.name, call=call, warmup=warming))
            if call in workload.kept and not warming:
                steps.append(Due(TIMED_CHECK, workload.name, call=call))
        steps.append(Due(TIMING, workload.name))
    steps.append(Due(DONE))
    return steps


def _shown(value: object) -> str:
    """A value the worker sent, as an error message may quote it (briefly: it is the
    worker's)."""
    return repr(value)[:60]


def _exact_fields(header: Mapping[str, Any], kind: str) -> None:
    expected = _FIELDS[kind]
    if set(header) != expected:
        missing = sorted(expected - set(header))
        extra = sorted(str(name)[:40] for name in set(header) - expected)
        raise ProtocolError(f"{kind!r} message with fields missing {missing} and extra {extra}")


def _no_tensors(tensors: Mapping[str, torch.Tensor]) -> None:
    if tensors:
        raise ProtocolError(f"tensors {sorted(tensors)[:8]} on a message that carries none")


def _exact_outputs(tensors: Mapping[str, torch.Tensor], layouts: Mapping[str, Layout]) -> None:
    if set(tensors) != set(layouts):
        raise ProtocolError(
            f"tensors {sorted(tensors)[:8]}, where the task's outputs are {sorted(layouts)}"
        )
    for name, (dtype, shape) in layouts.items():
        tensor = tensors[name]
        got = (str(tensor.dtype).removeprefix("torch."), tuple(tensor.shape))
        if got != (dtype, shape):
            raise ProtocolError(
                f"output {name!r} is {got[0]} {list(got[1])}, the task's is {dtype} {list(shape)}"
            )


def _call_times(value: object, count: int) -> tuple[float, ...]:
    """Every timed call's device time: ``count`` finite, positive numbers of milliseconds."""
    if not isinstance(value, list) or len(value) != count:
        got = len(value) if isinstance(value, list) else type(value).__name__
        raise ProtocolError(f"'call_ms' holds {got} call times, not the {count} timed calls'")
    for time_ms in value:
        if type(time_ms) not in (int, float) or not math.isfinite(time_ms) or time_ms <= 0:
            raise ProtocolError(f"a call time of {_shown(time_ms)} ms")
    return tuple(float(time_ms) for time_ms in value)


def _phase_seconds(value: object) -> dict[str, float]:
    """The timing's host seconds by part (``ptxgym.evaluate.timing.TIMING_PHASES``); nothing is
    judged on them, but they must be what they say."""
    if not isinstance(value, dict) or not set(value) <= set(TIMING_PHASES):
        raise ProtocolError("'phase_seconds' is not a map of the timing's phases")
    for seconds in value.values():
        if type(seconds) not in (int, float) or not math.isfinite(seconds) or seconds < 0:
            raise ProtocolError(f"a timing phase of {_shown(seconds)} s")
    return {str(phase): float(seconds) for phase, seconds in value.items()}


@dataclass(frozen=True)
class CallClock:
    """What the judge's own clock saw of one call, in milliseconds.

    ``bracket_ms``: from the judge's last answer before the call (the worker cannot start the
    call before it has that answer) to the arrival of ``ran`` (sent after the call was over): the
    call lies inside it, however late the judge read either message. ``wall_ms``: from the
    arrival of ``calling`` to the arrival of ``ran``: the call's wall time as near as the judge
    can see it, its host side (launches, the synchronisation, the two messages) included."""

    bracket_ms: float
    wall_ms: float


@dataclass(frozen=True)
class JudgedTiming:
    """A workload's timing as the judge reads it, in milliseconds: the trial medians and the
    latency of the claimed call times, and the latency of the calls' wall times."""

    trial_medians_ms: tuple[float, ...]
    latency_ms: float
    wall_latency_ms: float


def judged_latency(
    claimed_ms: Sequence[float],
    clocks: Sequence[CallClock],
    iters: int,
    trials: int,
    *,
    timed_calls: Sequence[int],
    allowance_ms: float,
    allowance_ratio: float,
) -> JudgedTiming:
    """The trial medians and latency of the timed calls' claimed device times (the formula
    ``ptxgym.evaluate.timing.Timer.measure`` uses), once they are bounded by the judge's clock.

    A call claimed longer than its bracket is impossible (``ProtocolError``). And the calls'
    wall time (the same formula over ``wall_ms``) may exceed the claimed latency only by what a
    call's host side adds, at most ``max(allowance_ms, allowance_ratio x latency)``: beyond it
    the calls spent time the device timer does not see, or the claim was forged
    (``TimingDisagreement``). ``timed_calls``: the timed calls' numbers (``CallSchedule``), in
    the order of ``claimed_ms`` and ``clocks``."""
    for call, claim, clock in zip(timed_calls, claimed_ms, clocks, strict=True):
        if claim > clock.bracket_ms * (1 + _CLOCK_RATE_SLACK) + _CLOCK_SLACK_MS:
            raise ProtocolError(
                f"timed call {call} is claimed to have taken {claim:.4f} ms of "
                f"device time, but it lay within {clock.bracket_ms:.4f} ms of the judge's clock"
            )
    medians, latency = latency_of(claimed_ms, iters, trials)
    _, wall = latency_of([clock.wall_ms for clock in clocks], iters, trials)
    allowed = max(allowance_ms, allowance_ratio * latency)
    if wall - latency > allowed:
        raise TimingDisagreement(
            f"the timed calls took {wall:.4f} ms each on the judge's clock (from the word "
            f"before each call to the word after it; the mean of the trial medians), but the "
            f"process running the kernel claimed {latency:.4f} ms of device time, more than "
            f"the {allowed:.2f} ms a call's host side may add: the calls did work the device "
            "timer does not see (host code computing part of the result, waiting, allocating), "
            "or the timing was forged"
        )
    return JudgedTiming(medians, latency, wall)
