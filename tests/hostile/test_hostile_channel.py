"""Forged conversations on the judge–worker channel, through the judge's real conversation code.

Candidate host code runs inside the worker, next to the worker's end of the channel: it can write
framed messages on the channel's socket and read all of the worker's memory. Here a stand-in worker
(a thread holding the other end of a real multiprocessing Pipe and a real Arena, with CPU tensors
and no GPU) speaks the protocol (``ptxgym.evaluate.worker_protocol``) to the judge's
``Conversation``, honestly or with one forgery per test, each a class of attack: repeated, skipped
or reordered messages, ``done`` or an unknown kind anywhere, an ``error`` naming PASSED, outputs
never asked for or sent twice, other tensors, impossible or forged timings, malformed fields. Every
forgery must end non-PASSED with a message that says what broke; the honest conversation must end
PASSED with the latency the judge computed itself.
"""

from __future__ import annotations

import json
import math
import multiprocessing
import os
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

import pytest

from ptxgym.evaluate.conversation import Conversation
from ptxgym.evaluate.correctness import check_outputs
from ptxgym.evaluate.judge import Judge
from ptxgym.evaluate.judge_settings import JudgeSettings
from ptxgym.evaluate.timing import CallSchedule, latency_of
from ptxgym.evaluate.verdict import Verdict
from ptxgym.evaluate.workload_state import (
    CheckStage,
    TimingPlan,
    WorkloadState,
    output_bytes,
    worker_job,
)
from ptxgym.outcome import CheckReport, Status
from ptxgym.sandbox import channel
from ptxgym.tasks import WorkloadSpec, get_task

torch = pytest.importorskip("torch")

SMALL = WorkloadSpec(name="small", axes={"M": 16, "N": 8, "K": 32})
TASK = get_task("PTX-H100-GEMM").model_copy(update={"workloads": [SMALL]})
SETTINGS = JudgeSettings(stage_timeout_s=10.0, warmup=2, iters=5, trials=3)
# Each trial 2 warm-up calls, then 5 timed: 2..6, 9..13, 16..20.
SCHEDULE = CallSchedule(SETTINGS.warmup, SETTINGS.iters, SETTINGS.trials)
CALLS = SCHEDULE.calls
PLAN = TimingPlan(seed=1000, checked=frozenset({4, 9, 16}))
FIRST_UNCHECKED_TIMED = 2
PROTOCOL = "broke the judge's protocol"

Tensors = dict[str, Any]
Frame = tuple[dict[str, Any], Tensors | None]
# The tensors of a frame that replays the arena: the header names the offsets of the last
# outputs sent, and nothing is written there.
REPLAY: Tensors = {"replay": None}
# The tensors of a frame that stops within itself: only a length is written, of a message that
# never comes.
PARTIAL: Tensors = {"partial": None}


class ThroughPipe(dict[str, Any]):
    """Tensors sent as frames on the pipe after the header, not in the arena."""


# ------------------------------------------------------------------------------------------
# Inputs, outputs and references of the small GEMM, all on the CPU


def outputs_for(seed: int) -> Tensors:
    """The right outputs of a call on the inputs of ``seed`` (C = A·Bᵀ, in bfloat16)."""
    return {"C": reference_for(seed)["C"].bfloat16()}


def reference_for(seed: int) -> Tensors:
    generator = torch.Generator().manual_seed(seed)
    a = torch.randn(16, 32, generator=generator).bfloat16().float()
    b = torch.randn(8, 32, generator=generator).bfloat16().float()
    return {"C": a @ b.T}


def state() -> WorkloadState:
    stages = [CheckStage(f"trial{i}", 10 + i, False) for i in range(3)]
    stages.append(CheckStage("outliers", 20, True))
    return WorkloadState(SMALL, stages, baseline_ms=1.0, baseline_method="cupti")


class CpuChecks:
    """The judge's checks, made on the CPU: the outputs copied out, compared with references
    made from the stage's seed or the timed call's."""

    def __init__(self, states: list[WorkloadState], plans: dict[str, TimingPlan]) -> None:
        self.seeds = {(s.spec.name, st.name): st.seed for s in states for st in s.stages}
        self.plans = plans

    def stage(self, workload: str, stage: str, outputs: Tensors) -> CheckReport:
        return self._compare(workload, stage, outputs, self.seeds[workload, stage])

    def timed_call(self, workload: str, call: int, outputs: Tensors) -> CheckReport:
        return self._compare(
            workload, f"timed call {call}", outputs, self.plans[workload].seed + call
        )

    def _compare(self, workload: str, label: str, outputs: Tensors, seed: int) -> CheckReport:
        copies = {name: tensor.clone() for name, tensor in outputs.items()}
        axes = TASK.axis_values(SMALL)
        return check_outputs(TASK, label, workload, axes, copies, reference_for(seed))


# ------------------------------------------------------------------------------------------
# The stand-in worker


def kind(name: str, **fields: Any) -> Callable[[dict[str, Any]], bool]:
    """Matches the honest messages of kind ``name`` with these field values."""
    return lambda header: (
        header["kind"] == name and all(header.get(key) == value for key, value in fields.items())
    )


@dataclass(frozen=True)
class Rewrite:
    """A forgery: the first honest message ``match`` accepts is sent as ``forge`` makes it."""

    match: Callable[[dict[str, Any]], bool]
    forge: Callable[[Frame], list[Frame]]


def before(match: Callable[[dict[str, Any]], bool], header: dict[str, Any]) -> Rewrite:
    """``header`` slipped in before the first honest message ``match`` accepts."""
    return Rewrite(match, lambda frame: [(header, None), frame])


def edit(match: Callable[[dict[str, Any]], bool], **fields: Any) -> Rewrite:
    """The first honest message ``match`` accepts, with these fields changed."""
    return Rewrite(match, lambda frame: [({**frame[0], **fields}, frame[1])])


def without(match: Callable[[dict[str, Any]], bool], name: str) -> Rewrite:
    """The first honest message ``match`` accepts, without the field ``name``."""
    return Rewrite(
        match, lambda frame: [({k: v for k, v in frame[0].items() if k != name}, frame[1])]
    )


def with_tensors(match: Callable[[dict[str, Any]], bool], tensors: Tensors) -> Rewrite:
    """The first honest message ``match`` accepts, carrying ``tensors`` instead."""
    return Rewrite(match, lambda frame: [(frame[0], tensors)])


def twice(match: Callable[[dict[str, Any]], bool]) -> Rewrite:
    return Rewrite(match, lambda frame: [frame, frame])


@dataclass
class StandIn:
    """A worker that speaks the protocol from its job, honestly but for ``rewrites``.

    Each call of the timed loops sleeps ``call_s`` and is claimed to have taken ``claim`` of
    the milliseconds it measured itself. It notes which calls the judge kept, and whether the
    arena held only zeros after each answer to outputs it sent."""

    conn: Connection
    rewrites: tuple[Rewrite, ...] = ()
    call_s: float = 0.0005
    claim: Callable[[float], float] = lambda measured_ms: measured_ms
    stop_after: int | None = None  # messages sent, then silence (the conn stays open)
    claims: list[float] = field(default_factory=list)
    kept: list[int] = field(default_factory=list)
    arena_zeroed: list[bool] = field(default_factory=list)
    applied: set[int] = field(default_factory=set)
    sent: int = 0

    def run(self) -> None:
        job = channel.receive(self.conn)[0]
        self.arena = channel.Arena.attach(self.conn, int(job["arena_bytes"]))
        try:
            self._converse(job)
        except (EOFError, OSError, channel.ChannelError):
            pass  # the judge ended the evaluation and hung up, or the forgery hangs up
        finally:
            self.arena.close()
            self.conn.close()  # what a worker's end does as its process ends

    def _converse(self, job: dict[str, Any]) -> None:
        for workload in job["workloads"]:
            for stage in workload["checks"]:
                header = {"kind": "check", "workload": workload["name"], "stage": stage["name"]}
                self._send({**header, "modified_inputs": []}, outputs_for(stage["seed"]))
                self._answer()
        for workload in job["workloads"]:
            name, seed = workload["name"], int(workload["timing"]["seed"])
            timed: list[float] = []
            schedule = CallSchedule(job["warmup"], job["iters"], job["trials"])
            for call in range(schedule.calls):
                self._send({"kind": "calling", "workload": name, "call": call})
                started = time.perf_counter()
                time.sleep(self.call_s)
                measured_ms = (time.perf_counter() - started) * 1e3
                if schedule.is_timed(call):
                    timed.append(self.claim(measured_ms))
                self._send({"kind": "ran", "workload": name, "call": call})
                if self._answer() == "keep":
                    self.kept.append(call)
                    header = {"kind": "timed-check", "workload": name, "call": call}
                    self._send(header, outputs_for(seed + call))
                    self._answer()
            self.claims = timed
            timing = {"kind": "timing", "workload": name, "method": "cupti", "call_ms": timed}
            self._send({**timing, "phase_seconds": {"calls": 0.01, "messages": 0.002}})
            self._answer()
        self._send({"kind": "done"})

    def _send(self, header: dict[str, Any], tensors: Tensors | None = None) -> None:
        frames: list[Frame] = [(header, tensors)]
        for index, rewrite in enumerate(self.rewrites):
            if index not in self.applied and rewrite.match(header):
                self.applied.add(index)
                frames = rewrite.forge((header, tensors))
                break
        for frame_header, frame_tensors in frames:
            if self.stop_after is not None and self.sent >= self.stop_after:
                # Silent, its end of the channel open, until the judge gives up and hangs up.
                self.conn.poll(60)
            self.sent += 1
            if frame_tensors is REPLAY:
                # The offsets of the task's one output, nothing written there.
                layout = [{"name": "C", "dtype": "bfloat16", "shape": [16, 8], "offset": 0}]
                self.conn.send_bytes(json.dumps({**frame_header, "tensors": layout}).encode())
            elif frame_tensors is PARTIAL:
                os.write(self.conn.fileno(), (256).to_bytes(4, "big"))
            elif isinstance(frame_tensors, ThroughPipe):
                channel.send(self.conn, frame_header, frame_tensors)
            else:
                channel.send(self.conn, frame_header, frame_tensors, self.arena)

    def _answer(self) -> str:
        answer = str(channel.receive(self.conn)[0]["kind"])
        assert self.arena.buffer is not None
        self.arena_zeroed.append(not any(bytes(self.arena.buffer)))
        return answer


def converse(
    settings: JudgeSettings = SETTINGS, **stand_in: Any
) -> tuple[Verdict, StandIn, dict[str, float]]:
    """One evaluation's conversation: the judge's real one against a stand-in worker thread."""
    judge_end, worker_end = multiprocessing.Pipe()
    states = [state()]
    plans = {SMALL.name: PLAN}
    job = worker_job(TASK, "candidate.so", states, plans, settings)
    # Room for more than the task's outputs, so that forgeries with other tensors fit.
    arena = channel.Arena.create(4 * output_bytes(TASK, SMALL))
    job["arena_bytes"] = arena.size
    worker = StandIn(worker_end, **stand_in)
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    stages: dict[str, float] = {}
    try:
        channel.send(judge_end, job)
        arena.share(judge_end, os.getpid())
        checks = CpuChecks(states, plans)
        conversation = Conversation(
            TASK, states, plans, settings, checks, judge_end, arena, stages, lambda: "ended"
        )
        verdict = conversation.run()
    finally:
        judge_end.close()  # a stand-in still waiting for an answer sees the end
        thread.join(timeout=70)
        arena.close()
    assert not thread.is_alive()
    return verdict, worker, stages


# ------------------------------------------------------------------------------------------
# The honest conversation


def test_an_honest_worker_passes_with_the_latency_the_judge_computed() -> None:
    verdict, worker, stages = converse()
    assert verdict.status is Status.PASSED, verdict.message
    # The four stages, then the three timed calls the judge kept, told only after each ran.
    assert worker.kept == sorted(PLAN.checked)
    stage_names = [check.stage for check in verdict.checks]
    assert stage_names == ["trial0", "trial1", "trial2", "outliers"] + [
        f"timed call {call}" for call in sorted(PLAN.checked)
    ]
    medians, latency = latency_of(worker.claims, SETTINGS.iters, SETTINGS.trials)
    (timing,) = verdict.timings
    assert timing.latency_ms == latency and timing.trial_medians_ms == medians
    assert timing.speedup == pytest.approx(1.0 / latency)
    assert timing.method == "cupti"
    # The record says which protocol timed it: the judge's, whatever the worker was told.
    assert (timing.warmup_calls, timing.timed_calls) == (SETTINGS.warmup, SETTINGS.iters)
    # Nothing the worker wrote in the arena outlived the judge's reading of it.
    assert len(worker.arena_zeroed) == len(verdict.checks) + CALLS + 1
    assert all(worker.arena_zeroed)
    assert stages["correctness"] > 0 and stages["timing"] > 0
    assert abs(stages["timing_host_side"]) < SETTINGS.host_allowance_ms / 1e3
    assert stages["timing_calls"] == 0.01 and stages["timing_messages"] == 0.002


def test_the_judge_picks_only_timed_calls_and_never_tells_them_ahead() -> None:
    judge = Judge.__new__(Judge)  # no GPU: only the plan is drawn
    judge.settings = SETTINGS
    timed = set(SCHEDULE.timed)
    plans = [judge._timing_plan() for _ in range(200)]
    assert all(len(plan.checked) == SETTINGS.timed_checks <= len(timed) for plan in plans)
    assert set().union(*(plan.checked for plan in plans)) == timed  # every timed call, no other
    job = worker_job(TASK, "candidate.so", [state()], {SMALL.name: PLAN}, SETTINGS)
    assert job["workloads"][0]["timing"] == {"seed": PLAN.seed}


# ------------------------------------------------------------------------------------------
# Forgeries: each ends non-PASSED, saying that the protocol broke


# Where a message is slipped in: before the first honest message of each kind.
POSITIONS = {
    "before_first_check": kind("check", stage="trial0"),
    "before_a_later_check": kind("check", stage="outliers"),
    "before_warmup_calling": kind("calling", call=0),
    "before_timed_ran": kind("ran", call=FIRST_UNCHECKED_TIMED),
    "before_kept_outputs": kind("timed-check"),
    "before_timing": kind("timing"),
    "before_done": kind("done"),
}
INTRUDERS: dict[str, dict[str, Any]] = {
    "done_early": {"kind": "done"},
    "unknown_kind": {"kind": "verdict", "status": "PASSED"},
    "no_kind": {"workload": "small", "status": "PASSED"},
    "error_naming_passed": {"kind": "error", "status": "PASSED", "message": "all checks passed"},
    "passed_field_on_done": {"kind": "done", "status": "PASSED"},
}


@pytest.mark.parametrize(
    ("position", "intruder"),
    [
        (position, intruder)
        for position in POSITIONS
        for intruder in INTRUDERS
        # A 'done' where 'done' is due is the honest message.
        if (position, intruder) != ("before_done", "done_early")
    ],
)
def test_a_message_slipped_in_anywhere_breaks_the_protocol(position: str, intruder: str) -> None:
    verdict, _, _ = converse(rewrites=(before(POSITIONS[position], INTRUDERS[intruder]),))
    assert verdict.status is Status.RUNTIME_ERROR
    assert PROTOCOL in verdict.message


@pytest.mark.parametrize("position", list(POSITIONS))
def test_an_error_ends_the_evaluation_as_a_runtime_error_whatever_it_says(position: str) -> None:
    words = {"kind": "error", "message": "PASSED: correct on 7 checks; 0.0001 ms"}
    verdict, _, _ = converse(rewrites=(before(POSITIONS[position], words),))
    assert verdict.status is Status.RUNTIME_ERROR
    assert verdict.message == words["message"]


FORGERIES: dict[str, tuple[Rewrite, str]] = {
    # Correctness stage
    "check_repeated": (twice(kind("check", stage="trial0")), "names stage 'trial0'"),
    "check_replayed_from_the_arena": (
        Rewrite(kind("check", stage="trial1"), lambda f: [({**f[0], "stage": "trial0"}, REPLAY)]),
        "names stage 'trial0'",
    ),
    "check_stage_skipped": (edit(kind("check", stage="trial0"), stage="trial1"), "trial1"),
    "check_stage_unknown": (edit(kind("check", stage="outliers"), stage="trial3"), "trial3"),
    "check_other_workload": (edit(kind("check"), workload="large"), "large"),
    "check_without_modified_inputs": (without(kind("check"), "modified_inputs"), "missing"),
    "check_modified_inputs_not_inputs": (
        edit(kind("check"), modified_inputs=["C"]),
        "modified_inputs",
    ),
    "check_modified_inputs_repeated": (
        edit(kind("check"), modified_inputs=["A", "A"]),
        "modified_inputs",
    ),
    "check_modified_inputs_text": (edit(kind("check"), modified_inputs="A"), "modified_inputs"),
    "check_extra_field": (edit(kind("check"), latency_ms=0.0001), "extra"),
    # Outputs
    "outputs_missing": (with_tensors(kind("check"), {}), "outputs are ['C']"),
    "outputs_extra": (
        with_tensors(kind("check"), {**outputs_for(10), "D": torch.zeros(4)}),
        "outputs are ['C']",
    ),
    "outputs_renamed": (
        with_tensors(kind("check"), {"O": outputs_for(10)["C"]}),
        "outputs are ['C']",
    ),
    "outputs_other_dtype": (
        with_tensors(kind("check"), {"C": reference_for(10)["C"][:, :4]}),
        "'C' is float32 [16, 4]",
    ),
    "outputs_other_shape": (
        with_tensors(kind("check"), {"C": outputs_for(10)["C"][:8]}),
        "[8, 8]",
    ),
    "outputs_through_the_pipe": (
        with_tensors(kind("check"), ThroughPipe(outputs_for(10))),
        "'C' is not in the arena",
    ),
    "outputs_on_a_message_without": (
        with_tensors(kind("calling", call=0), outputs_for(10)),
        "carries none",
    ),
    "timed_outputs_missing": (with_tensors(kind("timed-check"), {}), "outputs are ['C']"),
    "timed_outputs_renamed": (
        with_tensors(kind("timed-check"), {"O": outputs_for(10)["C"]}),
        "outputs are ['C']",
    ),
    # The timed loop's calls
    "calling_skipped": (
        Rewrite(kind("calling", call=0), lambda frame: []),
        "'ran' came instead",
    ),
    "calling_repeated": (twice(kind("calling", call=3)), "came instead"),
    "calling_wrong_call": (edit(kind("calling", call=5), call=6), "call 6"),
    "calling_call_as_text": (edit(kind("calling", call=5), call="5"), "call '5'"),
    "calling_call_as_true": (edit(kind("calling", call=1), call=True), "call True"),
    "calling_call_as_float": (edit(kind("calling", call=1), call=1.0), "call 1.0"),
    "calling_extra_field": (edit(kind("calling"), device_ms=0.001), "extra"),
    "ran_repeated": (twice(kind("ran", call=3)), "came instead"),
    "ran_without_call": (without(kind("ran", call=3), "call"), "missing"),
    "ran_other_workload": (edit(kind("ran", call=3), workload="other"), "other"),
    # Outputs of timed calls the judge did not ask for, or asked for once
    "timed_check_not_asked": (
        Rewrite(
            kind("ran", call=FIRST_UNCHECKED_TIMED),
            lambda frame: [
                frame,
                (
                    {"kind": "timed-check", "workload": "small", "call": FIRST_UNCHECKED_TIMED},
                    outputs_for(PLAN.seed + FIRST_UNCHECKED_TIMED),
                ),
            ],
        ),
        "came instead",
    ),
    "timed_check_of_a_warmup_call": (
        Rewrite(
            kind("ran", call=0),
            lambda frame: [
                frame,
                ({"kind": "timed-check", "workload": "small", "call": 0}, outputs_for(PLAN.seed)),
            ],
        ),
        "came instead",
    ),
    "timed_check_twice": (twice(kind("timed-check")), "came instead"),
    "timed_check_other_call": (
        Rewrite(
            kind("timed-check", call=4),
            lambda frame: [({**frame[0], "call": 5}, outputs_for(PLAN.seed + 5))],
        ),
        "call 5",
    ),
    "timed_check_kept_back": (
        Rewrite(
            kind("timed-check", call=4),
            lambda frame: [({"kind": "calling", "workload": "small", "call": 5}, None)],
        ),
        "'calling' came instead",
    ),
    # The timing's form
    "timing_method_unknown": (edit(kind("timing"), method="trust-me"), "trust-me"),
    "timing_medians_instead": (
        Rewrite(
            kind("timing"),
            lambda f: [
                (
                    {
                        **{k: v for k, v in f[0].items() if k != "call_ms"},
                        "latency_ms": 1e-6,
                        "trial_medians_ms": [1e-6] * 3,
                    },
                    None,
                )
            ],
        ),
        "missing ['call_ms']",
    ),
    "timing_phase_unknown": (
        edit(kind("timing"), phase_seconds={"verdict": 1.0}),
        "phase_seconds",
    ),
    "timing_phase_negative": (edit(kind("timing"), phase_seconds={"calls": -1.0}), "-1.0"),
    "timing_repeated": (twice(kind("timing")), "came instead"),
    "done_twice_in_place_of_timing": (
        Rewrite(kind("timing"), lambda frame: [({"kind": "done"}, None)]),
        "came instead",
    ),
}


@pytest.mark.parametrize("forgery", list(FORGERIES))
def test_a_forged_message_breaks_the_protocol(forgery: str) -> None:
    rewrite, words = FORGERIES[forgery]
    verdict, _, _ = converse(rewrites=(rewrite,))
    assert verdict.status is Status.RUNTIME_ERROR, verdict.message
    assert PROTOCOL in verdict.message and words in verdict.message, verdict.message


def _call_times(forge: Callable[[list[float]], object]) -> Rewrite:
    """The timing, its call times as ``forge`` makes them from the honest ones."""
    return Rewrite(
        kind("timing"), lambda frame: [({**frame[0], "call_ms": forge(frame[0]["call_ms"])}, None)]
    )


CALL_TIME_FORGERIES: dict[str, tuple[Rewrite, str]] = {
    "one_fewer": (_call_times(lambda times: times[:-1]), "14 call times"),
    "one_more": (_call_times(lambda times: [*times, times[0]]), "16 call times"),
    "none": (_call_times(lambda times: []), "0 call times"),
    "a_number": (_call_times(lambda times: 0.001), "float call times"),
    "nan": (_call_times(lambda times: [math.nan, *times[1:]]), "nan ms"),
    "infinite": (_call_times(lambda times: [*times[:7], math.inf, *times[8:]]), "inf ms"),
    "negative": (_call_times(lambda times: [*times[:-1], -0.5]), "-0.5 ms"),
    "zero": (_call_times(lambda times: [0.0] * len(times)), "0.0 ms"),
    "text": (_call_times(lambda times: ["0.001", *times[1:]]), "'0.001' ms"),
    "boolean": (_call_times(lambda times: [True, *times[1:]]), "True ms"),
}


@pytest.mark.parametrize("forgery", list(CALL_TIME_FORGERIES))
def test_call_times_of_the_wrong_count_or_value_break_the_protocol(forgery: str) -> None:
    rewrite, words = CALL_TIME_FORGERIES[forgery]
    verdict, _, _ = converse(rewrites=(rewrite,))
    assert verdict.status is Status.RUNTIME_ERROR and verdict.timings == ()
    assert PROTOCOL in verdict.message and words in verdict.message, verdict.message


@pytest.mark.parametrize("call", [0, 7, 14], ids=["first", "middle", "last"])
def test_a_call_claimed_longer_than_the_judge_saw_it_is_impossible(call: int) -> None:
    # A call can take no longer than the time from the judge's answer that let the worker go
    # on to the arrival of its 'ran'.
    rewrite = _call_times(lambda times: [*times[:call], 1000.0, *times[call + 1 :]])
    verdict, _, _ = converse(rewrites=(rewrite,))
    assert verdict.status is Status.RUNTIME_ERROR and verdict.timings == ()
    assert PROTOCOL in verdict.message
    assert f"timed call {SCHEDULE.timed[call]} is claimed to have taken 1000.0000 ms" in (
        verdict.message
    )


@pytest.mark.parametrize(
    "claim",
    [lambda measured: 0.001, lambda measured: measured / 4],
    ids=["near_zero", "a_quarter"],
)
def test_a_timing_far_below_what_the_judge_saw_is_refused(claim: Callable[[float], float]) -> None:
    # Calls of 10 ms (a CPU computing the result, or a slow kernel), claimed much faster: the
    # judge's clock saw each call take 10 ms, more than the host side of a call may add.
    verdict, worker, _ = converse(call_s=0.01, claim=claim)
    assert verdict.status is Status.RUNTIME_ERROR and verdict.timings == ()
    claimed = latency_of(worker.claims, SETTINGS.iters, SETTINGS.trials)[1]
    assert f"claimed {claimed:.4f} ms of device time" in verdict.message
    assert re.search(r"took \d+\.\d{4} ms each on the judge's clock", verdict.message)


def test_skipped_work_with_replayed_outputs_and_a_forged_timing_fails() -> None:
    # The attack that got PASSED at a 35,000,000x speedup through the old conversation: skip
    # the work in the timed calls, claim almost no time, and for a checked call name the arena
    # where earlier outputs lay instead of writing new ones. The arena holds zeros by then.
    replay = Rewrite(kind("timed-check", call=4), lambda frame: [(frame[0], REPLAY)])
    verdict, _, _ = converse(rewrites=(replay,), call_s=0.0, claim=lambda measured: 1e-5)
    assert verdict.status is Status.INCORRECT_NUMERICAL and verdict.timings == ()
    assert verdict.message.startswith("small/timed call 4: C:")


def test_a_slow_call_claimed_at_its_own_time_passes() -> None:
    # The same 10 ms calls, honestly claimed, are a PASSED: the bound is not on slowness.
    verdict, _, _ = converse(call_s=0.01)
    assert verdict.status is Status.PASSED, verdict.message
    assert verdict.timings[0].latency_ms >= 10.0


# ------------------------------------------------------------------------------------------
# What already worked, kept: wrong outputs, changed inputs, hangs, a worker gone


def test_wrong_outputs_of_a_kept_timed_call_are_incorrect() -> None:
    wrong = with_tensors(kind("timed-check", call=9), outputs_for(PLAN.seed + 8))
    verdict, _, _ = converse(rewrites=(wrong,))
    assert verdict.status is Status.INCORRECT_NUMERICAL
    assert verdict.message.startswith("small/timed call 9:")
    assert "this call of the timed loop (fresh inputs) was wrong" in verdict.message


def test_a_kernel_that_modified_its_inputs_is_incorrect() -> None:
    modified = edit(kind("check", stage="trial1"), modified_inputs=["B"])
    verdict, _, _ = converse(rewrites=(modified,))
    assert verdict.status is Status.INCORRECT_NUMERICAL
    assert "modified its input(s) B (small/trial1)" in verdict.message


def test_a_silent_worker_times_out_where_it_stopped() -> None:
    settings = JudgeSettings(stage_timeout_s=0.5, warmup=2, iters=5, trials=3)
    verdict, _, _ = converse(settings, stop_after=4 + 2 * 3)  # the checks, 3 calls' words
    assert verdict.status is Status.TIMEOUT
    assert "during small/timed call 3: the kernel hangs" in verdict.message


@pytest.mark.parametrize("position", ["before_first_check", "before_timed_ran", "before_timing"])
def test_a_message_that_stops_within_itself_times_out(position: str) -> None:
    # A frame's length, and nothing more: the judge waits for the rest no longer than for a
    # whole message.
    settings = JudgeSettings(stage_timeout_s=0.5, warmup=2, iters=5, trials=3)
    stall = Rewrite(POSITIONS[position], lambda frame: [({}, PARTIAL)])
    started = time.perf_counter()
    verdict, _, _ = converse(settings, rewrites=(stall,))
    assert verdict.status is Status.TIMEOUT
    assert verdict.message.startswith("no progress within")
    assert time.perf_counter() - started < 10


def test_a_worker_gone_mid_conversation_is_a_runtime_error() -> None:
    def hang_up(frame: Frame) -> list[Frame]:
        raise OSError("the worker's end closed")

    verdict, _, _ = converse(rewrites=(Rewrite(kind("check", stage="trial2"), hang_up),))
    assert verdict.status is Status.RUNTIME_ERROR
    assert verdict.message == "the process running the kernel ended during small/trial2"
