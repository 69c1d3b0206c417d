"""How a GPU's locks (ptxgym.device.lock) were held over a span of time, read from the kernel's
table of file locks (/proc/locks) without taking them.

A judge's throughput is bounded by the time the GPU is held alone (timings) plus the time a
waiting timing spends behind shared holders (checks and the tools' calls on the GPU's lock, CUDA
start-ups on its start-up lock), which no concurrency can overlap. The evaluations' own stage
seconds say how long each waited, not whom for; this says what the locks were doing at each
moment, and who held them shared while a timing waited. Sampling only reads the table, so it
moves nothing it measures.

A moment is in one of four states:

- ``alone``: an exclusive holder has the GPU's lock file;
- ``shared, a timing waiting``: an exclusive holder has arrived at a lock (it holds that lock's
  turnstile) and waits for the shared holders of that lock to finish;
- ``shared``: shared holders have either lock, and no exclusive holder waits for them;
- ``free``: nobody has either.

A shared holder crossing a turnstile holds it for an instant too; a sample that catches one
counts that instant as a timing waiting. The holders are the processes that took each lock
(the judge for a worker's checks, a worker or a tool run for its CUDA context, a tool run for its
call); the table names them by process id, in the reader's process namespace.
"""

from __future__ import annotations

import collections
import contextlib
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, get_args

from ptxgym.device.lock import startup_lock_of, turnstile_path

LOCKS_TABLE = Path("/proc/locks")
State = Literal["alone", "shared, a timing waiting", "shared", "free"]
STATES: tuple[State, ...] = get_args(State)


@dataclass(frozen=True)
class FileLock:
    """One line of the locks table: a lock held, or one a process waits for."""

    held: bool
    exclusive: bool
    pid: int
    inode: int


def read_table(text: str) -> list[FileLock]:
    """The ``flock`` locks of a /proc/locks text (POSIX and lease lines are not the GPU lock's).

    A line reads ``1: FLOCK  ADVISORY  WRITE 2289 fe:00:2146497 0 EOF``; a waiter's has ``->``
    after its number. The third field from ``FLOCK`` is the mode (``WRITE``: exclusive), then
    the process id and ``major:minor:inode`` of the file.
    """
    locks = []
    for line in text.splitlines():
        fields = line.split()
        waiting = len(fields) > 1 and fields[1] == "->"
        fields = fields[2:] if waiting else fields[1:]
        if len(fields) < 5 or fields[0] != "FLOCK":
            continue
        try:
            pid, inode = int(fields[3]), int(fields[4].rsplit(":", 1)[1])
        except (ValueError, IndexError):
            continue
        locks.append(FileLock(not waiting, fields[2] == "WRITE", pid, inode))
    return locks


@dataclass(frozen=True)
class LockInodes:
    """The inodes of a GPU's lock file and its turnstile, and of its start-up lock's (None
    while those files do not exist yet)."""

    gpu: int
    gpu_turnstile: int
    startups: int | None = None
    startups_turnstile: int | None = None


def state_of(locks: list[FileLock], inodes: LockInodes) -> tuple[State, list[int]]:
    """The locks' state in one reading of the table, and the processes holding them shared
    (while a timing waits: those it waits for)."""
    if any(lock.held and lock.exclusive and lock.inode == inodes.gpu for lock in locks):
        return "alone", []
    sharing: list[int] = []
    delaying: list[int] = []
    for lock_file, turnstile in (
        (inodes.gpu, inodes.gpu_turnstile),
        (inodes.startups, inodes.startups_turnstile),
    ):
        holders = [lock.pid for lock in locks if lock.held and lock.inode == lock_file]
        sharing += holders
        if any(lock.held and lock.inode == turnstile for lock in locks):
            delaying += holders
    if delaying:
        return "shared, a timing waiting", delaying
    return ("shared" if sharing else "free"), sharing


@dataclass
class Occupancy:
    """Seconds in each state (``STATES``), and the seconds a waiting timing waited on shared
    holders by what they are (a moment with several holders is split between them)."""

    seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(STATES, 0.0))
    waited_on: dict[str, float] = field(default_factory=lambda: collections.defaultdict(float))
    samples: int = 0

    def shares(self) -> dict[str, float]:
        """Each state's share of the sampled time."""
        total = sum(self.seconds.values())
        return {state: s / total if total else 0.0 for state, s in self.seconds.items()}


class OccupancySampler:
    """Reads the locks table every ``interval_s`` on a thread of its own, from construction to
    ``stop``, attributing each interval to the state seen at its start. ``lock_file``: the
    GPU's lock file (its start-up lock's is found beside it). ``kind_of`` names a holding
    process (called once per process id). The lock files are looked up at each reading until
    they exist (the first user of the GPU makes them)."""

    def __init__(
        self,
        lock_file: Path,
        kind_of: Callable[[int], str],
        interval_s: float = 0.005,
        table: Path = LOCKS_TABLE,
    ) -> None:
        if not table.is_file():
            raise OSError(f"{table} is not readable here: the lock's occupancy cannot be sampled")
        startups = startup_lock_of(lock_file)
        self.files = (lock_file, turnstile_path(lock_file), startups, turnstile_path(startups))
        self.kind_of = kind_of
        self.interval_s = interval_s
        self.table = table
        self.occupancy = Occupancy()
        self._kinds: dict[int, str] = {}
        self._inodes: dict[Path, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _lock_inodes(self) -> LockInodes | None:
        """The files' inodes; None while the GPU's lock files do not exist."""
        for path in self.files:
            if path not in self._inodes:
                with contextlib.suppress(FileNotFoundError):
                    self._inodes[path] = os.stat(path).st_ino
        inodes = [self._inodes.get(path) for path in self.files]
        gpu, gpu_turnstile, startups, startups_turnstile = inodes
        if gpu is None or gpu_turnstile is None:
            return None
        return LockInodes(gpu, gpu_turnstile, startups, startups_turnstile)

    def _run(self) -> None:
        # The last reading: when, the state, the shared holders; None until the files exist.
        previous: tuple[float, State, list[int]] | None = None
        while True:
            stopping = self._stop.is_set()
            now = time.monotonic()
            if previous is not None:
                self._add(now - previous[0], *previous[1:])
            if stopping:
                return
            inodes = self._lock_inodes()
            if inodes is not None:
                previous = (now, *state_of(read_table(self.table.read_text()), inodes))
            self._stop.wait(self.interval_s)

    def _add(self, seconds: float, state: State, shared: list[int]) -> None:
        occupancy = self.occupancy
        occupancy.seconds[state] += seconds
        occupancy.samples += 1
        if state == "shared, a timing waiting":
            for pid in shared:
                if pid not in self._kinds:
                    self._kinds[pid] = self.kind_of(pid)
                occupancy.waited_on[self._kinds[pid]] += seconds / len(shared)

    def stop(self) -> Occupancy:
        """End the sampling; what it saw."""
        self._stop.set()
        self._thread.join()
        return self.occupancy
