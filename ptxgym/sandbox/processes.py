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

HEAD_BYTES = 256 << 10  # first errors of a compiler log
TAIL_BYTES = 64 << 10  # summaries (compute-sanitizer, ncu, Python tracebacks) come last
POLL_S = 0.005  # how often a waiting loop looks again


class ProcessGroup:
    """A child started in a session (process group) of its own, its output going to a file."""

    def __init__(self, command: list[str], *, env: dict[str, str], cwd: Path | None = None) -> None:
        self._log = tempfile.TemporaryFile()  # noqa: SIM115 (lives as long as the group)
        self.process = subprocess.Popen(
            command,
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def wait(self, timeout_s: float) -> tuple[int | None, str]:
        """Exit code and output (head and tail when long); the code is None when the deadline
        passed, and the group was killed. Whatever the child left running in its group goes
        with it either way."""
        try:
            self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
            return None, ""
        self.kill()
        return self.process.returncode, self._output()

    def kill(self) -> None:
        """SIGKILL the group and wait until it is gone (bounded); closes the output file."""
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        else:
            self.process.wait()
            deadline = time.monotonic() + 10.0
            while _group_alive(self.process.pid) and time.monotonic() < deadline:
                time.sleep(0.02)
        if self.process.returncode is None:
            self.process.wait()

    def _output(self) -> str:
        log = self._log
        size = log.seek(0, os.SEEK_END)
        log.seek(0)
        if size <= HEAD_BYTES + TAIL_BYTES:
            text = log.read().decode("utf-8", "replace")
        else:
            head = log.read(HEAD_BYTES)
            log.seek(size - TAIL_BYTES)
            tail = log.read()
            omitted = size - HEAD_BYTES - TAIL_BYTES
            text = (
                head.decode("utf-8", "replace")
                + f"\n[... {omitted} bytes of output omitted ...]\n"
                + tail.decode("utf-8", "replace")
            )
        log.close()
        return text

    def __del__(self) -> None:
        self._log.close()


def run_group(
    command: list[str], *, env: dict[str, str], timeout_s: float, cwd: Path | None = None
) -> tuple[int | None, str]:
    """Run ``command`` to its end: exit code and combined output (head and tail when long); the
    code is ``None`` when the deadline killed the group."""
    return ProcessGroup(command, env=env, cwd=cwd).wait(timeout_s)


def wait_for_word(
    go: Path, owner_pid: int, stop: Path | None = None, max_wait_s: float = 3600
) -> bool:
    """Wait (polling, never touching the GPU) until ``go`` exists: True. False when ``stop``
    exists (it wins over ``go``), when process ``owner_pid`` (the judge) is gone, or after
    ``max_wait_s``. A program started ahead of need (a tool run, a report reader) waits here."""
    deadline = time.monotonic() + max_wait_s
    while time.monotonic() < deadline:
        if stop is not None and stop.exists():
            return False
        if go.exists():
            return True
        # Not os.kill(pid, 0): the waiting program's seccomp filter refuses signals to others.
        if not Path(f"/proc/{owner_pid}").exists():
            return False
        time.sleep(POLL_S)
    return False


def stat_fields(stat: Path) -> list[str]:
    """The fields of a ``/proc/PID/stat`` file after the command name (which may itself hold
    spaces and parentheses): index 0 is field 3 of proc(5), the state."""
    return stat.read_text().rsplit(")", 1)[1].split()


def _group_alive(group: int) -> bool:
    """Does any process of ``group`` still run? Zombies do not count: they hold no resources,
    and in a container nothing may reap them soon."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat_fields(stat)
        except (OSError, IndexError):
            continue
        if int(fields[2]) == group and fields[0] not in ("Z", "X"):
            return True
    return False
