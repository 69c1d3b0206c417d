"""Timings never share a GPU with other work of ours, across every process on the machine.

A timing (a worker's timing stage, a workload's references and baseline) and a tool's one call of
a candidate that needs the GPU to itself (the profiler's) hold their GPU **exclusively**: nothing
else of ours puts work on it meanwhile. The checks of a worker's outputs and the other tools'
calls (the sanitizer's, CUPTI's count) hold it **shared**: any number at once, but never beside
an exclusive holder. The CPU parts around them (compiling, starting processes, loading the
driver and a tool's injection, importing torch, reading reports) hold nothing and overlap
freely. Exclusive holders are preferred: once one waits, new shared holders wait behind it, so
timings are never starved by a stream of shared holders.

Making a CUDA context (the judge's, a worker's, a tool run's) holds a second lock of the GPU,
its **start-up lock**, shared; a timing holds that one exclusively too, so no context is made
beside it. A context made in another process moves a long kernel's timing, though it launches
nothing of ours: on the H200, a 42-ms GEMM timed with 2 warm-up calls and 3 trials of 5 while
eight processes made contexts in a loop, with no lock, was up to 5.8 % slower (docs/benchmarks.md,
seventh session); a 1.4-ms one timed with the judge's 3 trials of 50 did not move. So a timing of
many calls per trial may let start-ups in (``exclusive_gpu``'s ``startups_beside``, the judge's
``JudgeSettings.startups_beside_iters``, which its own protocol of 50 calls meets by default):
whether it does is the timing's own choice, whatever the processes making contexts were told.
The exclusive holds that are no timing (the profiler's call) leave the start-up lock alone: a
context made beside it changes no count.

Each lock is a pair of ``flock``s on files named after the physical GPU, in one folder for the
whole machine (``paths.lock_dir``: not the cache folder, which differs between users, test sessions
and benchmark runs), so it holds between processes and ends with the process that holds it (a
killed holder never leaves it locked). The main file is held exclusively or shared; the turnstile
beside it is held by an exclusive holder from its arrival to its end and crossed briefly by shared
ones, which is what makes waiting exclusive holders come first. An exclusive holder of both locks
takes both turnstiles before either lock (start-up lock first, then the GPU's), so that it waits
for the contexts being made and the checks in progress at once, not one after the other. Every
holder takes what it takes in that one order (a lingering start-up lock aside), a shared holder
holds one lock at a time, and no holder of the GPU's lock waits for a start-up (so none makes a
CUDA context under it), so no holders can wait on each other in a circle. Exclusive waiters inside
one process are served first come, first served, and pass the locks from one to the next without
letting go of them, for up to ``EXCLUSIVE_CHAIN_S`` by default, and may keep the start-up lock
through a gap between them (``linger_s``), so that start-ups come in batches (``_ExclusiveQueue``,
which says why the order stays safe then). Lingering descriptors are held outside any ``with``
block: a process that forks without exec while one lingers passes it to its child (the judge starts
workers through a fork server and programs through exec, whose descriptors close). A process
holding the GPU exclusively must not ask for it shared (a second ``flock`` of the same file would
wait for the first): what it does under the exclusive hold is covered by it.

Beside it, one more lock for the whole machine: Nsight Compute's turn (``profiler_turn``). Two
processes profiling at once make the driver refuse one ("Profiling failed because a driver
resource was unavailable": 12 of 16 runs, eight at a time, on the H200). Nsight Compute's own
lock between its instances lives in their temporary folder, and each profile run has its own.
One folder shared by every run made the judge's profiles fail instead (4 of the 5 profile GPU
tests; the profiled program's writes are confined to its own folder, likely the reason). So the
runs take turns through this lock, which like Nsight Compute's holds for the machine, not the
GPU. A profile run holds it inside its exclusive hold of the GPU (taken after it: nothing holds
it while waiting for a GPU), from before the candidate's library is loaded (whose code could
otherwise take it first) to the end of the call.
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
from ptxgym.device.gpus import physical_device

# How long one process's exclusive holders may pass the GPU from one to the next without letting
# go of its lock. Released between them, it let in every start-up waiting to make its CUDA
# context (shared), and the next holder waited for the slowest of those: on the H200 at 16
# trajectories, the GPU was held alone only 68 % of the time, though timings were always
# waiting (docs/benchmarks.md, eleventh session). Chained, the start-ups wait for a gap in the
# judge's queue and make their contexts together. The limit keeps other processes (tool runs'
# calls, other judges) from waiting on one busy judge for long.
EXCLUSIVE_CHAIN_S = 5.0
# How long the next holder in line waits before taking the locks again when a chain ended by
# age: long enough for the shared holders the release woke to cross the turnstiles (flock
# serves no one in order, and the next holder's call would otherwise often win).
_CHAIN_END_PAUSE_S = 0.02


class _ExclusiveQueue:
    """This process's exclusive holders of the same lock files (the start-up lock's, if any,
    then the GPU's): first come, first served, the files' locks passed on still held while the
    chain is younger than the limit its first holder set (``chain_s``).

    With ``linger_s`` (also the first holder's), a holder that leaves with nobody in line keeps
    the start-up lock for up to that long, within the chain's limit, and releases only the
    GPU's: checks go on while start-ups keep waiting, so that they make their contexts together
    at the chain's end, not in every gap between timings, where the next timing would wait for
    them. A timer releases it when nobody came. The next holder then takes the GPU's turnstile
    and lock while holding the start-up lock's, out of the usual order, which is still safe:
    every other exclusive holder of the start-up lock waits at its turnstile holding nothing,
    and the holders of the GPU's lock alone (checks, the profiler's call, timings that let
    start-ups beside them) never wait for a start-up.

    Holders that join a chain, or come after a linger, go by the chain's ``chain_s`` and
    ``linger_s``, not their own. A chain ended by age lets the shared holders waiting in before
    its next holder takes the locks again (``_CHAIN_END_PAUSE_S``). Between processes flock
    serves no one in order: where several judges' chains follow one another without a gap, a
    start-up may wait several chains."""

    def __init__(self, paths: tuple[Path, ...]) -> None:
        self._mutex = threading.Lock()
        self._queue: collections.deque[threading.Event] = collections.deque()
        self._held = False
        # The files in the order they are taken (every turnstile first: from then on no new
        # shared holder enters either lock), and those kept while lingering.
        self._files = [*map(turnstile_path, paths), *paths]
        self._lingering_files = [*map(turnstile_path, paths[:-1]), *paths[:-1]]
        # Touched only by the thread whose turn it is, or under the mutex while nobody's turn
        # it is: the descriptors of the files whose locks are held, and since when.
        self._descriptors: dict[Path, int] = {}
        self._chain_started = 0.0
        self._chain_s = EXCLUSIVE_CHAIN_S
        self._linger_s = 0.0
        self._lingers = 0  # which linger a timer may end (a later one supersedes it)
        self._pause_first = False  # the next holder comes after a chain ended by age

    def acquire(self, chain_s: float, linger_s: float = 0.0) -> None:
        turn = None
        with self._mutex:
            if self._held or self._queue:
                turn = threading.Event()
                self._queue.append(turn)
            else:
                self._held = True
        if turn is not None:
            self._wait_for(turn)
        missing = [path for path in self._files if path not in self._descriptors]
        if not missing:
            return  # handed on, still locked
        chain_goes_on = len(missing) < len(self._files)  # after a linger
        try:
            if self._pause_first:
                self._pause_first = False
                time.sleep(_CHAIN_END_PAUSE_S)
            for path in missing:
                self._descriptors[path] = _lock(path, fcntl.LOCK_EX)
        except BaseException:
            self._close(self._files)
            self.release()  # the next in line takes the locks itself
            raise
        if not chain_goes_on:
            self._chain_started = time.monotonic()
            self._chain_s = chain_s
            self._linger_s = linger_s

    def _wait_for(self, turn: threading.Event) -> None:
        """Wait for ``turn``; interrupted (an exception in this thread), leave the line, or pass
        the turn on if it came meanwhile, so that nobody waits for this thread."""
        try:
            turn.wait()
        except BaseException:
            with self._mutex:
                waiting = turn in self._queue
                if waiting:
                    self._queue.remove(turn)
            if not waiting:
                self.release()
            raise

    def release(self) -> None:
        with self._mutex:
            chain_left = self._chain_s - (time.monotonic() - self._chain_started)
            linger = 0.0
            if chain_left <= 0:
                self._close(self._files)
                self._pause_first = bool(self._queue)
            elif not self._queue:
                linger = min(self._linger_s, chain_left) if self._lingering_files else 0.0
                kept = self._lingering_files if linger > 0 else []
                self._close([path for path in self._files if path not in kept])
            if self._queue:
                self._queue.popleft().set()  # the turn passes straight to the next in line
            else:
                self._held = False
            if linger > 0:
                self._lingers += 1
                timer = threading.Timer(linger, self._end_linger, (self._lingers,))
                timer.daemon = True
                try:
                    timer.start()
                except RuntimeError:  # no thread to be had (the interpreter ending): no linger
                    self._close(self._files)

    def _end_linger(self, linger: int) -> None:
        with self._mutex:
            if not self._held and linger == self._lingers:
                self._close(self._files)

    def _close(self, files: list[Path]) -> None:
        """Release the locks of ``files`` held, the last taken first."""
        _close([self._descriptors.pop(path) for path in files if path in self._descriptors])


_queues: dict[tuple[Path, ...], _ExclusiveQueue] = {}
_queues_mutex = threading.Lock()


def lock_path(device: int) -> Path:
    """The lock file of CUDA device ``device`` of this process."""
    name = physical_device(device).replace("/", "_")
    return paths.lock_dir() / f"gpu-{name}.lock"


def startup_lock_path(device: int) -> Path:
    """The start-up lock file of CUDA device ``device`` of this process."""
    return startup_lock_of(lock_path(device))


def startup_lock_for(device: int, locked: bool) -> str | None:
    """The start-up lock file a child process of device ``device`` holds while it makes its
    CUDA context (``startup_hold``), as its spec names it, made if missing
    (``ensure_holding_files``): None where start-ups are not locked
    (``JudgeSettings.lock_startups`` off)."""
    return str(ensure_holding_files(startup_lock_path(device))) if locked else None


def gpu_lock_for(device: int) -> str:
    """The lock file of CUDA device ``device`` as a child process's spec names it, made if
    missing (``ensure_holding_files``)."""
    return str(ensure_holding_files(lock_path(device)))


def startup_lock_of(gpu_lock: Path) -> Path:
    """The start-up lock file of the GPU whose lock file is ``gpu_lock``."""
    return gpu_lock.with_name(f"{gpu_lock.stem}.startups{gpu_lock.suffix}")


def exclusive_gpu(
    device: int,
    chain_s: float = EXCLUSIVE_CHAIN_S,
    startups_beside: bool = False,
    linger_s: float = 0.0,
) -> contextlib.AbstractContextManager[float]:
    """Hold GPU ``device`` alone for this block, for a timing; yields the seconds spent waiting
    for it. ``chain_s``: how long a chain this holder starts may hand the locks on unreleased.
    ``startups_beside``: other processes may make CUDA contexts meanwhile (a timing of many
    calls per trial); else the start-up lock is held alone too, and kept for up to
    ``linger_s`` after the chain's last holder, for its next (``_ExclusiveQueue``)."""
    startups = None if startups_beside else startup_lock_path(device)
    return holding(
        lock_path(device), exclusive=True, chain_s=chain_s, startups=startups, linger_s=linger_s
    )


def shared_gpu(device: int) -> contextlib.AbstractContextManager[float]:
    """Hold GPU ``device`` with other shared holders, never during a timing; yields the wait."""
    return holding(lock_path(device), exclusive=False)


def startup_hold(path: Path | None) -> contextlib.AbstractContextManager[object]:
    """What a process's start-up holds while it makes its CUDA context: the start-up lock whose
    file is ``path`` (``startup_lock_path``), shared; nothing where ``path`` is None
    (``JudgeSettings.lock_startups`` off)."""
    return holding(path, exclusive=False) if path is not None else contextlib.nullcontext()


def profiler_lock_path() -> Path:
    """The lock file of Nsight Compute's turn (``profiler_turn``): one for the machine, as
    Nsight Compute's own is."""
    return paths.lock_dir() / "nsight-compute.lock"


@contextmanager
def profiler_turn(path: Path) -> Iterator[float]:
    """Profile with no other process of ours profiling: hold the lock file ``path``
    (``profiler_lock_path``, handed to a child) alone; yields the wait. One plain ``flock``: its
    holders are all alike (one call each), so it needs no turnstile."""
    started = time.perf_counter()
    with _locked(path, fcntl.LOCK_EX):
        yield time.perf_counter() - started


@contextmanager
def holding(
    path: Path,
    exclusive: bool = True,
    chain_s: float = EXCLUSIVE_CHAIN_S,
    startups: Path | None = None,
    linger_s: float = 0.0,
) -> Iterator[float]:
    """Hold the lock whose file is ``path``, alone or shared (a child process is given the
    path, since its scrubbed environment cannot locate ptxgym's folders); an exclusive holder
    holds the start-up lock whose file is ``startups`` alone too, where one is given, and
    keeps it up to ``linger_s`` for the process's next exclusive holder."""
    started = time.perf_counter()
    if not exclusive:
        with _locked(turnstile_path(path), fcntl.LOCK_EX):
            pass  # wait behind any exclusive holder that arrived first
        with _locked(path, fcntl.LOCK_SH):
            yield time.perf_counter() - started
        return
    files = (path,) if startups is None else (startups, path)
    with _queues_mutex:
        queue = _queues.setdefault(files, _ExclusiveQueue(files))
    queue.acquire(chain_s, linger_s)
    try:
        yield time.perf_counter() - started
    finally:
        queue.release()


def turnstile_path(path: Path) -> Path:
    """The turnstile beside lock file ``path``: held by an exclusive holder from its arrival."""
    return path.with_name(path.name + ".turnstile")


def _close(descriptors: list[int]) -> None:
    """Release the flocks of ``descriptors``, the last taken first."""
    for descriptor in reversed(descriptors):
        os.close(descriptor)  # closing releases the flock


@contextmanager
def _locked(path: Path, operation: int) -> Iterator[None]:
    descriptor = _lock(path, operation)
    try:
        yield
    finally:
        os.close(descriptor)  # closing releases the flock


def _lock(path: Path, operation: int) -> int:
    """A descriptor of ``path`` holding its ``flock`` (released when the descriptor is closed)."""
    descriptor = _open(path)
    try:
        fcntl.flock(descriptor, operation)
    except BaseException:
        os.close(descriptor)
        raise
    return descriptor


def ensure_lock_file(path: Path) -> Path:
    """``path``, the lock file made if missing: for a child whose writes will be confined to its
    own folder (ptxgym.sandbox.landlock), which can take a lock then but not make its file."""
    os.close(_open(path))
    return path


def ensure_holding_files(path: Path) -> Path:
    """``path``, the lock file, made if missing with its turnstile (``ensure_lock_file``): for a
    confined child that takes the lock through ``holding``, whose shared holders cross the
    turnstile. On a fresh machine the first to take a lock can be such a child: the judge's
    CUPTI self-test counts before any timing made the GPU's turnstile, and its count run could
    not (PermissionError), so the judge fell back to Nsight Compute (the thirty-first session's
    first runs on the H200, docs/benchmarks.md)."""
    ensure_lock_file(turnstile_path(path))
    return ensure_lock_file(path)


def _open(path: Path) -> int:
    # O_CLOEXEC: processes started while it is held (workers, compilers) must not inherit it.
    # Read-only when the file exists (flock needs no write access): a process whose writes are
    # confined to its own folder (ptxgym.sandbox.landlock), as a worker's and a single-call
    # program's are, takes the lock too.
    try:
        return os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        _make_shared_folder(path.parent)
        descriptor = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
        with contextlib.suppress(OSError):  # others' processes open it too (umask aside)
            os.fchmod(descriptor, 0o666)
        return descriptor


def _make_shared_folder(folder: Path) -> None:
    """The locks' folder, writable by every user like /tmp itself (sticky: no one removes
    another's lock file)."""
    if not folder.is_dir():
        folder.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(OSError):
            folder.chmod(0o1777)
