"""One measurement at a time on a GPU, across every process on the machine.

Anything that runs GPU work for an evaluation (a worker's correctness and timing stages, a
workload's references and baseline timing, the sanitizer's and the profiler's one call) holds the
GPU's lock while it does, so no timing ever shares the GPU with other work, however many judges,
vector-env processes or threads there are. The CPU parts around them (compiling, starting
processes, importing torch, reading reports) run outside the lock and overlap freely.

The lock is an ``flock`` on a file named after the physical GPU, in one folder for the whole
machine (``paths.lock_dir``: not the cache folder, which differs between users, test sessions and
benchmark runs), so it holds between processes and ends with the process that holds it (a killed
holder never leaves it locked). Waiters inside one process are served first come, first served.
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
    """Hold GPU ``device`` for this block; yields the seconds spent waiting for it."""
    return holding(lock_path(device))


@contextmanager
def holding(path: Path) -> Iterator[float]:
    """Hold the GPU whose lock file is ``path`` (a child process is given the path, since its
    scrubbed environment cannot locate ptxgym's cache folder)."""
    with _gates_mutex:
        gate = _gates.setdefault(str(path), _FifoGate())
    started = time.perf_counter()
    gate.acquire()
    try:
        _make_shared_folder(path.parent)
        # O_CLOEXEC: processes started while it is held (workers, compilers) must not inherit it.
        descriptor = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
        with contextlib.suppress(OSError):  # others' processes open it too (umask aside)
            os.fchmod(descriptor, 0o666)
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX)
            yield time.perf_counter() - started
        finally:
            os.close(descriptor)  # closing releases the flock
    finally:
        gate.release()


def _make_shared_folder(folder: Path) -> None:
    """The locks' folder, writable by every user like /tmp itself (sticky: no one removes
    another's lock file)."""
    if not folder.is_dir():
        folder.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(OSError):
            folder.chmod(0o1777)
