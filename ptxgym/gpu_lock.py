"""Timings never share a GPU, across every process on the machine.

A timing (a worker's correctness and timing stages, a workload's references and baseline) and a
tool's one call of a candidate (the sanitizer's, the profiler's) hold their GPU **alone**:
nothing else of ours puts work on it meanwhile. The CPU parts around them (compiling, starting
processes, importing torch, reading reports) hold nothing and overlap freely, and so do CUDA
start-ups: making a context, with no kernel, copy or memset, does not move a timing (on the
H200, a GEMM timed while eight processes made contexts in a loop, plainly, under Nsight Compute
and under compute-sanitizer, kept its latency within the run-to-run spread: docs/benchmarks.md,
sixth session). Holding the GPU for them only kept timings waiting.

The lock is an exclusive ``flock`` on a file named after the physical GPU, in one folder for the
whole machine (``paths.lock_dir``: not the cache folder, which differs between users, test
sessions and benchmark runs), so it holds between processes and ends with the process that
holds it (a killed holder never leaves it locked). Holders inside one process are served first
come, first served.
"""

from __future__ import annotations

import collections
import contextlib
import fcntl
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from ptxgym import paths
from ptxgym.gpus import physical_device


class _FifoGate:
    """A first-come-first-served mutex for the threads of this process."""

    def __init__(self) -> None:
        self._mutex = threading.Lock()
        self._queue: collections.deque[threading.Event] = collections.deque()
        self._held = False

    def acquire(self) -> None:
        with self._mutex:
            if not self._held and not self._queue:
                self._held = True
                return
            turn = threading.Event()
            self._queue.append(turn)
        turn.wait()

    def release(self) -> None:
        with self._mutex:
            if self._queue:
                self._queue.popleft().set()  # ownership passes straight to the next in line
            else:
                self._held = False


_gates: dict[str, _FifoGate] = {}
_gates_mutex = threading.Lock()


def lock_path(device: int) -> Path:
    """The lock file of CUDA device ``device`` of this process."""
    name = physical_device(device).replace("/", "_")
    return paths.lock_dir() / f"gpu-{name}.lock"


def exclusive_gpu(device: int) -> contextlib.AbstractContextManager[float]:
    """Hold GPU ``device`` alone for this block; yields the seconds spent waiting for it."""
    return holding(lock_path(device))


@contextmanager
def holding(path: Path) -> Iterator[float]:
    """Hold the GPU whose lock file is ``path`` alone (a child process is given the path, since
    its scrubbed environment cannot locate ptxgym's folders); yields the wait."""
    started = time.perf_counter()
    with _gates_mutex:
        gate = _gates.setdefault(str(path), _FifoGate())
    gate.acquire()
    try:
        with _locked(path):
            yield time.perf_counter() - started
    finally:
        gate.release()


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    # O_CLOEXEC: processes started while it is held (workers, compilers) must not inherit it.
    # Read-only when the file exists (flock needs no write access): a process whose writes are
    # confined to its own folder (ptxgym.landlock), as a single-call program's are, takes the
    # lock too.
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        _make_shared_folder(path.parent)
        descriptor = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
        with contextlib.suppress(OSError):  # others' processes open it too (umask aside)
            os.fchmod(descriptor, 0o666)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX)
        yield
    finally:
        os.close(descriptor)  # closing releases the flock


def _make_shared_folder(folder: Path) -> None:
    """The locks' folder, writable by every user like /tmp itself (sticky: no one removes
    another's lock file)."""
    if not folder.is_dir():
        folder.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(OSError):
            folder.chmod(0o1777)
