"""The evaluator–judge channel without a GPU: a stand-in judge in a real judge process.

Requests from many threads are served concurrently and each answer reaches the thread that
asked; a request that fails fails alone; a queued request past its deadline expires; when the
judge process dies, whoever still waits gets an EvaluatorError instead of hanging; a judge that
cannot start says why. Everything crosses as JSON: the stand-in gets the registered task back.
"""

from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from ptxgym.evaluate.errors import EvaluatorError
from ptxgym.evaluate.judge_settings import JudgeSettings
from ptxgym.evaluate.local_gpu import _JudgeHandle
from ptxgym.evaluate.verdict import Verdict
from ptxgym.outcome import Status
from ptxgym.tasks import Task, get_task

GEMM = get_task("PTX-H100-GEMM")


class StandInJudge:
    """Answers ``evaluate(task, library)`` after the seconds that ``library`` starts with
    (``"0.5 first"``: half a second), naming what it was asked."""

    def __init__(self, device: int, settings: JudgeSettings) -> None:
        self.device_info = {"name": "stand-in", "device": device}

    def evaluate(self, task: Task, library: str, language: str = "cuda") -> Verdict:
        assert isinstance(task, Task)
        if library == "boom":
            raise ValueError("the stand-in was asked to fail")
        if library == "die":
            os._exit(3)
        time.sleep(float(library.split()[0]))
        return Verdict(Status.PASSED, f"{task.id}: {library}")

    def baseline_ms(self, task: Task) -> dict[str, float]:
        return {workload.name: 1.0 for workload in task.workloads}

    def close(self) -> None:
        pass


@pytest.fixture
def handle() -> _JudgeHandle:
    judge = _JudgeHandle.local(0, JudgeSettings(concurrency=4), factory=f"{__name__}:StandInJudge")
    yield judge
    judge.close()


def test_answers_reach_the_thread_that_asked_and_requests_overlap(handle: _JudgeHandle) -> None:
    assert handle.info == {"name": "stand-in", "device": 0}
    started = time.perf_counter()
    with ThreadPoolExecutor(max_workers=8) as pool:
        futures = [
            pool.submit(lambda i: handle.evaluate(GEMM, f"0.5 #{i}").result(), index)
            for index in range(8)
        ]
        verdicts = [future.result() for future in futures]
    assert [v.message for v in verdicts] == [f"{GEMM.id}: 0.5 #{index}" for index in range(8)]
    # 8 requests of 0.5 s, 4 at a time: about 1 s, not 4.
    assert time.perf_counter() - started < 3.0
    assert handle.baseline(GEMM).result() == {w.name: 1.0 for w in GEMM.workloads}


def test_a_failing_request_fails_alone(handle: _JudgeHandle) -> None:
    bad = handle.evaluate(GEMM, "boom")
    good = handle.evaluate(GEMM, "0")
    with pytest.raises(EvaluatorError, match="asked to fail"):
        bad.result(timeout=30)
    assert good.result(timeout=30).status is Status.PASSED


def test_a_request_past_its_deadline_expires(handle: _JudgeHandle) -> None:
    expired = handle.evaluate(GEMM, "0", deadline=time.time() - 1)
    with pytest.raises(EvaluatorError, match="deadline"):
        expired.result(timeout=30)


def test_a_dead_judge_fails_pending_requests(handle: _JudgeHandle) -> None:
    slow = handle.evaluate(GEMM, "5")
    handle.evaluate(GEMM, "die")
    with pytest.raises(EvaluatorError, match="stopped before answering"):
        slow.result(timeout=30)
    assert handle.process is not None
    handle.process.wait(timeout=10)
    assert not handle.alive


class BrokenJudge:
    """A judge whose constructor fails, as the real one does on a host without a GPU."""

    def __init__(self, device: int, settings: JudgeSettings) -> None:
        raise RuntimeError("no GPU here")


def test_a_judge_that_cannot_start_says_why() -> None:
    with pytest.raises(EvaluatorError, match="failed to start: RuntimeError: no GPU here"):
        _JudgeHandle.local(0, JudgeSettings(concurrency=1), factory=f"{__name__}:BrokenJudge")
