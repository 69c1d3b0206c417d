"""One memory budget for every build on the machine, across processes.

Each compiler process runs under an address-space limit (``ptxgym.languages.cuda.compiler``'s), but
the limit is per process: vector envs, many trajectories and several test sessions build at once,
and N builds could commit N times the limit and exhaust the host. So a build first takes one of the
machine's build slots and holds it from its first compiler process to its last. There are ``budget
// per_build`` slots (at least one, so that a small machine still builds), where ``per_build`` is
what one build may commit: nvcc runs its compilers (cicc, ptxas, gcc, the assembler, the linker) one
after another, so one build is one limited process at a time.

The budget is ``PTXGYM_BUILD_MEMORY_GIB`` (GiB, a decimal number) when it is set, else half of the
host's memory (the smaller of its physical memory and the cgroup limit of this process): the rest
is for the judges, the workers and the env processes. Every process on the machine should see the
same budget. The slots are numbered, and a process whose budget makes n slots takes one of the
first n, so the builds running at once are at most the largest budget's slots.

A slot is an ``flock`` on a file ``build-slot-<i>.lock`` in the machine's lock folder
(``paths.lock_dir``, beside the GPU locks of ``ptxgym.device.lock``), so it holds across processes
and ends with the process that holds it: a killed build never keeps its slot. A build that finds
every slot taken looks again every few tens of milliseconds until its deadline; there is no
queue, the first to look after a slot frees takes it.
"""

from __future__ import annotations

import fcntl
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from ptxgym import paths
from ptxgym.device.lock import ensure_lock_file

BUDGET_ENV = "PTXGYM_BUILD_MEMORY_GIB"
# Builds last seconds: looking for a free slot this often costs nothing and loses little time.
_POLL_S = 0.02
_CGROUP_ROOT = Path("/sys/fs/cgroup")


def host_memory_bytes() -> int:
    """The memory this process's machine has for it: physical memory, or less where its cgroup
    (v2) sets a lower limit."""
    memory = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    try:
        membership = Path("/proc/self/cgroup").read_text(encoding="utf-8")
    except OSError:
        return memory
    for line in membership.splitlines():
        hierarchy, _, group = line.partition("::")
        if hierarchy != "0":
            continue
        try:
            limit = (_CGROUP_ROOT / group.lstrip("/") / "memory.max").read_text().strip()
        except OSError:
            break
        if limit.isdigit():
            memory = min(memory, int(limit))
    return memory


def budget_bytes() -> int:
    """The machine's build memory budget: ``PTXGYM_BUILD_MEMORY_GIB``, else half of
    :func:`host_memory_bytes`."""
    setting = os.environ.get(BUDGET_ENV)
    if setting is None:
        return host_memory_bytes() // 2
    try:
        gib = float(setting)
    except ValueError:
        gib = -1.0
    if not gib > 0:
        raise ValueError(f"{BUDGET_ENV} must be a positive number of GiB, not {setting!r}")
    return int(gib * (1 << 30))


def slot_count(per_build_bytes: int) -> int:
    """How many builds that may each commit ``per_build_bytes`` fit in the budget (at least 1)."""
    return max(1, budget_bytes() // per_build_bytes)


def slot_path(index: int) -> Path:
    """The lock file of build slot ``index``."""
    return paths.lock_dir() / f"build-slot-{index}.lock"


@contextmanager
def build_slot(per_build_bytes: int, timeout_s: float) -> Iterator[bool]:
    """Hold one of the machine's build slots for this block, waiting up to ``timeout_s`` for
    one to free; yields True when it holds one, False when none freed in time (then nothing is
    held, and the caller must not build)."""
    deadline = time.monotonic() + timeout_s
    count = slot_count(per_build_bytes)
    # Each process starts its search at a different slot, so that waiting builds do not all
    # contend for slot 0 first.
    first = os.getpid() % count
    paths_in_order = [slot_path((first + offset) % count) for offset in range(count)]
    descriptors = [_open(path) for path in paths_in_order]
    held: int | None = None
    try:
        while held is None:
            held = next((d for d in descriptors if _try_lock(d)), None)
            if held is None:
                if time.monotonic() >= deadline:
                    break
                time.sleep(_POLL_S)
        yield held is not None
    finally:
        for descriptor in descriptors:
            os.close(descriptor)  # closing the held one releases its flock


def _open(path: Path) -> int:
    # Read-only (flock needs no write access) and O_CLOEXEC: the compilers a build starts must
    # not inherit its slot, nor keep it after the build is over.
    return os.open(ensure_lock_file(path), os.O_RDONLY | os.O_CLOEXEC)


def _try_lock(descriptor: int) -> bool:
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True
