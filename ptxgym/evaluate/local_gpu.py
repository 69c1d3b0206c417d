"""Evaluate candidates on the local GPU, from a process that itself needs no GPU.

The env process checks and compiles (CPU), then hands the library to the judge process of the
GPU (``ptxgym.evaluate.judge``), which keeps the workload state and runs each candidate in a
disposable worker. One judge per GPU (and settings) serves every evaluator in the process, several
evaluations at once; their GPU stages take turns under the GPU's lock (``ptxgym.device.lock``),
which also holds against judges of other processes, so timings never overlap on a GPU.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import itertools
import os
import subprocess
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from multiprocessing.connection import Connection
from typing import Any

from ptxgym.build.result import DEFAULT_COMPILE_TIMEOUT_S, CompileResult
from ptxgym.device.gpus import GPUInfo, physical_device, visible_gpus
from ptxgym.evaluate.build_step import build_candidate
from ptxgym.evaluate.errors import EvaluatorError
from ptxgym.evaluate.judge_messages import (
    MAX_ANSWER_BYTES,
    MessageError,
    Request,
    read_answer,
    receive_message,
    send_message,
)
from ptxgym.evaluate.judge_server import DEFAULT_JUDGE, connect, start_private_judge
from ptxgym.evaluate.judge_settings import JudgeSettings
from ptxgym.evaluate.roofline import peaks_for, speed_of_light
from ptxgym.evaluate.verdict import Verdict
from ptxgym.languages import DEFAULT_LANGUAGE, get_language
from ptxgym.outcome import FAULT_RATIO, Outcome, Status
from ptxgym.tasks import Task

_START_TIMEOUT_S = 600.0
# The answer each kind of request expects.
_ANSWER_KINDS = {"evaluate": "verdict", "baseline": "baseline"}


def gpu_of(device: int = 0) -> GPUInfo | None:
    """The GPU that is CUDA device ``device`` of this process, or None when there is none.

    NVML numbers every GPU of the machine, whatever CUDA_VISIBLE_DEVICES says; a process given
    a subset (a Ray actor's ``num_gpus``, a scheduler's slot) must look up its own device's
    entry, not the machine's GPU of the same number. A device named by UUID there is looked
    up by its number, as before.
    """
    gpus = {gpu.index: gpu for gpu in visible_gpus()}
    try:
        physical = physical_device(device)
    except IndexError:  # fewer devices visible to this process than ``device``
        return None
    return gpus.get(int(physical) if physical.isdigit() else device)


def incompatibility(task: Task, device: int = 0) -> str | None:
    """Why ``task`` cannot run on GPU ``device`` here, or None when it can."""
    gpu = gpu_of(device)
    if gpu is None:
        return f"{task.id} needs {task.target.devices}; no NVIDIA GPU is visible"
    if gpu.capability != task.target.compute_capability:
        have = f"sm_{gpu.capability[0]}{gpu.capability[1]}"
        return f"{task.id} needs {task.target.devices}; GPU {device} is {gpu.name} ({have})"
    return None


class _JudgeHandle:
    """The evaluator's end of one judge: requests out, answers routed to their askers.

    Any number of threads may have requests in flight; a reader thread hands each answer to the
    future of the request it belongs to. Messages are JSON (``ptxgym.evaluate.judge_messages``):
    an answer that is not of the protocol fails its request with an EvaluatorError, or, when it
    names no request, ends the connection. If the judge dies, every pending request fails with an
    EvaluatorError and the next ``judge_for`` connects again (starting a new judge). ``local``
    starts a judge private to this process; ``shared`` connects to the user's judge server for the
    GPU (``ptxgym.evaluate.judge_server``).
    """

    def __init__(
        self,
        conn: Connection,
        info: dict[str, Any],
        device: int,
        process: subprocess.Popen[bytes] | None = None,
    ) -> None:
        self.conn = conn
        self.info = info
        self.device = device
        self.process = process
        self._send_lock = threading.Lock()
        # Each request in flight: its future and the kind of answer it expects.
        self._pending: dict[int, tuple[Future[Any], str]] = {}
        self._pending_lock = threading.Lock()
        self._ids = itertools.count()
        self._reader = threading.Thread(target=self._read_answers, daemon=True)
        self._reader.start()

    @classmethod
    def local(
        cls,
        device: int,
        settings: JudgeSettings,
        factory: str = DEFAULT_JUDGE,
    ) -> _JudgeHandle:
        """Start a judge process of this process's own and wait until it is ready. ``factory``
        (``module:name``) makes the judge in it (tests give a stand-in that needs no GPU)."""
        conn, process = start_private_judge(device, settings, factory)
        kind: str = "timeout"
        payload: Any = ""
        if conn.poll(_START_TIMEOUT_S):
            try:
                _, kind, payload = read_answer(receive_message(conn, MAX_ANSWER_BYTES))
            except (EOFError, OSError, MessageError) as exc:
                kind, payload = "failed", f"its first answer: {type(exc).__name__}: {exc}"
        if kind != "ready":
            with contextlib.suppress(OSError):
                conn.close()
            _end(process)
            how = "did not start" if kind == "timeout" else f"failed to start: {payload}"
            raise EvaluatorError(f"the judge for GPU {device} {how}")
        return cls(conn, payload, device, process)

    @classmethod
    def shared(cls, device: int, settings: JudgeSettings) -> _JudgeHandle:
        """Connect to the user's shared judge of this GPU and settings, starting it if needed."""
        try:
            conn, info = connect(device, settings)
        except RuntimeError as exc:
            raise EvaluatorError(str(exc)) from exc
        return cls(conn, info, device)

    def evaluate(
        self,
        task: Task,
        library: str,
        deadline: float | None = None,
        language: str = DEFAULT_LANGUAGE,
    ) -> Future[Verdict]:
        """Ask for the verdict on ``library`` (built from ``language``); a request still queued
        in the judge at ``deadline`` (``time.time()``) fails with an EvaluatorError."""
        return self._submit(Request(next(self._ids), deadline, task, library, language))

    def baseline(self, task: Task) -> Future[dict[str, float]]:
        """Ask for the baseline latency (ms) of each of the task's workloads."""
        return self._submit(Request(next(self._ids), None, task))

    def _submit(self, request: Request) -> Future[Any]:
        """Send ``request``; its future holds the answer (or an EvaluatorError)."""
        future: Future[Any] = Future()
        with self._pending_lock:
            self._pending[request.request_id] = (future, _ANSWER_KINDS[request.kind])
        try:
            with self._send_lock:
                send_message(self.conn, request.message())
        except (OSError, ValueError) as exc:
            with self._pending_lock:
                self._pending.pop(request.request_id, None)
            future.set_exception(EvaluatorError(f"the judge for GPU {self.device} is gone: {exc}"))
        return future

    def _read_answers(self) -> None:
        ended = "stopped before answering"
        while True:
            try:
                answer = read_answer(receive_message(self.conn, MAX_ANSWER_BYTES))
            except (EOFError, OSError):
                break
            except MessageError as exc:
                if exc.request_id is None:  # what follows it cannot be trusted to be answers
                    ended = f"sent what is not an answer ({exc})"
                    with contextlib.suppress(OSError):
                        self.conn.close()  # and later requests fail at once, not unanswered
                    break
                answer = (exc.request_id, "failed", f"the judge's answer is malformed: {exc}")
            request_id, kind, payload = answer
            if request_id is not None:
                self._settle(request_id, kind, payload)
            elif kind == "failed":  # a refusal of no request: the judge closes the connection
                ended = f"refused what it was sent ({payload})"
        with self._pending_lock:
            pending, self._pending = self._pending, {}
        for future, _ in pending.values():
            future.set_exception(EvaluatorError(f"the judge for GPU {self.device} {ended}"))

    def _settle(self, request_id: int, kind: str, payload: Any) -> None:
        """Hand one answer to the future of its request (an answer to none is dropped)."""
        with self._pending_lock:
            future, expected = self._pending.pop(request_id, (None, ""))
        if future is None:
            return
        if kind in ("failed", "expired"):
            future.set_exception(EvaluatorError(str(payload)))
        elif kind != expected:
            future.set_exception(EvaluatorError(f"the judge answered {kind!r}, not {expected!r}"))
        else:
            future.set_result(payload)

    @property
    def alive(self) -> bool:
        """Answers are still read (and a private judge still runs)."""
        return self._reader.is_alive() and (self.process is None or self.process.poll() is None)

    def close(self) -> None:
        with contextlib.suppress(OSError, ValueError), self._send_lock:
            send_message(self.conn, ["close"])
        if self.process is None:
            with contextlib.suppress(OSError):
                self.conn.close()
            return
        _end(self.process)
        with contextlib.suppress(OSError):
            self.conn.close()


def _end(process: subprocess.Popen[bytes]) -> None:
    """Wait for a private judge to end (it does once its requests channel closes), killing it
    after 30 s; reaped either way, so it leaves no zombie."""
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


_judges: dict[tuple[int, JudgeSettings, bool], _JudgeHandle] = {}
_judges_lock = threading.Lock()


def judge_for(device: int, settings: JudgeSettings, shared: bool = False) -> _JudgeHandle:
    """The judge of a GPU: this process's own (started on first use and restarted if it died),
    or with ``shared`` the user's judge server for the GPU."""
    with _judges_lock:
        handle = _judges.get((device, settings, shared))
        if handle is None or not handle.alive:
            start = _JudgeHandle.shared if shared else _JudgeHandle.local
            handle = _judges[(device, settings, shared)] = start(device, settings)
        return handle


_builder_pool: ThreadPoolExecutor | None = None


def _builders() -> ThreadPoolExecutor:
    """The process's pool for background evaluations: one thread per CPU core."""
    global _builder_pool
    with _judges_lock:
        if _builder_pool is None:
            _builder_pool = ThreadPoolExecutor(
                max_workers=os.cpu_count() or 4, thread_name_prefix="ptxgym-evaluate"
            )
        return _builder_pool


@atexit.register
def _close_judges() -> None:
    with _judges_lock:
        for handle in _judges.values():
            handle.close()
        _judges.clear()


class LocalGPUEvaluator:
    """Policy, build, then correctness and timing against the library on the local GPU.

    ``evaluate`` blocks; ``submit`` returns a future and ``evaluate_async`` is awaitable, so one
    thread or event loop can keep many candidates in flight. Builds run in a shared thread pool
    (nvcc runs outside the GIL, so they spread over the CPU cores); the GPU stages of every
    evaluator of the process go through the one judge of the GPU, which overlaps their CPU parts
    and lets only one use the GPU at a time. ``queue_timeout_s``: how long a request may wait in
    the judge's queue before it fails with an EvaluatorError (a capacity problem, not the
    candidate's); None waits as long as it takes. ``shared``: use the user's judge server for the
    GPU (``ptxgym.evaluate.judge_server``), shared with every other process that asks for it
    (e.g. the workers of an ``AsyncVectorEnv``), instead of a judge of this process's own.
    ``language``: the action language of the sources it is given (``ptxgym.languages``).
    """

    name = "gpu"

    def __init__(
        self,
        device: int = 0,
        *,
        compile_timeout_s: float = DEFAULT_COMPILE_TIMEOUT_S,
        settings: JudgeSettings | None = None,
        queue_timeout_s: float | None = None,
        shared: bool = False,
        language: str = DEFAULT_LANGUAGE,
    ) -> None:
        self.device = device
        self.shared = shared
        self.language = language
        get_language(language)  # an unknown language fails here, not at the first step
        self.compile_timeout_s = compile_timeout_s
        self.settings = settings or JudgeSettings()
        self.queue_timeout_s = queue_timeout_s

    def evaluate(self, task: Task, source: str) -> Outcome:
        started = time.perf_counter()
        reason = incompatibility(task, self.device)
        if reason is not None:
            raise EvaluatorError(reason)
        stopped, build = build_candidate(
            task, source, self.compile_timeout_s, get_language(self.language)
        )
        if stopped is not None:
            return stopped
        assert build is not None
        # This step's wall time for the build: a cache hit's result keeps its original seconds.
        return self._judge(task, build, time.perf_counter() - started)

    def evaluate_build(self, task: Task, build: CompileResult, compile_seconds: float) -> Outcome:
        """Correctness and timing of a successful build made elsewhere (its ``library`` a file
        on this machine), as ``evaluate`` does after its own build: for evaluators that build
        on other machines (``ptxgym.evaluate.ray_pool``). ``compile_seconds``: the wall time
        the build took for this step, counted in the outcome's ``seconds``."""
        if not build.ok or build.library is None:
            raise ValueError(f"{task.id}: only a successful build with a library can be judged")
        reason = incompatibility(task, self.device)
        if reason is not None:
            raise EvaluatorError(reason)
        return self._judge(task, build, compile_seconds)

    def _judge(self, task: Task, build: CompileResult, compile_seconds: float) -> Outcome:
        """The judge's verdict on ``build``, checked against the GPU's speed of light."""
        assert build.library is not None
        started = time.perf_counter() - compile_seconds
        deadline = time.time() + self.queue_timeout_s if self.queue_timeout_s is not None else None
        handle = judge_for(self.device, self.settings, self.shared)
        verdict = handle.evaluate(task, build.library, deadline, build.language).result()
        latency, baseline = verdict.latency_ms, verdict.baseline_latency_ms
        status, message = verdict.status, verdict.message
        peaks = peaks_for(str(handle.info.get("name", "")), handle.info.get("sm_count"))
        bound = speed_of_light(task, verdict.timings, peaks) if peaks is not None else None
        if bound is not None and bound.fault:
            status, message = (
                Status.RUNTIME_ERROR,
                (
                    f"measured {bound.latency_ms:.4f} ms, under {FAULT_RATIO:g} of the "
                    f"{bound.bound_ms:.4f} ms that the GPU needs at its peaks for this work: a "
                    "measurement fault (work the timer did not see), not a speedup"
                ),
            )
            latency = baseline = None
        return Outcome(
            task_id=task.id,
            status=status,
            message=message,
            evaluator=self.name,
            compile=build,
            latency_ms=latency,
            baseline_latency_ms=baseline,
            speedup=baseline / latency if latency and baseline else None,
            # A performance task requires no family: its profile only informs the feedback.
            qualified=verdict.profile.qualified
            if verdict.profile is not None and task.instructions_required
            else None,
            instructions_required=task.instructions_required,
            checks=verdict.checks,
            timings=verdict.timings,
            sanitizers=verdict.sanitizers,
            profile=verdict.profile,
            worker_log=verdict.worker_log,
            seconds=time.perf_counter() - started,
            stage_seconds={"compile": compile_seconds, **verdict.stage_seconds},
            isolation=verdict.isolation,
            tools_workload=verdict.tools_workload,
            speed_of_light=bound,
        )

    def submit(self, task: Task, source: str) -> Future[Outcome]:
        """Evaluate in the background; the future holds the Outcome (or the EvaluatorError)."""
        return _builders().submit(self.evaluate, task, source)

    async def evaluate_async(self, task: Task, source: str) -> Outcome:
        """``await evaluator.evaluate_async(task, source)``: ``submit`` for asyncio code."""
        return await asyncio.wrap_future(self.submit(task, source))

    def baseline(self, task: Task) -> dict[str, float]:
        """Baseline latency (ms) per workload, measured or from the cache."""
        reason = incompatibility(task, self.device)
        if reason is not None:
            raise EvaluatorError(reason)
        handle = judge_for(self.device, self.settings, self.shared)
        return handle.baseline(task).result()

    def device_info(self) -> dict[str, Any]:
        return judge_for(self.device, self.settings, self.shared).info

    def close(self) -> None:
        """The judge is shared by every evaluator of the process; it stops at exit."""
