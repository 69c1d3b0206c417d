"""The judge's pieces that need no GPU: cached baselines, the worker log's tail, workers that
cannot start, how workers are started, the output arena's size, out-of-memory errors, and
attempts made again."""

from __future__ import annotations

import multiprocessing
import os
import re
import sys
import time
from dataclasses import replace
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import pytest

from ptxgym.evaluate import judge as judge_module
from ptxgym.evaluate import worker_process
from ptxgym.evaluate.baselines import baseline_key, cached_baseline, store_baseline
from ptxgym.evaluate.judge import Judge
from ptxgym.evaluate.judge_settings import JudgeSettings
from ptxgym.evaluate.verdict import Verdict
from ptxgym.evaluate.worker import WORKER_IMPORTS
from ptxgym.evaluate.worker_process import WorkerProcess, WorkerStartError, worker_context
from ptxgym.evaluate.workload_state import (
    CheckStage,
    WorkloadState,
    output_bytes,
)
from ptxgym.outcome import SanitizerReport, Status
from ptxgym.tasks import Task, get_task

GEMM = get_task("PTX-H100-GEMM")


def test_cached_baselines_are_keyed_by_every_axis_and_the_protocol() -> None:
    device = {
        "name": "H200",
        "driver": "580",
        "torch": "2.11",
        "cuda": "13.0",
        "cudnn": 91900,
        "timing_method": "cupti",
    }
    keys = {
        baseline_key(device, {}, get_task(task_id), get_task(task_id).workloads[0], protocol)
        for task_id in ("PTX-H100-MHAFwd-d64", "PTX-H100-MHAFwd-d96", "PTX-H100-MHAFwd-d128")
        for protocol in (
            {"warmup": 10, "iters": 50, "trials": 3},
            {"warmup": 10, "iters": 5, "trials": 3},
        )
    }
    assert len(keys) == 6


def test_a_stored_baseline_is_read_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PTXGYM_CACHE", str(tmp_path))
    assert cached_baseline("k") is None
    store_baseline("k", 1.25, "cupti")
    store_baseline("other", 2.0, "host-sync")
    assert cached_baseline("k") == (1.25, "cupti")
    assert cached_baseline("other") == (2.0, "host-sync")


def test_only_the_end_of_a_huge_worker_log_is_read(tmp_path: Path) -> None:
    log = tmp_path / "worker.log"
    log.write_bytes(b"x" * 5_000_000 + b"\nFatal Python error: Segmentation fault\n")
    worker = WorkerProcess.__new__(WorkerProcess)  # no process: only the log is needed
    worker.log_path = log
    tail = worker.log_tail()
    assert tail.endswith("Fatal Python error: Segmentation fault")
    assert len(tail) <= 2000


def _worker_that_says(line: str) -> Any:
    """A stand-in for ``worker_main`` that writes ``line`` to its log and ends before it is
    ready."""

    def worker(
        conn: object, device: int, log_path: str, home: str, gpu_lock: str, use_cupti: bool
    ) -> None:

        with open(log_path, "a") as log:
            log.write(line + "\n")
        os._exit(1)

    return worker


# A host where CUDA cannot start in the worker, and one whose GPU memory someone else holds.
_broken_worker = _worker_that_says("RuntimeError: cudaGetDeviceCount(): Error 304: OS call failed")
_worker_without_memory = _worker_that_says("torch.AcceleratorError: CUDA error: out of memory")


def _judge_starting_workers(tmp_path: Path, free_memory: int) -> Judge:
    """A judge with no CUDA of its own (only its worker starts are exercised) whose GPU has
    ``free_memory`` bytes free; forked workers, so that a stand-in reaches the child."""
    import threading

    judge = Judge.__new__(Judge)
    judge.context = multiprocessing.get_context("fork")
    judge.device, judge.folder, judge.spares = 0, tmp_path / "judge", []
    judge.settings = JudgeSettings()
    judge._mutex = threading.Lock()
    judge.torch = _torch_with_free_memory(free_memory)
    return judge


def _torch_with_free_memory(free: int) -> Any:
    """What the judge asks torch about the GPU's memory, answered with ``free`` bytes free."""
    import types

    cuda = types.SimpleNamespace(mem_get_info=lambda device: (free, 80 << 30))
    return types.SimpleNamespace(cuda=cuda)


def test_a_worker_that_cannot_start_fails_the_request_with_its_own_words(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PTXGYM_LOCK_DIR", str(tmp_path / "locks"))
    monkeypatch.setattr(worker_process, "worker_main", _broken_worker)
    judge = _judge_starting_workers(tmp_path, 8 << 30)
    with pytest.raises(WorkerStartError, match=r"failed to start.*\(2 starts\).*Error 304"):
        judge._take_worker()
    assert not list((tmp_path / "judge").glob("worker-*"))  # both workers cleaned up


def test_a_worker_that_finds_no_memory_is_started_again_until_a_deadline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PTXGYM_LOCK_DIR", str(tmp_path / "locks"))
    monkeypatch.setattr(judge_module, "_MEMORY_WAIT_S", 1.0)
    monkeypatch.setattr(judge_module, "_MEMORY_PAUSE_S", 0.1)
    for stand_in, free in ((_worker_without_memory, 8 << 30), (_broken_worker, 100 << 20)):
        # Out of memory in its own words, or the GPU nearly full whatever it said.
        monkeypatch.setattr(worker_process, "worker_main", stand_in)
        judge = _judge_starting_workers(tmp_path, free)
        started = time.monotonic()
        with pytest.raises(WorkerStartError, match=r"\((\d+) starts\)") as raised:
            judge._take_worker()
        # Pauses of 0.1, 0.2, 0.4 and 0.8 s fit before the deadline: more than the usual two.
        found = re.search(r"\((\d+) starts\)", str(raised.value))
        assert found is not None and int(found.group(1)) >= 3
        assert time.monotonic() - started >= 1.0
        assert not list((tmp_path / "judge").glob("worker-*"))


def test_workload_states_are_kept_within_the_memory_budget(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import collections
    import threading

    import torch

    from ptxgym.evaluate.judge import Judge
    from ptxgym.evaluate.judge_settings import JudgeSettings

    monkeypatch.setenv("PTXGYM_CACHE", str(tmp_path))
    judge = Judge.__new__(Judge)  # no GPU: states are built by the stand-in below
    judge.settings = JudgeSettings(state_budget_bytes=3000)
    judge.device = 0
    judge.states = collections.OrderedDict()
    judge._state_locks = {}
    judge._mutex = threading.Lock()
    built: list[str] = []

    def build(task: object, workload: object) -> WorkloadState:
        name = f"w{len(built)}"
        built.append(name)
        stage = CheckStage("trial0", 1, False, {"C": torch.zeros(250, dtype=torch.float32)})
        return WorkloadState(GEMM.workloads[0].model_copy(update={"name": name}), [stage], 1, "")

    monkeypatch.setattr(judge, "_build_state", build)
    workloads = [GEMM.workloads[0].model_copy(update={"name": f"w{i}"}) for i in range(4)]
    for workload in workloads[:3]:  # 1000 bytes each: all three fit
        judge.workload_state(GEMM, workload)
    judge.workload_state(GEMM, workloads[0])  # reused, and now the most recently used
    judge.workload_state(GEMM, workloads[3])  # over budget: the least recently used (w1) goes
    assert built == ["w0", "w1", "w2", "w3"]
    assert [key[1] for key in judge.states] == ["w2", "w0", "w3"]
    judge.workload_state(GEMM, workloads[1])  # rebuilt when needed again
    assert built[-1] == "w4"


def test_the_output_arena_fits_every_tasks_outputs() -> None:
    from ptxgym.tasks import registry

    gemm = GEMM.workloads[0]
    # C is [M, N] bf16: 8192 * 8192 * 2 bytes, already aligned.
    assert output_bytes(GEMM, gemm) == 8192 * 8192 * 2
    for task in registry().values():
        for workload in task.workloads:
            assert output_bytes(task, workload) > 0


def _report_imports(conn: Connection) -> None:
    """In a started worker process: which of a worker's imports were there when it began."""
    conn.send(sorted(name for name in WORKER_IMPORTS if name in sys.modules))


@pytest.mark.parametrize("fork", [True, False], ids=["forked", "spawned"])
def test_forked_workers_begin_with_their_imports_done(fork: bool) -> None:
    # A fresh worker imports Python's and torch's modules again (most of a start-up's CPU time
    # on the H200 host); one forked from the judge's forkserver has them already.
    context = worker_context(fork)
    parent, child = context.Pipe()
    process = context.Process(target=_report_imports, args=(child,))
    process.start()
    child.close()
    assert parent.poll(120)
    imported = parent.recv()
    process.join(timeout=30)
    assert process.exitcode == 0
    assert ("torch" in imported) is fork


# ------------------------------------------------------------------------------------------
def test_an_out_of_memory_error_passes_on_only_the_size_asked_for() -> None:
    from ptxgym.evaluate.worker import error_text

    # torch's text, as on a shared GPU: every other process, with its PID and memory use.
    class OutOfMemoryError(RuntimeError):
        pass

    text = (
        "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 139.81 GiB "
        "of which 1.06 GiB is free. Process 4242 has 70.12 GiB memory in use. Process 4343 has "
        "64.00 GiB memory in use. Of the allocated memory 68.00 GiB is allocated by PyTorch."
    )
    message = error_text(OutOfMemoryError(text))
    assert message == "OutOfMemoryError: the GPU ran out of memory (tried to allocate 2.00 GiB)"
    assert error_text(ValueError("bad\nsecond line")) == "ValueError: bad"


_OOM_FINDING = (
    '========= Program hit cudaErrorMemoryAllocation (error 2) due to "out of memory" on CUDA '
    "API call to cudaMalloc."
)
_WRITE_FINDING = "========= Invalid __global__ write of size 2 bytes at gemm_kernel+0x1b0"


@pytest.mark.parametrize(
    ("first", "ended_sharing", "retried"),
    [
        (Verdict(Status.TIMEOUT, "no progress within 5.0 s"), True, True),
        (Verdict(Status.TIMEOUT, "no progress within 5.0 s"), False, False),
        (
            Verdict(Status.RUNTIME_ERROR, "OutOfMemoryError: the GPU ran out of memory"),
            True,
            True,
        ),
        (Verdict(Status.RUNTIME_ERROR, "an illegal memory access was encountered"), True, False),
        (
            Verdict(
                Status.MEMORY_ERROR,
                "memcheck found 1 error",
                sanitizers=(SanitizerReport("memcheck", True, 1, (_OOM_FINDING,)),),
            ),
            False,
            True,
        ),
        (
            Verdict(
                Status.MEMORY_ERROR,
                "memcheck found 2 errors",
                sanitizers=(SanitizerReport("memcheck", True, 2, (_OOM_FINDING, _WRITE_FINDING)),),
            ),
            False,
            False,
        ),
        (Verdict(Status.INCORRECT_NUMERICAL, "3 of 64 elements outside tolerance"), True, False),
    ],
    ids=[
        "hang_beside_others",
        "hang_alone",
        "out_of_memory",
        "illegal_address",
        "memcheck_out_of_memory",
        "memcheck_real_error",
        "wrong",
    ],
)
def test_a_failure_that_sharing_may_explain_is_judged_again_alone(
    first: Verdict, ended_sharing: bool, retried: bool
) -> None:
    """Checks share the GPU with other evaluations: a check's call overrunning its bound, or
    memory missing, could be another candidate's doing, so it is tried once more with the
    checks holding the GPU alone, whose verdict stands; any other failure is final."""
    judge = object.__new__(Judge)
    judge.device = 0
    judge.torch = _torch_with_free_memory(64 << 30)
    attempts: list[bool] = []
    alone = Verdict(Status.PASSED, "correct", seconds=2.0, stage_seconds={"worker_gpu": 1.0})

    def once(task: Task, library: str, language: str, checks_alone: bool) -> tuple[Verdict, bool]:
        attempts.append(checks_alone)
        return (alone, False) if checks_alone else (replace(first, seconds=3.0), ended_sharing)

    judge._evaluate_once = once  # type: ignore[method-assign]
    verdict = judge.evaluate(GEMM, "candidate.so")
    if retried:
        assert attempts == [False, True]
        assert verdict.status is Status.PASSED and verdict.seconds == 5.0
        assert verdict.stage_seconds == {"worker_gpu": 1.0, "shared_attempt": 3.0}
    else:
        assert attempts == [False]
        assert verdict.status is first.status


def test_an_attempt_whose_judge_side_work_finds_no_memory_is_made_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import types

    monkeypatch.setattr(judge_module, "_MEMORY_PAUSE_S", 0.01)
    judge = Judge.__new__(Judge)  # no GPU: the attempt itself is a stand-in
    judge.torch = types.SimpleNamespace(cuda=types.SimpleNamespace(empty_cache=lambda: None))
    failures = [RuntimeError("CUDA error: out of memory") for _ in range(2)]

    def attempt(*args: object, **kwargs: object) -> tuple[Verdict, bool]:
        if failures:
            raise failures.pop(0)
        return Verdict(Status.PASSED, "correct"), False

    monkeypatch.setattr(judge, "_evaluate_once", attempt)
    verdict = judge.evaluate(get_task("PTX-H100-GEMM"), "candidate.so")
    assert verdict.status is Status.PASSED
    assert verdict.stage_seconds["judge_memory_wait"] == pytest.approx(0.03)

    # Any other error of the judge's is raised at once, as is one that outlasts the wait.
    failures.append(RuntimeError("CUDA error: an illegal memory access was encountered"))
    with pytest.raises(RuntimeError, match="illegal memory access"):
        judge.evaluate(get_task("PTX-H100-GEMM"), "candidate.so")
    monkeypatch.setattr(judge_module, "_MEMORY_WAIT_S", 0.0)
    failures.append(RuntimeError("CUDA error: out of memory"))
    with pytest.raises(RuntimeError, match="out of memory"):
        judge.evaluate(get_task("PTX-H100-GEMM"), "candidate.so")


def test_a_retry_for_want_of_memory_waits_until_the_gpu_has_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Holding the GPU alone frees no memory that another candidate's worker still holds: the
    retry waits until the inputs and outputs fit (twice over) beside a worker's start."""
    import types

    monkeypatch.setattr(judge_module, "_MEMORY_PAUSE_S", 0.01)
    judge = object.__new__(Judge)
    judge.device = 0
    free = [100 << 20, 100 << 20, 64 << 30]  # two looks find 100 MB free, the third plenty
    cuda = types.SimpleNamespace(mem_get_info=lambda device: (free.pop(0), 80 << 30))
    judge.torch = types.SimpleNamespace(cuda=cuda)
    oom = Verdict(Status.RUNTIME_ERROR, "CUDA error: out of memory", seconds=1.0)

    def once(task: Task, library: str, language: str, checks_alone: bool) -> tuple[Verdict, bool]:
        return (Verdict(Status.PASSED, "correct"), False) if checks_alone else (oom, True)

    judge._evaluate_once = once  # type: ignore[method-assign]
    verdict = judge.evaluate(GEMM, "candidate.so")
    assert verdict.status is Status.PASSED and not free
    assert verdict.stage_seconds["memory_wait"] == pytest.approx(0.03)
