"""The GPU lock on the CPU: holders alone, across processes and threads, and first come first
served within a process."""

from __future__ import annotations

import multiprocessing
import threading
import time
from pathlib import Path

import pytest

from ptxgym.gpu_lock import exclusive_gpu, lock_path


def _hold(cache: str, locks: str, log: str, label: str) -> None:
    import os

    os.environ["PTXGYM_CACHE"] = cache
    os.environ["PTXGYM_LOCK_DIR"] = locks
    for _ in range(3):
        with exclusive_gpu(0):
            with open(log, "a") as out:
                out.write(f"{label} start {time.monotonic()}\n")
            time.sleep(0.05)
            with open(log, "a") as out:
                out.write(f"{label} end {time.monotonic()}\n")


def test_processes_never_hold_the_gpu_at_once(tmp_path: Path) -> None:
    # Each with a cache folder of its own, as separate test sessions and benchmark runs have: the
    # lock is the machine's, not the cache's (a lock in the cache let them time at once).
    log = tmp_path / "log"
    context = multiprocessing.get_context("spawn")
    processes = [
        context.Process(
            target=_hold,
            args=(str(tmp_path / f"cache-{i}"), str(tmp_path / "locks"), str(log), f"p{i}"),
        )
        for i in range(3)
    ]
    for process in processes:
        process.start()
    for process in processes:
        process.join(timeout=60)
        assert process.exitcode == 0
    events = [line.split() for line in log.read_text().splitlines()]
    assert len(events) == 18
    # Held intervals alternate start/end of the same holder: no two overlap.
    for start, end in zip(events[::2], events[1::2], strict=True):
        assert start[1] == "start" and end[1] == "end" and start[0] == end[0]


def test_threads_are_served_in_arrival_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PTXGYM_LOCK_DIR", str(tmp_path / "locks"))
    served: list[int] = []
    with exclusive_gpu(0):  # held while the others line up
        threads = []
        for index in range(5):
            thread = threading.Thread(target=_take, args=(index, served))
            thread.start()
            threads.append(thread)
            time.sleep(0.05)  # arrival order 0, 1, 2, 3, 4
    for thread in threads:
        thread.join(timeout=30)
    assert served == [0, 1, 2, 3, 4]
    assert lock_path(0).parent == tmp_path / "locks"


def _take(index: int, served: list[int]) -> None:
    with exclusive_gpu(0) as waited:
        assert waited >= 0
        served.append(index)
