"""How a GPU's lock (ptxgym.device.lock) was held over a span of time, read from the kernel's
table of file locks (/proc/locks) without taking it.

A judge's throughput is bounded by the time the GPU is held alone (timings) plus the time a
waiting timing spends behind shared holders (checks, CUDA start-ups, the tools' calls), which
no concurrency can overlap. The evaluations' own stage seconds say how long each waited, not
whom for; this says what the lock was doing at each moment, and who held it shared while a
timing waited. Sampling only reads the table, so it moves nothing it measures.

A moment is in one of four states:

- ``alone``: an exclusive holder has the lock file;
- ``shared, a timing waiting``: shared holders have it, and an exclusive holder has arrived (it
  holds the turnstile, ptxgym.device.lock) and waits for them to finish;
- ``shared``: shared holders have it, and no exclusive holder waits;
- ``free``: nobody has it.

A shared holder crossing the turnstile holds it for an instant too; a sample that catches one
counts that instant as a timing waiting. The holders are the processes that took each lock
(the judge for a worker's checks, a worker or a tool run for its CUDA context, a tool run for its
call); the table names them by process id, in the reader's process namespace.
"""

from __future__ import annotations

import collections
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, get_args

from ptxgym.device.lock import turnstile_path

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


def state_of(locks: list[FileLock], main: int, turnstile: int) -> tuple[State, list[int]]:
    """The lock's state in one reading of the table (``main`` and ``turnstile``: the inodes of
    the lock file and its turnstile), and the processes holding it shared."""
    holders = [lock for lock in locks if lock.held and lock.inode == main]
    if any(lock.exclusive for lock in holders):
        return "alone", []
    shared = [lock.pid for lock in holders]
    if not shared:
        return "free", []
    waiting = any(lock.held and lock.inode == turnstile for lock in locks)
    return ("shared, a timing waiting" if waiting else "shared"), shared


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
    ``stop``, attributing each interval to the state seen at its start. ``kind_of`` names a
    holding process (called once per process id). The lock files are looked up at each reading
    until they exist (the first user of the GPU makes them)."""

    def __init__(
        self,
        lock_file: Path,
        kind_of: Callable[[int], str],
        interval_s: float = 0.005,
        table: Path = LOCKS_TABLE,
    ) -> None:
        if not table.is_file():
            raise OSError(f"{table} is not readable here: the lock's occupancy cannot be sampled")
        self.lock_file = lock_file
        self.kind_of = kind_of
        self.interval_s = interval_s
        self.table = table
        self.occupancy = Occupancy()
        self._kinds: dict[int, str] = {}
        self._inodes: tuple[int, int] | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _lock_inodes(self) -> tuple[int, int] | None:
        if self._inodes is None:
            try:
                main = os.stat(self.lock_file).st_ino
                turnstile = os.stat(turnstile_path(self.lock_file)).st_ino
            except FileNotFoundError:
                return None
            self._inodes = (main, turnstile)
        return self._inodes

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
                previous = (now, *state_of(read_table(self.table.read_text()), *inodes))
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
