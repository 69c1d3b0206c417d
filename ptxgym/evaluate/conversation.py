"""The judge's side of one evaluation's conversation with its worker: every message taken against
the protocol's script, outputs checked, the timed loop bounded by the judge's own clock."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from multiprocessing.connection import Connection
from typing import Any, Protocol

from ptxgym.evaluate import worker_protocol as protocol
from ptxgym.evaluate.judge_settings import JudgeSettings
from ptxgym.evaluate.verdict import Verdict, incorrect_verdict, passed_verdict
from ptxgym.evaluate.workload_state import TimingPlan, WorkloadState
from ptxgym.outcome import CheckReport, Status, WorkloadTiming
from ptxgym.sandbox import channel
from ptxgym.tasks import Task


class CheckUnavailable(Exception):
    """Outputs the judge could not check, for a reason of the candidate's making (the message
    says which)."""


class OutputChecks(Protocol):
    """How a conversation checks outputs: the judge's own, on the GPU
    (``ptxgym.evaluate.reference_checks``), or a test's. ``outputs`` may be views of the arena,
    valid during the call only."""

    def stage(self, workload: str, stage: str, outputs: dict[str, Any]) -> CheckReport: ...

    def timed_call(self, workload: str, call: int, outputs: dict[str, Any]) -> CheckReport: ...


class Conversation:
    """The judge's side of one evaluation's conversation with its worker.

    Each message is taken against the protocol's script
    (``ptxgym.evaluate.worker_protocol.Script``). Outputs are checked (``checks``), and the arena
    zeroed where they lay, before the answer. Each call of a timed loop is timed on the judge's own
    clock, the worker's timing is bounded by it (``protocol.judged_latency``), and the latency is
    the judge's reading of the claimed call times. Ends in a verdict: PASSED on ``done``, or the
    first failure, broken protocol included. Needs no GPU itself: a test can drive it with a
    stand-in worker."""

    def __init__(
        self,
        task: Task,
        states: list[WorkloadState],
        plans: dict[str, TimingPlan],
        settings: JudgeSettings,
        checks: OutputChecks,
        conn: Connection,
        arena: channel.Arena,
        stages: dict[str, float],
        ended: Callable[[], str],
        before_timing: Callable[[], None] = lambda: None,
    ) -> None:
        """``stages``: the evaluation's stage seconds, to which the correctness and timing
        stages (and the timing's parts, as the worker reported them) are added. ``ended``: how
        the worker's process ended, once its end of the channel is closed. ``before_timing``:
        called once every check has passed, before the worker is told to go on to its timing
        (the judge takes the GPU alone there)."""
        self.settings = settings
        self.before_timing = before_timing
        self.checks = checks
        self.conn = conn
        self.arena = arena
        self.stages = stages
        self.ended = ended
        self.baselines = {state.spec.name: state.baseline_ms for state in states}
        self.script = protocol.Script(
            [
                protocol.WorkloadScript(
                    state.spec.name,
                    tuple(stage.name for stage in state.stages),
                    protocol.output_layouts(task, state.spec),
                    plans[state.spec.name].checked,
                )
                for state in states
            ],
            tuple(task.definition.inputs),
            settings.warmup,
            settings.iters,
            settings.trials,
        )
        self.reports: list[CheckReport] = []
        self.timings: list[WorkloadTiming] = []
        self.started = time.perf_counter()
        # The judge's clock: when it last answered (the worker does nothing new before it has
        # the answer); for each call of the timed loop under way, that time and the arrival of
        # its ``calling``; and what it saw of each call that ran.
        self.answered = self.started
        self.calling: dict[int, tuple[float, float]] = {}
        self.clocks: dict[int, protocol.CallClock] = {}

    def message_timeout(self, due: protocol.Due) -> float:
        """How long the judge waits for the message ``due``: one call's bound
        (``JudgeSettings.call_timeout_floor_s`` and ``call_timeout_ratio``), within what is left
        of the stage's deadline."""
        left = self.settings.stage_timeout_s - (time.perf_counter() - self.started)
        # A message of no one workload (the end) is bounded by the slowest workload's library.
        baseline_ms = self.baselines.get(due.workload, max(self.baselines.values(), default=0.0))
        bound = max(
            self.settings.call_timeout_floor_s,
            self.settings.call_timeout_ratio * baseline_ms / 1e3,
        )
        return max(0.0, min(bound, left))

    def run(self) -> Verdict:
        """Take the worker's messages until it is done, fails, hangs or breaks the protocol."""
        due = self.script.due
        timeout = self.message_timeout(due)
        try:
            while True:
                due = self.script.due
                timeout = self.message_timeout(due)
                header, tensors = channel.receive(self.conn, self.arena, timeout)
                arrived = time.perf_counter()
                message = self.script.accept(header, tensors)
                if isinstance(message, protocol.WorkerError):
                    return self._verdict(Status.RUNTIME_ERROR, message.message)
                verdict = self._take(message, arrived)
                if verdict is not None:
                    return verdict
        except channel.ChannelTimeout:  # before ChannelError, which it is
            settings = self.settings
            return self._verdict(
                Status.TIMEOUT,
                f"no progress within {timeout:.1f} s during {due.where}: the kernel hangs or is "
                f"far too slow (a call may take at most max({settings.call_timeout_floor_s:g} s, "
                f"{settings.call_timeout_ratio:g} x the library's time), and the whole stage "
                f"{settings.stage_timeout_s:g} s)",
            )
        except (protocol.ProtocolError, channel.ChannelError) as exc:
            return self._verdict(
                Status.RUNTIME_ERROR,
                f"the process running the kernel broke the judge's protocol when {due} was "
                f"due: {exc}",
            )
        except (EOFError, OSError):
            return self._verdict(
                Status.RUNTIME_ERROR,
                f"the process running the kernel {self.ended()} during {due.where}",
            )
        except (CheckUnavailable, protocol.TimingDisagreement) as exc:
            return self._verdict(Status.RUNTIME_ERROR, str(exc))

    def _take(self, message: protocol.Message, arrived: float) -> Verdict | None:
        """Act on a message the script took, and answer it when it wants an answer; a verdict
        when the evaluation ends there."""
        due = message.due
        if due.kind == protocol.CALLING:
            self.calling[due.call] = (self.answered, arrived)
            return None
        if due.kind == protocol.RAN:
            since, called = self.calling.pop(due.call)
            self.clocks[due.call] = protocol.CallClock(
                (arrived - since) * 1e3, (arrived - called) * 1e3
            )
            # The script knows whether this call's outputs are due next.
            self._answer("keep" if self.script.due.kind == protocol.TIMED_CHECK else "next")
            return None
        if due.kind == protocol.CHECK:
            return self._check(message, self.checks.stage(due.workload, due.stage, message.outputs))
        if due.kind == protocol.TIMED_CHECK:
            report = self.checks.timed_call(due.workload, due.call, message.outputs)
            return self._check(message, report)
        if due.kind == protocol.TIMING:
            self._timing(message)
            return None
        return passed_verdict(self.reports, self.timings)

    def _check(self, message: protocol.Message, report: CheckReport) -> Verdict | None:
        """Judge one checked call, its outputs copied out and compared (``report``)."""
        # Nothing of the outputs may stay where the worker could name it again.
        self.arena.wipe()
        self.reports.append(report)
        where = message.due.where
        if message.modified_inputs:
            return self._verdict(
                Status.INCORRECT_NUMERICAL,
                f"the kernel modified its input(s) {', '.join(message.modified_inputs)} "
                f"({where}); inputs are read-only",
            )
        if not report.ok:
            verdict = incorrect_verdict(report, tuple(self.reports))
            if message.due.kind == protocol.TIMED_CHECK:
                verdict = replace(
                    verdict,
                    message=f"{verdict.message}; the correctness stage passed, but this call "
                    "of the timed loop (fresh inputs) was wrong: the result depends on earlier "
                    "calls (state kept between calls, a race, uninitialised memory) or on "
                    "being timed",
                )
            return verdict
        if message.due.kind == protocol.CHECK and self.script.due.kind != protocol.CHECK:
            self.stages["correctness"] = time.perf_counter() - self.started
            self.before_timing()
        self._answer("continue")
        return None

    def _timing(self, message: protocol.Message) -> None:
        """Take a workload's timing, bounded by what the judge saw of its calls."""
        workload = message.due.workload
        timed = self.script.schedule.timed
        judged = protocol.judged_latency(
            message.call_ms,
            [self.clocks[call] for call in timed],
            self.settings.iters,
            self.settings.trials,
            timed_calls=timed,
            allowance_ms=self.settings.host_allowance_ms,
            allowance_ratio=self.settings.host_allowance_ratio,
        )
        self.clocks.clear()
        baseline, latency = self.baselines[workload], judged.latency_ms
        self.timings.append(
            WorkloadTiming(
                workload,
                latency,
                baseline,
                baseline / latency,
                judged.trial_medians_ms,
                message.method,
                self.settings.warmup,
                self.settings.iters,
            )
        )
        if self.script.due.kind == protocol.DONE:
            self.stages["timing"] = (
                time.perf_counter() - self.started - self.stages.get("correctness", 0.0)
            )
        # What the host allowance bounds, to see how near honest calls come to it.
        host_side = (judged.wall_latency_ms - latency) / 1e3
        self.stages["timing_host_side"] = self.stages.get("timing_host_side", 0.0) + host_side
        for phase, seconds in message.phase_seconds.items():
            key = f"timing_{phase}"
            self.stages[key] = self.stages.get(key, 0.0) + seconds
        self._answer("continue")

    def _answer(self, kind: str) -> None:
        self.answered = time.perf_counter()
        channel.send(self.conn, {"kind": kind})

    def _verdict(self, status: Status, message: str) -> Verdict:
        return Verdict(status, message, tuple(self.reports), tuple(self.timings))
