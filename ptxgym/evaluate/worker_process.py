"""The judge's side of one worker process: starting it, waiting for it to be ready, reading its
log, ending it.

The code that runs inside the worker is ``ptxgym.evaluate.worker``; this module is the judge's
handle on the process (``WorkerProcess``, started in the context ``worker_context`` gives). Workers
are hostile by assumption: each runs one candidate and is then killed, its folder and log removed,
so a worker that dies, hangs or breaks its CUDA context costs only itself. What it wrote to its log
is read from the end only (``WorkerProcess.log_tail``), however much it wrote, and how its process
ended (``how_it_ended``) goes into the verdict.
"""

from __future__ import annotations

import multiprocessing
import os
import secrets
import shutil
from pathlib import Path
from typing import Any

from ptxgym.device.lock import startup_lock_for
from ptxgym.evaluate.worker import WORKER_IMPORTS, worker_main
from ptxgym.sandbox import channel

_LOG_TAIL_CHARS = 2000


def worker_context(fork: bool) -> multiprocessing.context.BaseContext:
    """How the judge starts its workers: afresh (``spawn``), or with ``fork`` forked from a
    process of the judge's that has imported ``WORKER_IMPORTS`` (Python's ``forkserver``, which
    is never the judge itself: the judge holds a CUDA context, which a fork must not copy)."""
    if not fork:
        return multiprocessing.get_context("spawn")
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(list(WORKER_IMPORTS))
    return context


class WorkerProcess:
    """A started worker process waiting for its one job."""

    def __init__(
        self, context: Any, device: int, folder: Path, lock_startup: bool, use_cupti: bool
    ) -> None:
        """``lock_startup``: the worker makes its CUDA context holding the start-up lock shared.
        ``use_cupti``: it times with CUPTI (else host wall time, only when asked for)."""
        folder.mkdir(parents=True, exist_ok=True)
        name = f"worker-{secrets.token_hex(4)}"
        # The log sits outside the worker's own folder, which it may write (and is removed).
        self.log_path = folder / f"{name}.log"
        self.home = folder / name
        self.conn, child = context.Pipe()
        self.process = context.Process(
            target=worker_main,
            args=(
                *(child, device, str(self.log_path), str(self.home)),
                startup_lock_for(device, lock_startup),
                use_cupti,
            ),
            daemon=True,
        )
        self.process.start()
        child.close()
        self.ready = False
        # What confinement took effect in the worker (ptxgym.sandbox.isolation), and how it times
        # the candidate, as it reported before any candidate code was loaded.
        self.isolation: dict[str, bool] = {}
        self.timing_method = ""

    def wait_ready(self, timeout_s: float) -> None:
        if not self.ready:
            header, _ = channel.receive(self.conn, None, timeout_s)
            if header.get("kind") != "ready":
                raise channel.ChannelError(f"worker did not start: {header}")
            self.isolation = {str(k): bool(v) for k, v in dict(header.get("isolation", {})).items()}
            self.timing_method = str(header.get("timing_method", ""))
            self.ready = True

    def log_tail(self) -> str:
        """The end of the worker's output; only the end is read, however large the log grew."""
        try:
            with self.log_path.open("rb") as log:
                log.seek(max(0, log.seek(0, os.SEEK_END) - 4 * _LOG_TAIL_CHARS))
                text = log.read().decode("utf-8", "replace")
        except OSError:
            return ""
        return text[-_LOG_TAIL_CHARS:].strip()

    def kill(self) -> None:
        """End the process and wait until it is gone, its CUDA context with it."""
        if self.process.is_alive():
            self.process.kill()
        self.process.join(timeout=10)
        self.conn.close()
        self.log_path.unlink(missing_ok=True)
        shutil.rmtree(self.home, ignore_errors=True)


class WorkerStartError(RuntimeError):
    """Workers cannot start on this host (a broken CUDA set-up, a confinement the platform
    refuses): no candidate can be evaluated, so the request fails with the worker's own words."""


def how_it_ended(worker: WorkerProcess) -> str:
    """How the worker's process ended, its end of the channel closed (waits for it a little)."""
    worker.process.join(timeout=5)
    code = worker.process.exitcode
    if code is not None and code < 0:
        return f"was killed by signal {-code}"
    return f"exited with code {code}"
