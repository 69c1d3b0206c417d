"""The judge's pieces that need no GPU: cached baselines, the worker log's tail, workers that
cannot start, and how workers are started."""

from __future__ import annotations

import sys
from multiprocessing.connection import Connection
from pathlib import Path

import pytest

from ptxgym import judge as judge_module
from ptxgym.baselines import baseline_key, cached_baseline, store_baseline
from ptxgym.judge import Judge, JudgeSettings, WorkerStartError, _Worker, worker_context
from ptxgym.tasks import get_task
from ptxgym.worker import WORKER_IMPORTS

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
    worker = _Worker.__new__(_Worker)  # no process: only the log is needed
    worker.log_path = log
    tail = worker.log_tail()
    assert tail.endswith("Fatal Python error: Segmentation fault")
    assert len(tail) <= 2000


def _broken_worker(conn: object, device: int, log_path: str, home: str, gpu_lock: str) -> None:
    """Stands in for ``worker_main`` on a host where CUDA cannot start in the worker."""
    import os

    with open(log_path, "a") as log:
        log.write("RuntimeError: cudaGetDeviceCount(): Error 304: OS call failed\n")
    os._exit(1)


def test_a_worker_that_cannot_start_fails_the_request_with_its_own_words(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import multiprocessing
    import threading

    monkeypatch.setenv("PTXGYM_LOCK_DIR", str(tmp_path / "locks"))
    monkeypatch.setattr(judge_module, "worker_main", _broken_worker)
    judge = Judge.__new__(Judge)  # no CUDA: only the worker start is exercised
    judge.context = multiprocessing.get_context("fork")  # the stand-in reaches the child
    judge.device, judge.folder, judge.spares = 0, tmp_path / "judge", []
    judge.settings = JudgeSettings()
    judge._mutex = threading.Lock()
    with pytest.raises(WorkerStartError, match=r"failed to start twice.*Error 304"):
        judge._take_worker()
    assert not list((tmp_path / "judge").glob("worker-*"))  # both workers cleaned up


def test_workload_states_are_kept_within_the_memory_budget(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import collections
    import threading

    import torch

    from ptxgym.judge import Judge, JudgeSettings, _Stage, _WorkloadState

    monkeypatch.setenv("PTXGYM_CACHE", str(tmp_path))
    judge = Judge.__new__(Judge)  # no GPU: states are built by the stand-in below
    judge.settings = JudgeSettings(state_budget_bytes=3000)
    judge.device = 0
    judge.states = collections.OrderedDict()
    judge._state_locks = {}
    judge._mutex = threading.Lock()
    built: list[str] = []

    def build(task: object, workload: object) -> _WorkloadState:
        name = f"w{len(built)}"
        built.append(name)
        stage = _Stage("trial0", 1, False, {"C": torch.zeros(250, dtype=torch.float32)})
        return _WorkloadState(GEMM.workloads[0].model_copy(update={"name": name}), [stage], 1, "")

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
    from ptxgym.judge import _output_bytes
    from ptxgym.tasks import registry

    gemm = GEMM.workloads[0]
    # C is [M, N] bf16: 8192 * 8192 * 2 bytes, already aligned.
    assert _output_bytes(GEMM, gemm) == 8192 * 8192 * 2
    for task in registry().values():
        for workload in task.workloads:
            assert _output_bytes(task, workload) > 0


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
