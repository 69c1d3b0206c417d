"""Evaluate candidates on the local GPU, from a process that itself needs no GPU.

The env process checks and compiles (CPU), then hands the library to the judge process of the
GPU (``ptxgym.judge``), which keeps the workload state and runs each candidate in a disposable
worker. One judge per GPU serves every evaluator in the process, one evaluation at a time, so
timings never overlap on a GPU.
"""

from __future__ import annotations

import atexit
import contextlib
import multiprocessing
import threading
import time
from typing import Any

from ptxgym.compiler import DEFAULT_TIMEOUT_S
from ptxgym.evaluator import build_candidate
from ptxgym.gpus import visible_gpus
from ptxgym.judge import JudgeSettings, Verdict, judge_main
from ptxgym.outcome import Outcome
from ptxgym.tasks import Task

_START_TIMEOUT_S = 600.0


class EvaluatorError(RuntimeError):
    """The evaluator itself failed (not the candidate): a missing dependency or a wrong GPU."""


def incompatibility(task: Task, device: int = 0) -> str | None:
    """Why ``task`` cannot run on GPU ``device`` here, or None when it can."""
    gpus = {gpu.index: gpu for gpu in visible_gpus()}
    if device not in gpus:
        return f"{task.id} needs {task.target.devices}; no NVIDIA GPU is visible"
    gpu = gpus[device]
    if gpu.capability != task.target.compute_capability:
        have = f"sm_{gpu.capability[0]}{gpu.capability[1]}"
        return f"{task.id} needs {task.target.devices}; GPU {device} is {gpu.name} ({have})"
    return None


class _JudgeHandle:
    """The evaluator's end of one judge process."""

    def __init__(self, device: int, settings: JudgeSettings) -> None:
        context = multiprocessing.get_context("spawn")
        self.conn, child = context.Pipe()
        # Not a daemon: daemons may not have children, and the judge starts workers. It still
        # ends with its parent: its requests channel closes, and it exits on end of file.
        self.process = context.Process(target=judge_main, args=(child, device, settings))
        self.process.start()
        child.close()
        self.lock = threading.Lock()
        if not self.conn.poll(_START_TIMEOUT_S):
            self.close()
            raise EvaluatorError(f"the judge for GPU {device} did not start")
        kind, payload = self.conn.recv()
        if kind != "ready":
            self.close()
            raise EvaluatorError(f"the judge for GPU {device} failed to start: {payload}")
        self.info: dict[str, Any] = payload

    def request(self, *message: Any) -> Any:
        with self.lock:
            self.conn.send(message)
            kind, payload = self.conn.recv()
        if kind == "failed":
            raise EvaluatorError(str(payload))
        return payload

    @property
    def alive(self) -> bool:
        return self.process.is_alive()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.conn.send(("close",))
        self.process.join(timeout=30)
        if self.process.is_alive():
            self.process.kill()


_judges: dict[tuple[int, JudgeSettings], _JudgeHandle] = {}
_judges_lock = threading.Lock()


def judge_for(device: int, settings: JudgeSettings) -> _JudgeHandle:
    """The shared judge of a GPU, started on first use and restarted if it died."""
    with _judges_lock:
        handle = _judges.get((device, settings))
        if handle is None or not handle.alive:
            handle = _judges[(device, settings)] = _JudgeHandle(device, settings)
        return handle


@atexit.register
def _close_judges() -> None:
    with _judges_lock:
        for handle in _judges.values():
            handle.close()
        _judges.clear()


class LocalGPUEvaluator:
    """Policy, build, then correctness and timing against the library on the local GPU."""

    name = "gpu"

    def __init__(
        self,
        device: int = 0,
        *,
        compile_timeout_s: float = DEFAULT_TIMEOUT_S,
        settings: JudgeSettings | None = None,
    ) -> None:
        self.device = device
        self.compile_timeout_s = compile_timeout_s
        self.settings = settings or JudgeSettings()

    def evaluate(self, task: Task, source: str) -> Outcome:
        started = time.perf_counter()
        reason = incompatibility(task, self.device)
        if reason is not None:
            raise EvaluatorError(reason)
        stopped, build = build_candidate(task, source, self.compile_timeout_s)
        if stopped is not None:
            return stopped
        assert build is not None and build.library is not None
        verdict: Verdict = judge_for(self.device, self.settings).request(
            "evaluate", task, build.library
        )
        latency, baseline = verdict.latency_ms, verdict.baseline_latency_ms
        return Outcome(
            task_id=task.id,
            status=verdict.status,
            message=verdict.message,
            evaluator=self.name,
            compile=build,
            latency_ms=latency,
            baseline_latency_ms=baseline,
            speedup=baseline / latency if latency and baseline else None,
            qualified=verdict.profile.qualified if verdict.profile is not None else None,
            checks=verdict.checks,
            timings=verdict.timings,
            sanitizers=verdict.sanitizers,
            profile=verdict.profile,
            worker_log=verdict.worker_log,
            seconds=time.perf_counter() - started,
        )

    def baseline(self, task: Task) -> dict[str, float]:
        """Baseline latency (ms) per workload, measured or from the cache."""
        reason = incompatibility(task, self.device)
        if reason is not None:
            raise EvaluatorError(reason)
        result: dict[str, float] = judge_for(self.device, self.settings).request("baseline", task)
        return result

    def device_info(self) -> dict[str, Any]:
        return judge_for(self.device, self.settings).info

    def close(self) -> None:
        """The judge is shared by every evaluator of the process; it stops at exit."""
