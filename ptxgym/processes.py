"""Run a child process group with a deadline, and kill the whole group when it passes.

Compilers and profilers start children of their own (nvcc runs cicc, ptxas, gcc; ncu runs the
profiled program): killing only the direct child would leave them running.
"""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path


def run_group(
    command: list[str], *, env: dict[str, str], timeout_s: float, cwd: Path | None = None
) -> tuple[int | None, str]:
    """Exit code and combined output; the code is ``None`` when the deadline killed the group."""
    process = subprocess.Popen(
        command,
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        output, _ = process.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
        return None, ""
    return process.returncode, output.decode("utf-8", "replace")
