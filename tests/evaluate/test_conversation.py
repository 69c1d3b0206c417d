"""The judge's conversation with a worker, on the CPU: the worker's real service in a thread
(its GPU stood in for by CPU tensors) against the judge's real ``Conversation``."""

from __future__ import annotations

import multiprocessing
import os
import time
from dataclasses import replace
from multiprocessing.connection import Connection
from typing import Any

import pytest

from ptxgym.evaluate import worker_protocol as protocol
from ptxgym.evaluate.conversation import Conversation
from ptxgym.evaluate.correctness import check_outputs
from ptxgym.evaluate.judge_settings import JudgeSettings
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
from ptxgym.tasks import Task, WorkloadSpec, get_task

GEMM = get_task("PTX-H100-GEMM")

SMALL = WorkloadSpec(name="small", axes={"M": 16, "N": 8, "K": 32})
SMALL_GEMM = GEMM.model_copy(update={"workloads": [SMALL]})
SHORT = JudgeSettings(stage_timeout_s=10.0, warmup=2, iters=5, trials=3)
HANG_S = 3.0


def _cpu_inputs(seed: int) -> dict[str, Any]:
    import torch

    generator = torch.Generator().manual_seed(seed)
    return {
        "A": torch.randn(16, 32, generator=generator).bfloat16(),
        "B": torch.randn(8, 32, generator=generator).bfloat16(),
    }


class _CpuEntry:
    """Stands in for the candidate's library: C = A·Bᵀ on the CPU; ``failing_call`` (counted
    from the first call of all) returns CUDA's illegal-address error instead."""

    failing_call: int | None = None
    hanging_call: int | None = None  # this call takes HANG_S, as a hung kernel would

    def __init__(self, library: str, task: Task) -> None:
        self.calls = 0

    def __call__(self, inputs: Any, outputs: Any, axes: Any, stream: int) -> int:
        self.calls += 1
        if self.calls == self.failing_call:
            return 700
        if self.calls == self.hanging_call:
            time.sleep(HANG_S)
        product = inputs["A"].float() @ inputs["B"].float().T
        outputs["C"].copy_(product.bfloat16())
        return 0


class _CpuChecks:
    """The judge's checks on the CPU, against references made from the seeds."""

    def __init__(self, states: list[WorkloadState], plans: dict[str, TimingPlan]) -> None:
        self.seeds = {stage.name: stage.seed for stage in states[0].stages}
        self.plans = plans

    def stage(self, workload: str, stage: str, outputs: dict[str, Any]) -> CheckReport:
        return self._compare(stage, outputs, self.seeds[stage])

    def timed_call(self, workload: str, call: int, outputs: dict[str, Any]) -> CheckReport:
        return self._compare(f"timed call {call}", outputs, self.plans[workload].seed + call)

    def _compare(self, label: str, outputs: dict[str, Any], seed: int) -> CheckReport:
        inputs = _cpu_inputs(seed)
        reference = {"C": inputs["A"].float() @ inputs["B"].float().T}
        copies = {name: tensor.clone() for name, tensor in outputs.items()}
        return check_outputs(SMALL_GEMM, label, "small", SMALL.axes, copies, reference)


def _serve_on_the_cpu(conn: Connection) -> None:
    """A worker's part after its start-up (``worker_main``): the job, the arena, the service,
    and the error message for an exception; the worker's own timer, without CUPTI."""
    import torch

    from ptxgym.evaluate import worker
    from ptxgym.evaluate.timing import Timer

    job, _ = channel.receive(conn)
    arena = channel.Arena.attach(conn, int(job["arena_bytes"]))
    timer = Timer.__new__(Timer)  # its device part stood in for: no flush, no CUPTI
    timer.torch, timer.cupti, timer._phases = torch, None, {}
    timer._reset_l2 = lambda: True  # type: ignore[method-assign]
    try:
        worker._serve(conn, job, timer, arena)
    except OSError:
        pass  # the judge gave up on it (a hang) and closed its end, as a real one is killed
    except Exception as exc:
        channel.send(conn, {"kind": "error", "message": worker.error_text(exc)})
    finally:
        arena.close()
        conn.close()


@pytest.fixture
def cpu_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    """The worker's GPU stood in for: CPU inputs from the seeds, CPU outputs, the candidate's
    library by ``_CpuEntry``, and CUDA's streams and synchronisations by nothing."""
    import contextlib
    from types import SimpleNamespace

    import torch

    from ptxgym.evaluate import worker

    def outputs(task: Task, axes: dict[str, int]) -> dict[str, Any]:
        buffers = {"C": torch.empty(axes["M"], axes["N"], dtype=torch.bfloat16)}
        worker.poison(buffers)
        return buffers

    monkeypatch.setattr(worker, "Entry", _CpuEntry)
    monkeypatch.setattr(worker, "make_inputs", lambda task, load, seed, outliers: _cpu_inputs(seed))
    monkeypatch.setattr(worker, "allocate_outputs", outputs)
    monkeypatch.setattr(torch.cuda, "Stream", lambda: SimpleNamespace(cuda_stream=0))
    monkeypatch.setattr(torch.cuda, "stream", lambda stream: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)


def _evaluate_on_the_cpu(settings: JudgeSettings = SHORT) -> Verdict:
    """The worker's real service in a thread, against the judge's real conversation."""
    import threading

    state = WorkloadState(
        SMALL,
        [CheckStage(f"trial{i}", 10 + i, False) for i in range(3)]
        + [CheckStage("outliers", 20, True)],
        baseline_ms=1.0,
        baseline_method="cupti",
    )
    plans = {"small": TimingPlan(seed=1000, checked=frozenset({3, 9, 16}))}
    judge_end, worker_end = multiprocessing.Pipe()
    job = worker_job(SMALL_GEMM, "candidate.so", [state], plans, settings)
    arena = channel.Arena.create(output_bytes(SMALL_GEMM, SMALL))
    job["arena_bytes"] = arena.size
    thread = threading.Thread(target=_serve_on_the_cpu, args=(worker_end,), daemon=True)
    thread.start()
    try:
        channel.send(judge_end, job)
        arena.share(judge_end, os.getpid())
        checks = _CpuChecks([state], plans)
        return Conversation(
            SMALL_GEMM, [state], plans, settings, checks, judge_end, arena, {}, lambda: "ended"
        ).run()
    finally:
        judge_end.close()
        thread.join(timeout=30)
        arena.close()


@pytest.mark.usefixtures("cpu_worker")
def test_the_workers_conversation_is_the_one_the_judge_expects() -> None:
    verdict = _evaluate_on_the_cpu()
    assert verdict.status is Status.PASSED, verdict.message
    assert [check.stage for check in verdict.checks][4:] == [
        "timed call 3",
        "timed call 9",
        "timed call 16",
    ]
    (timing,) = verdict.timings
    assert timing.method == "host-sync" and timing.latency_ms > 0


@pytest.mark.usefixtures("cpu_worker")
def test_an_entry_point_failing_while_timed_is_a_runtime_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The 4 correctness calls, 2 warm-up calls, then the failing one: timed call 2.
    monkeypatch.setattr(_CpuEntry, "failing_call", 7)
    verdict = _evaluate_on_the_cpu()
    assert verdict.status is Status.RUNTIME_ERROR
    assert verdict.message.startswith("the entry point returned 700 (")
    assert verdict.message.endswith(") while being timed")


@pytest.mark.usefixtures("cpu_worker")
@pytest.mark.parametrize("call", [2, 6], ids=["correctness", "timed"])
def test_a_hanging_call_ends_at_the_call_bound_not_the_stage_deadline(
    monkeypatch: pytest.MonkeyPatch, call: int
) -> None:
    """The stage may take 10 s, one call max(0.3 s, 100 x the library's 1 ms) = 0.3 s."""
    monkeypatch.setattr(_CpuEntry, "hanging_call", call)
    settings = replace(SHORT, call_timeout_floor_s=0.3, call_timeout_ratio=100.0)
    started = time.perf_counter()
    verdict = _evaluate_on_the_cpu(settings)
    assert verdict.status is Status.TIMEOUT, verdict.message
    assert verdict.message.startswith("no progress within 0.3 s during small/")
    assert "max(0.3 s, 100 x the library's time)" in verdict.message
    # The judge gave up at the bound; the rest is the stand-in worker's sleep ending.
    assert time.perf_counter() - started < HANG_S + 2


def test_the_call_bound_follows_the_library_and_stays_within_the_stage() -> None:
    state = WorkloadState(SMALL, [], baseline_ms=40.0, baseline_method="cupti")
    judge_end, _ = multiprocessing.Pipe()
    conversation = Conversation(
        SMALL_GEMM,
        [state],
        {"small": TimingPlan(1, frozenset())},
        SHORT,
        _CpuChecks([state], {}),
        judge_end,
        channel.Arena.create(64),
        {},
        lambda: "ended",
    )
    due = protocol.Due(protocol.RAN, "small", call=3)
    # 1000 x 40 ms = 40 s, beyond the floor of 5 s, cut to the 10 s stage deadline.
    assert 9.0 < conversation.message_timeout(due) <= 10.0
    small = replace(SHORT, stage_timeout_s=300.0)
    conversation.settings = small
    assert conversation.message_timeout(due) == pytest.approx(40.0)
    conversation.baselines = {"small": 1.0}
    assert conversation.message_timeout(due) == pytest.approx(5.0)  # the floor
    conversation.arena.close()
