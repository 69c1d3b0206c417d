"""Run a child process group with a deadline, and kill the whole group when it passes.

Compilers and profilers start children of their own (nvcc runs cicc, ptxas, gcc; ncu runs the
profiled program): killing only the direct child would leave them running. The group's output goes
to a temporary file, not a pipe, and only its head and tail are read back: a child that floods
its output (a candidate's printf, a compiler's error cascade) cannot fill this process's memory.
"""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import IO

HEAD_BYTES = 256 << 10  # first errors of a compiler log
TAIL_BYTES = 64 << 10  # summaries (compute-sanitizer, ncu, Python tracebacks) come last


def run_group(
    command: list[str], *, env: dict[str, str], timeout_s: float, cwd: Path | None = None
) -> tuple[int | None, str]:
    """Exit code and combined output (head and tail when long); the code is ``None`` when the
    deadline killed the group."""
    with tempfile.TemporaryFile() as log:
        process = subprocess.Popen(
            command,
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            _kill_group(process)
            return None, ""
        # Whatever the child left running in its group (a forked helper) goes with it.
        _kill_group(process)
        return process.returncode, _head_and_tail(log)


def _kill_group(process: subprocess.Popen[bytes]) -> None:
    """SIGKILL the child's process group and wait until the group is gone (bounded)."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        return
    process.wait()
    deadline = time.monotonic() + 10.0
    while _group_alive(process.pid) and time.monotonic() < deadline:
        time.sleep(0.02)


def _group_alive(group: int) -> bool:
    """Does any process of ``group`` still run? Zombies do not count: they hold no resources,
    and in a container nothing may reap them soon."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[2]) == group and fields[0] not in ("Z", "X"):
            return True
    return False


def _head_and_tail(log: IO[bytes]) -> str:
    size = log.seek(0, os.SEEK_END)
    log.seek(0)
    if size <= HEAD_BYTES + TAIL_BYTES:
        return log.read().decode("utf-8", "replace")
    head = log.read(HEAD_BYTES)
    log.seek(size - TAIL_BYTES)
    tail = log.read()
    omitted = size - HEAD_BYTES - TAIL_BYTES
    return (
        head.decode("utf-8", "replace")
        + f"\n[... {omitted} bytes of output omitted ...]\n"
        + tail.decode("utf-8", "replace")
    )
