"""The judge: the trusted GPU process that evaluates candidates through disposable workers.

One judge per GPU (``JudgeSettings``: ``ptxgym.evaluate.judge_settings``). It holds the workload
state that must never be visible to candidate code (``ptxgym.evaluate.workload_state``: the seeds,
the reference outputs, the baseline latencies) and keeps it across steps. For each candidate it
hands a fresh worker (``ptxgym.evaluate.worker``, its process started and ended through
``ptxgym.evaluate.worker_process``) the library and the seeds, holds the conversation with it
(``ptxgym.evaluate.conversation``: every message taken against the protocol's script, the claimed
timing bounded by the judge's own clock), compares the outputs that come back with the references
(``ptxgym.evaluate.reference_checks``), runs the tools the verdict calls for, and turns crashes,
hangs, bad outputs and broken protocol into a verdict (``ptxgym.evaluate.verdict``). A worker that
dies, hangs or breaks its CUDA context costs only itself: it is killed, and a spare, already
started, serves the next candidate.
"""

from __future__ import annotations

import collections
import contextlib
import random
import secrets
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ptxgym.device.gpus import make_context, visible_gpus
from ptxgym.device.lock import shared_gpu, startup_hold, startup_lock_path
from ptxgym.evaluate.baselines import baseline_key, cached_baseline, store_baseline
from ptxgym.evaluate.compile_run import Prepared, prepare
from ptxgym.evaluate.conversation import Conversation
from ptxgym.evaluate.count import self_test as count_self_test
from ptxgym.evaluate.count_audit import audited
from ptxgym.evaluate.judge_settings import JudgeSettings, timing_hold
from ptxgym.evaluate.profile import PendingProfile, profile_metrics
from ptxgym.evaluate.reference_checks import ReferenceChecks
from ptxgym.evaluate.sanitizer import PendingSanitizer
from ptxgym.evaluate.single_call import CallJob, hand_candidate
from ptxgym.evaluate.timing import TRIALS, CallSchedule, Timer
from ptxgym.evaluate.tool_runs import PendingRun, ProfileMethod, ToolKind, ToolRuns
from ptxgym.evaluate.verdict import (
    OUT_OF_MEMORY,
    Verdict,
    sharing_may_explain,
    with_memory_errors,
)
from ptxgym.evaluate.worker import host_bytes, make_inputs, resolve_callable
from ptxgym.evaluate.worker_process import (
    WorkerProcess,
    WorkerStartError,
    how_it_ended,
    worker_context,
)
from ptxgym.evaluate.workload_state import (
    CheckStage,
    TimingPlan,
    WorkloadState,
    output_bytes,
    tensor_bytes,
    worker_job,
)
from ptxgym.languages import DEFAULT_LANGUAGE
from ptxgym.languages.base import ENTRY_C_ABI
from ptxgym.outcome import InstructionProfile, SanitizerReport, Status
from ptxgym.sandbox import channel
from ptxgym.tasks import Task, WorkloadSpec

_random = random.SystemRandom()  # which timed calls are checked: not predictable from outside
# A worker's start (Python, torch, CUDA context, CUPTI) takes seconds, more on a busy host; it is
# ours, not the candidate's, so it has its own deadline, independent of the stage timeout.
_WORKER_START_TIMEOUT_S = 120.0
# How long a worker's start, or an attempt whose judge-side GPU work (a workload state, a timed
# call's references) found no device memory, is tried again, and the first pause between tries
# (doubled each time, up to 4 s). Another evaluation's candidate may hold all of the memory for
# as long as its worker lives (tests/hostile: cudamalloc_all), seconds.
_MEMORY_WAIT_S = 60.0
_MEMORY_PAUSE_S = 0.5
_MEMORY_PAUSE_MAX_S = 4.0
# Below this much free device memory a worker's start is taken to have failed for want of it.
_WORKER_MEMORY_BYTES = 1 << 30
# How long the sanitizers' words wait for the profile to take the GPU first (it is waiting with
# its CUDA context made, so this is normally milliseconds).
_PROFILE_FIRST_WAIT_S = 10.0
# How often the judge's process hands the interpreter from one thread to another (Python's
# default is 5 ms). A conversation's thread that wakes for a worker's message while another
# thread of the judge computes in Python waits for the interpreter up to that long, and the
# judge's clock reads the message late by as much: with one such thread, an honest 0.2-ms call
# looked 5.2 ms longer than its device time (the median of 150), past the host allowance, and
# 0.65 ms longer at 0.5 ms (a CPU host, stand-in worker).
_SWITCH_INTERVAL_S = 0.0005


class TimingUnavailable(RuntimeError):
    """The timing method the settings ask for cannot run here: the judge does not start rather
    than time otherwise unasked."""


class Judge:
    """Evaluates candidates for any task whose target matches this GPU."""

    def __init__(self, device: int, settings: JudgeSettings) -> None:
        import torch

        self.torch = torch
        self.device = device
        self.settings = settings
        # The process is the judge's own (gpu_evaluator, judge_server): the setting is its.
        sys.setswitchinterval(_SWITCH_INTERVAL_S)
        # A context made beside a timing moves it (ptxgym.device.lock). This hold also makes
        # the start-up lock's files, which workers and tool runs confined to their own folders
        # cannot.
        with startup_hold(startup_lock_path(device)):
            make_context(device)
            self.timer = Timer(use_cupti=settings.timing_method == "cupti")
        if settings.timing_method == "cupti" and self.timer.cupti is None:
            raise TimingUnavailable(
                "CUPTI cannot time on this host (install cupti-python of CUDA's major version: "
                "pip install 'ptxgym[gpu]'); to time with the host's wall clock instead, which "
                "includes launch overhead, ask for it: JudgeSettings(timing_method='host-sync')"
            )
        self.context = worker_context(settings.fork_workers)
        self.folder = Path(tempfile.mkdtemp(prefix="ptxgym-judge-"))
        # Least recently used first; evicted beyond settings.state_budget_bytes.
        self.states: collections.OrderedDict[tuple[str, str], WorkloadState] = (
            collections.OrderedDict()
        )
        self._state_locks: dict[tuple[str, str], threading.Lock] = {}
        self._mutex = threading.Lock()  # guards the two dicts above, the spares, _in_flight
        # Each judge thread's CUDA stream for its comparisons (settings.check_streams): one per
        # thread, not per evaluation, as the caching allocator keeps freed blocks per stream.
        self._check_streams = threading.local()
        self.spares: list[WorkerProcess] = []
        properties = torch.cuda.get_device_properties(device)
        gpus = visible_gpus()
        # What the GPU, the libraries and the timing method are: read once, keyed into every
        # cached baseline.
        self.device_info: dict[str, Any] = {
            "name": properties.name,
            "capability": [properties.major, properties.minor],
            "sm_count": properties.multi_processor_count,
            "torch": torch.__version__,
            "cuda": torch.version.cuda,
            "cudnn": torch.backends.cudnn.version(),
            "driver": gpus[0].driver if gpus else "unknown",
            "timing_method": "cupti" if self.timer.cupti is not None else "host-sync",
        }
        self._start_spares()
        self.profile_method, self.profile_note = self._choose_profile_method()
        # Tool runs started ahead of need, for each tool a verdict may call for.
        self._in_flight = 0  # evaluations under way (guarded by _mutex)
        # A pass calls for every tool the settings turn on.
        self.tool_runs = ToolRuns(
            device,
            self._tools(Status.PASSED),
            settings.spare_tool_runs,
            settings.spare_profile_runs,
            profile_details=settings.profile_details,
            lock_startups=settings.lock_startups,
            profile_method=self.profile_method,
        )
        self.tool_runs.top_up(0)

    def _choose_profile_method(self) -> tuple[ProfileMethod, str]:
        """The method that counts executed instructions, and a note for every profile when it
        is not the one the settings ask for: CUPTI only after its self-test passed on this GPU
        (``ptxgym.evaluate.count.self_test``), else Nsight Compute."""
        if not (self.settings.profile and self.settings.profile_method == "cupti"):
            return self.settings.profile_method, ""
        if self.settings.profile_details:
            return "ncu", ""  # the kernel facts asked for come from Nsight Compute only
        major, minor = self.device_info["capability"]
        reason = count_self_test(self.device, (major, minor))
        if reason is None:
            return "cupti", ""
        return "ncu", f"counted with Nsight Compute: the CUPTI self-test failed ({reason})"

    def _start_spares(self) -> None:
        """Start workers for later evaluations, up to ``settings.spare_workers`` waiting."""
        while True:
            with self._mutex:
                if len(self.spares) >= self.settings.spare_workers:
                    return
            worker = self._start_worker()
            with self._mutex:
                self.spares.append(worker)

    def _start_worker(self) -> WorkerProcess:
        return WorkerProcess(
            self.context,
            self.device,
            self.folder,
            self.settings.lock_startups,
            use_cupti=self.settings.timing_method == "cupti",
        )

    def _take_worker(self) -> WorkerProcess:
        with self._mutex:
            worker = self.spares.pop(0) if self.spares else None
        if worker is None:
            worker = self._start_worker()
        # A start that failed is tried once more. One that failed for want of device memory (a
        # candidate of another evaluation, or another process, held all of it: its CUDA context
        # or CUPTI could not start) again, after a pause, until _MEMORY_WAIT_S have passed: that
        # is not this candidate's doing.
        memory_deadline = time.monotonic() + _MEMORY_WAIT_S
        pauses = _memory_pauses()
        attempt = 1
        while True:
            problem = self._start_problem(worker)
            if problem is None:
                return worker
            # Ours, not the candidate's: say what the worker said before it ended.
            log = worker.log_tail()
            worker.kill()
            no_memory = OUT_OF_MEMORY in log.lower() or self._memory_short()
            if attempt >= 2 and not (no_memory and time.monotonic() < memory_deadline):
                raise WorkerStartError(
                    f"{problem} ({attempt} starts); its output: {log or '(none)'}"
                )
            if no_memory:
                time.sleep(next(pauses))
            attempt += 1
            worker = self._start_worker()

    def _start_problem(self, worker: WorkerProcess) -> str | None:
        """Why ``worker`` cannot take a job (None when it can)."""
        try:
            worker.wait_ready(_WORKER_START_TIMEOUT_S)
        except channel.ChannelTimeout:
            return "a worker failed to start (no answer in time)"
        except (channel.ChannelError, EOFError, OSError) as exc:
            return f"a worker failed to start ({exc!r})"
        if worker.timing_method != self.device_info["timing_method"]:
            # Speedups would compare two clocks: CUPTI's device time against a host-timed
            # candidate (a worker that cannot load CUPTI, e.g. under a read rule that misses
            # its folder, or with no device memory left for its buffers).
            return (
                f"a worker times candidates with {worker.timing_method or 'nothing'}, but this "
                f"judge times baselines with {self.device_info['timing_method']}"
            )
        return None

    def _memory_short(self) -> bool:
        """Whether the GPU has less free memory than a worker needs to start (its CUDA
        context, CUPTI's buffers): someone else holds nearly all of it."""
        free, _ = self.torch.cuda.mem_get_info(self.device)
        return bool(free < _WORKER_MEMORY_BYTES)

    def check_stream(self) -> contextlib.AbstractContextManager[object]:
        """Where the calling thread's comparisons run: its own CUDA stream
        (``settings.check_streams``), else the device's default stream."""
        if not self.settings.check_streams:
            return contextlib.nullcontext()
        stream = getattr(self._check_streams, "stream", None)
        if stream is None:
            stream = self._check_streams.stream = self.torch.cuda.Stream(device=self.device)
        chosen: contextlib.AbstractContextManager[object] = self.torch.cuda.stream(stream)
        return chosen

    # ----------------------------------------------------------------------------------------
    # Workload state: seeds, references, baselines; built once per (task, workload).

    def workload_state(self, task: Task, workload: WorkloadSpec) -> WorkloadState:
        """The state of (task, workload): built once, by one thread, while others wait for it."""
        if not self.settings.reuse_state:
            with timing_hold(self.device, self.settings):
                return self._build_state(task, workload)
        key = (task.model_dump_json(), workload.name)
        with self._mutex:
            build_lock = self._state_locks.setdefault(key, threading.Lock())
        with build_lock:
            with self._mutex:
                state = self.states.get(key)
                if state is not None:
                    self.states.move_to_end(key)
                    return state
            with timing_hold(self.device, self.settings):
                state = self._build_state(task, workload)
            with self._mutex:
                self.states[key] = state
                self._evict_states()
            return state

    def _evict_states(self) -> None:
        """Drop the least recently used states beyond the memory budget (never the newest: a
        state in use by an evaluation stays alive with it until that evaluation ends)."""
        total = sum(state.nbytes for state in self.states.values())
        while total > self.settings.state_budget_bytes and len(self.states) > 1:
            _, evicted = self.states.popitem(last=False)
            total -= evicted.nbytes

    def _build_state(self, task: Task, workload: WorkloadSpec) -> WorkloadState:
        torch = self.torch
        reference = resolve_callable(task.callables.reference)
        baseline = resolve_callable(task.callables.baseline)
        payload = workload.payload()
        stages = [CheckStage(f"trial{i}", secrets.randbits(62), False) for i in range(TRIALS)]
        stages.append(CheckStage("outliers", secrets.randbits(62), True))
        trial_inputs = []
        tool_inputs = {}
        for stage in stages:
            inputs = make_inputs(task, payload, stage.seed, stage.outliers)
            # The tools run on the first workload only (_finish_tools). Copied before the
            # reference runs on the inputs.
            if stage is stages[0] and self.tool_runs.kinds and workload == task.workloads[0]:
                tool_inputs = host_bytes(inputs)
            stage.references = reference(inputs, **task.callables.params)
            if not stage.outliers:
                trial_inputs.append(inputs)
        reuse = self.settings.reuse_state
        cached = cached_baseline(self._baseline_key(task, workload)) if reuse else None
        if cached is not None:
            baseline_ms, method = cached
        else:
            closures = [baseline(inputs, **task.callables.params) for inputs in trial_inputs]
            result = self.timer.measure(
                lambda i: closures[i % len(closures)](),
                lambda i: None,
                warmup=self.settings.warmup,
                iters=self.settings.iters,
                trials=self.settings.trials,
            )
            baseline_ms, method = result.latency_ms, result.method
            if reuse:
                store_baseline(self._baseline_key(task, workload), baseline_ms, method)
        del trial_inputs
        torch.cuda.empty_cache()
        return WorkloadState(workload, stages, baseline_ms, method, tool_inputs)

    def _baseline_key(self, task: Task, workload: WorkloadSpec) -> str:
        libraries = {}
        if "flashinfer" in task.callables.baseline:
            try:
                import flashinfer

                libraries["flashinfer"] = flashinfer.__version__
            except ImportError:
                pass
        protocol = {
            "warmup": self.settings.warmup,
            "iters": self.settings.iters,
            "trials": self.settings.trials,
        }
        return baseline_key(self.device_info, libraries, task, workload, protocol)

    def baseline_ms(self, task: Task) -> dict[str, float]:
        return {w.name: self.workload_state(task, w).baseline_ms for w in task.workloads}

    # ----------------------------------------------------------------------------------------
    # One evaluation.

    def evaluate(self, task: Task, library: str, language: str = DEFAULT_LANGUAGE) -> Verdict:
        """The verdict on ``library``. A failure that sharing the GPU could have caused (a
        check's call overrunning its bound while other evaluations' checks and tool calls ran
        beside it, or an allocation failing while another candidate held the memory) is not
        the candidate's until it fails again with its checks holding the GPU alone: so a bad
        candidate fails alone. The retry's verdict stands, with the first attempt's seconds
        (``shared_attempt``) in its stages. A hang in the checks costs one bound shared and one
        alone."""
        verdict, ended_sharing = self._attempt(task, library, language, checks_alone=False)
        if not sharing_may_explain(verdict, ended_sharing):
            return verdict
        first = verdict.seconds
        # Another evaluation's candidate may still hold the memory (its worker keeps what it
        # took until it is gone), and holding the GPU alone does not free it.
        waited = self._wait_for_memory(task) if verdict.status is not Status.TIMEOUT else 0.0
        verdict, _ = self._attempt(task, library, language, checks_alone=True)
        return replace(
            verdict,
            seconds=first + waited + verdict.seconds,
            stage_seconds={
                **verdict.stage_seconds,
                "shared_attempt": first,
                **({"memory_wait": waited} if waited else {}),
            },
        )

    def _wait_for_memory(self, task: Task) -> float:
        """Wait, up to ``_MEMORY_WAIT_S``, until the GPU has free what the candidate's inputs
        and outputs take, twice over, plus what a worker needs to start; the seconds waited."""
        try:
            needed = _WORKER_MEMORY_BYTES + 2 * max(
                tensor_bytes(task, w, {**task.definition.inputs, **task.definition.outputs})
                for w in task.workloads
            )
        except (KeyError, ValueError):  # an axis only a workload's data gives: a worker's start
            needed = _WORKER_MEMORY_BYTES
        waited = 0.0
        for pause in _memory_pauses():
            if self.torch.cuda.mem_get_info(self.device)[0] >= needed:
                break
            if waited + pause > _MEMORY_WAIT_S:
                break
            time.sleep(pause)
            waited += pause
        return waited

    def _attempt(
        self, task: Task, library: str, language: str, checks_alone: bool
    ) -> tuple[Verdict, bool]:
        """``_evaluate_once``, made again after a pause while the judge's own GPU work finds no
        device memory (torch's OutOfMemoryError, or CUDA's error from a launch or a handle),
        for up to ``_MEMORY_WAIT_S``: not the candidate's doing, so no verdict of it. The
        seconds waited are the verdict's ``judge_memory_wait`` stage."""
        deadline = time.monotonic() + _MEMORY_WAIT_S
        pauses, waited = _memory_pauses(), 0.0
        while True:
            try:
                verdict, ended_sharing = self._evaluate_once(task, library, language, checks_alone)
            except RuntimeError as exc:  # both torch errors are RuntimeErrors
                pause = next(pauses)
                if (
                    isinstance(exc, WorkerStartError)  # waited for memory already
                    or OUT_OF_MEMORY not in str(exc).lower()
                    or time.monotonic() + pause > deadline
                ):
                    raise
                self.torch.cuda.empty_cache()
                time.sleep(pause)
                waited += pause
                continue
            if waited:
                stages = {**verdict.stage_seconds, "judge_memory_wait": waited}
                verdict = replace(verdict, stage_seconds=stages)
            return verdict, ended_sharing

    def _evaluate_once(
        self, task: Task, library: str, language: str, checks_alone: bool
    ) -> tuple[Verdict, bool]:
        """One attempt: the verdict, and whether it ended while the worker's checks still held
        the GPU shared (``checks_alone``: they hold it alone from the start)."""
        started = time.perf_counter()
        stages: dict[str, float] = {}
        states = [self.workload_state(task, w) for w in task.workloads]
        stages["state"] = time.perf_counter() - started
        # A Triton candidate's kernels are compiled and autotuned first, in a run of their own
        # (ptxgym.evaluate.compile_run); a C library is used as it is.
        prepared = prepare(
            task,
            library,
            language,
            device=self.device,
            folder=self.folder,
            timeout_s=self.settings.stage_timeout_s,
            lock_startup=self.settings.lock_startups,
        )
        if prepared.entry != ENTRY_C_ABI:
            stages["compile_run"] = prepared.seconds
        if prepared.failure is not None:
            status, message = prepared.failure
            seconds = time.perf_counter() - started
            return Verdict(status, message, seconds=seconds, stage_seconds=stages), False
        # Tool runs for this evaluation's verdict, started ahead (their start-up overlaps the
        # evaluation, or an earlier one); before the word they only make their CUDA context,
        # holding the GPU's start-up lock shared.
        with self._mutex:
            self._in_flight += 1
            in_flight = self._in_flight
        tools = ThreadPoolExecutor(max_workers=len(self.tool_runs.kinds) or 1)
        early: dict[ToolKind, _ToolCall] = {}
        try:
            self.tool_runs.top_up(in_flight)
            job = CallJob(
                task,
                prepared.library,
                states[0].spec.payload(),
                states[0].tool_inputs,
                prepared.entry,
                prepared.facts,
            )
            # The tools whose calls share the GPU get the word with the worker's job: their
            # calls run beside its checks (all shared), not after its timing.
            early = {kind: self._give_word(tools, kind, job) for kind in self._shared_tools()}
            mark = time.perf_counter()
            worker = self._take_worker()
            stages["worker_start"] = time.perf_counter() - mark
            # Correctness holds the GPU shared (beside other checks, never beside a timing);
            # the timing holds it alone, from the last check's answer to the worker's end.
            holds = _WorkerHolds(self.device, self.settings, stages, alone=checks_alone)
            try:
                with holds:
                    try:
                        verdict = self._run(task, prepared, states, worker, stages, holds.alone)
                    finally:
                        # Gone before the GPU is released: memory it holds or work it left
                        # running must not reach the next user of the GPU.
                        log = worker.log_tail()
                        isolation = worker.isolation
                        worker.kill()
            finally:
                # Started after the timing, not during it; its start-up overlaps other work.
                mark = time.perf_counter()
                self._start_spares()
                stages["spares_start"] = time.perf_counter() - mark
            # From the worker's end to the tools' reports: how long the verdict waits on them.
            mark = time.perf_counter()
            sanitizers, profile = self._finish_tools(tools, job, verdict.status, early)
            stages["tools_wait"] = time.perf_counter() - mark
        except BaseException:
            for call in early.values():  # no verdict will want them
                call.run.cancel()
            raise
        finally:
            tools.shutdown(wait=False)
            prepared.close()
            with self._mutex:
                self._in_flight -= 1
        for report in sanitizers:
            stages[report.tool] = report.seconds
            stages.update({f"{report.tool}_{k}": v for k, v in report.call_seconds.items()})
        crashed = verdict.status is Status.RUNTIME_ERROR
        verdict = with_memory_errors(verdict, sanitizers)
        if profile is not None:
            if self.profile_note:
                profile = replace(profile, note=self.profile_note)
            stages["profile"] = profile.seconds
            stages["profile_read"] = profile.read_seconds
            stages.update({f"profile_{k}": v for k, v in profile.call_seconds.items()})
            if verdict.status is not Status.PASSED:
                profile = None  # memcheck overruled the pass
            elif self._audit_due(profile):
                mark = time.perf_counter()
                profile = self._audit(profile, job)
                stages["count_audit"] = time.perf_counter() - mark
        # A crash's own words (a Python traceback, a CUDA error) help the next attempt, also
        # when memcheck then named the access behind it.
        verdict = replace(
            verdict,
            worker_log=log if crashed else "",
            sanitizers=sanitizers,
            profile=profile,
            seconds=time.perf_counter() - started,
            stage_seconds=stages,
            isolation=isolation,
            tools_workload=states[0].spec.name if sanitizers or profile is not None else "",
        )
        return verdict, holds.alone_from is None

    def _audit_due(self, profile: InstructionProfile) -> bool:
        """Whether Nsight Compute audits this qualified CUPTI count (``count_audit_rate``)."""
        return (
            profile.method == "cupti"
            and profile.qualified is True
            and _random.random() < self.settings.count_audit_rate
        )

    def _audit(self, profile: InstructionProfile, job: CallJob) -> InstructionProfile:
        """``profile`` after Nsight Compute counted the same call (``count_audit.audited``)."""
        run = PendingProfile(
            device=self.device,
            metrics=profile_metrics(False),
            lock_startup=self.settings.lock_startups,
        )
        return audited(job.task, profile, run.finish(job, self.settings.profile_timeout_s))

    def _shared_tools(self) -> list[ToolKind]:
        """The tool runs whose calls hold the GPU shared, each given its word with the worker's
        job: the sanitizers, and the profile when CUPTI counts it (Nsight Compute's profile holds
        the GPU alone: it runs only for a pass, after the timing)."""
        kinds: list[ToolKind] = [k for k in ("memcheck", "racecheck") if k in self.tool_runs.kinds]
        if "profile" in self.tool_runs.kinds and self.profile_method == "cupti":
            kinds.append("profile")
        return kinds

    def _give_word(self, pool: ThreadPoolExecutor, kind: ToolKind, job: CallJob) -> _ToolCall:
        run = self.tool_runs.take(kind)
        return _ToolCall(run, pool.submit(self._finish, run, job))

    def _finish_tools(
        self,
        pool: ThreadPoolExecutor,
        job: CallJob,
        status: Status,
        early: dict[ToolKind, _ToolCall],
    ) -> tuple[tuple[SanitizerReport, ...], InstructionProfile | None]:
        """The tools this status calls for, on the first workload's first trial inputs: those
        given their word with the worker's job are awaited (the others among them cancelled),
        the rest run now, all at once (their GPU parts take turns under the GPU lock). A profile
        is run for a pass, and kept by the caller only if memcheck agrees."""
        wanted = self._tools(status)
        for kind, call in early.items():
            if kind not in wanted:
                call.run.cancel()  # e.g. a hang, which would hang under the tool too
        calls = {kind: call for kind, call in early.items() if kind in wanted}
        late = [kind for kind in wanted if kind not in early]
        # The profile has the GPU first: its report is written and read after its call, and
        # the sanitizers' calls fit in that time, where before it they would only delay it.
        if "profile" in late:
            late.remove("profile")
            calls["profile"] = call = self._give_word(pool, "profile", job)
            if call.run.call is not None:
                call.run.call.wait_until_gpu_taken(_PROFILE_FIRST_WAIT_S)
        for kind in late:
            calls[kind] = self._give_word(pool, kind, job)
        if not calls:
            return (), None
        # Replacements start up while these run (their contexts wait for the start-up lock).
        with self._mutex:
            in_flight = self._in_flight
        self.tool_runs.top_up(in_flight)
        results = {kind: call.result.result() for kind, call in calls.items()}
        sanitizers = tuple(r for r in results.values() if isinstance(r, SanitizerReport))
        profile = results.get("profile")
        return sanitizers, profile if isinstance(profile, InstructionProfile) else None

    def _finish(self, run: PendingRun, job: CallJob) -> SanitizerReport | InstructionProfile:
        """Give one tool run the job and the word; never raises (a failure is an unknown
        result)."""
        try:
            if isinstance(run, PendingSanitizer):
                return run.finish(job, self.settings.sanitizer_timeout_s)
            return run.finish(job, self.settings.profile_timeout_s)
        except Exception as exc:
            reason = f"{type(exc).__name__}: {exc}"
            if isinstance(run, PendingSanitizer):
                return SanitizerReport(run.tool, False, reason=reason)
            return InstructionProfile(False, reason, method=self.settings.profile_method)

    def _tools(self, status: Status) -> list[ToolKind]:
        """The tool runs this verdict calls for: memcheck for a candidate that ran or crashed
        (not for a hang: it would hang again under the tool, until the tool's deadline),
        racecheck on request for one that ran to completion, and the profile for a pass."""
        tools: list[ToolKind] = []
        if self.settings.memcheck and (status.ran or status is Status.RUNTIME_ERROR):
            tools.append("memcheck")
        if self.settings.racecheck and status.ran:
            tools.append("racecheck")
        if self.settings.profile and status is Status.PASSED:
            tools.append("profile")
        return tools

    def _run(
        self,
        task: Task,
        prepared: Prepared,
        states: list[WorkloadState],
        worker: WorkerProcess,
        stages: dict[str, float],
        before_timing: Callable[[], None],
    ) -> Verdict:
        plans = {s.spec.name: self._timing_plan() for s in states}
        library = hand_candidate(prepared.library, worker.home, prepared.entry)
        job = worker_job(task, library, states, plans, self.settings)
        job["entry"], job["facts"] = prepared.entry, prepared.facts
        # The outputs come back through shared memory sized for the largest output set.
        arena = channel.Arena.create(max(output_bytes(task, s.spec) for s in states))
        job["arena_bytes"] = arena.size
        checks = ReferenceChecks(self, task, states, plans)
        try:
            channel.send(worker.conn, job)
            arena.share(worker.conn, worker.process.pid)
            # While the worker starts on its checks: the judge's copies of its outputs to the
            # GPU, three of them inside the timing's hold alone, then go by DMA.
            mark = time.perf_counter()
            arena.pin()
            stages["arena_pin"] = time.perf_counter() - mark
            conversation = Conversation(
                task,
                states,
                plans,
                self.settings,
                checks,
                worker.conn,
                arena,
                stages,
                ended=lambda: how_it_ended(worker),
                before_timing=before_timing,
            )
            return conversation.run()
        except (OSError, EOFError) as exc:  # the worker died before it took the arena
            return Verdict(Status.RUNTIME_ERROR, f"the process running the kernel is gone ({exc})")
        finally:
            arena.close()
            stages["correctness_compare"] = checks.compare_seconds

    def _timing_plan(self) -> TimingPlan:
        """Fresh inputs for every call of a timed loop, from a seed of this evaluation, and
        which timed calls are checked: ``timed_checks`` of them, at random."""
        settings = self.settings
        timed = CallSchedule(settings.warmup, settings.iters, settings.trials).timed
        picks = _random.sample(timed, min(self.settings.timed_checks, len(timed)))
        return TimingPlan(secrets.randbits(60), frozenset(picks))

    def close(self) -> None:
        with self._mutex:
            spares, self.spares = self.spares, []
        for worker in spares:
            worker.kill()
        self.tool_runs.close()
        shutil.rmtree(self.folder, ignore_errors=True)


@dataclass(frozen=True)
class _ToolCall:
    """A tool run given its job and word, and the future of its result."""

    run: PendingRun
    result: Future[SanitizerReport | InstructionProfile]


class _WorkerHolds:
    """A worker's holds of the GPU: shared from its job on (its correctness stage, beside other
    checks and never beside a timing), then alone from ``alone`` (its timing) to the end of the
    block, which comes after the worker is gone. Stage seconds: ``checks_gpu_wait`` and
    ``checks_gpu`` (waiting for the shared hold, and holding it), ``gpu_wait`` and
    ``worker_gpu`` (waiting for the GPU alone, and holding it, the worker's end included)."""

    def __init__(
        self, device: int, settings: JudgeSettings, stages: dict[str, float], alone: bool = False
    ) -> None:
        """``settings``: the exclusive chain's length and whether start-ups may run beside the
        timing. ``alone``: the checks too hold the GPU alone (a retry, ``Judge.evaluate``)."""
        self.device = device
        self.settings = settings
        self.stages = stages
        self.held = contextlib.ExitStack()
        self.alone_from: float | None = None
        self.checks_alone = alone

    def __enter__(self) -> _WorkerHolds:
        if self.checks_alone:
            timing = timing_hold(self.device, self.settings)
            self.stages["gpu_wait"] = self.held.enter_context(timing)
            self.alone_from = self.checks_from = time.perf_counter()
            return self
        self.stages["checks_gpu_wait"] = self.held.enter_context(shared_gpu(self.device))
        self.checks_from = time.perf_counter()
        return self

    def alone(self) -> None:
        """Trade the shared hold for the GPU alone (a lock cannot be raised in place: another
        shared holder may take the turn between); nothing to trade when the checks held it
        alone already."""
        self.stages["checks_gpu"] = time.perf_counter() - self.checks_from
        if self.checks_alone:
            return
        self.held.close()
        self.stages["gpu_wait"] = self.held.enter_context(timing_hold(self.device, self.settings))
        self.alone_from = time.perf_counter()

    def __exit__(self, *exc: object) -> None:
        self.held.close()
        if self.alone_from is None:
            self.stages["checks_gpu"] = time.perf_counter() - self.checks_from
        else:
            self.stages["worker_gpu"] = time.perf_counter() - self.alone_from


def _memory_pauses() -> Iterator[float]:
    """The pauses between looks at device memory another candidate holds: _MEMORY_PAUSE_S,
    doubling up to _MEMORY_PAUSE_MAX_S, without end (each caller bounds its wait by
    _MEMORY_WAIT_S)."""
    pause = _MEMORY_PAUSE_S
    while True:
        yield pause
        pause = min(2 * pause, _MEMORY_PAUSE_MAX_S)
