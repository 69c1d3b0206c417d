"""The judge: the trusted GPU process that evaluates candidates through disposable workers.

One judge per GPU. It holds the workload state that must never be visible to candidate code — the
seeds, the reference outputs, the baseline latencies — and keeps it across steps. For each candidate
it hands a fresh worker (``ptxgym.evaluate.worker``) the library and the seeds, holds the
conversation with it (``Conversation``: every message taken against the protocol's script,
``ptxgym.evaluate.worker_protocol``, and the claimed timing bounded by the judge's own clock),
compares the outputs that come back with the references, and turns crashes, hangs, bad outputs and
broken protocol into a verdict. A worker that dies, hangs or breaks its CUDA context costs only
itself: it is killed, and a spare, already started, serves the next candidate.
"""

from __future__ import annotations

import collections
import contextlib
import math
import multiprocessing
import os
import random
import secrets
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, Protocol

from ptxgym.device.gpus import make_context, visible_gpus
from ptxgym.device.lock import (
    EXCLUSIVE_CHAIN_S,
    exclusive_gpu,
    shared_gpu,
    startup_hold,
    startup_lock_for,
    startup_lock_path,
)
from ptxgym.evaluate import worker_protocol as protocol
from ptxgym.evaluate.baselines import baseline_key, cached_baseline, store_baseline
from ptxgym.evaluate.compile_run import Prepared, prepare
from ptxgym.evaluate.correctness import CheckReport, check_outputs
from ptxgym.evaluate.count import self_test as count_self_test
from ptxgym.evaluate.count_audit import audited
from ptxgym.evaluate.profile import DEFAULT_TIMEOUT_S as DEFAULT_PROFILE_TIMEOUT_S
from ptxgym.evaluate.profile import InstructionProfile, PendingProfile, profile_metrics
from ptxgym.evaluate.sanitizer import DEFAULT_TIMEOUT_S as DEFAULT_SANITIZER_TIMEOUT_S
from ptxgym.evaluate.sanitizer import PendingSanitizer, SanitizerReport
from ptxgym.evaluate.single_call import CallJob, hand_candidate
from ptxgym.evaluate.timing import (
    HOST_ALLOWANCE_MS,
    HOST_ALLOWANCE_RATIO,
    TIMED_CALLS,
    TRIALS,
    WARMUP_CALLS,
    CallSchedule,
    Timer,
    TimingMethod,
    WorkloadTiming,
)
from ptxgym.evaluate.tool_runs import PendingRun, ProfileMethod, ToolKind, ToolRuns
from ptxgym.evaluate.worker import (
    WORKER_IMPORTS,
    host_bytes,
    make_inputs,
    resolve_callable,
    worker_main,
)
from ptxgym.languages import DEFAULT_LANGUAGE
from ptxgym.languages.base import ENTRY_C_ABI
from ptxgym.outcome import Status
from ptxgym.sandbox import channel
from ptxgym.tasks import Task, WorkloadSpec
from ptxgym.tasks.schema import TensorSpec

_random = random.SystemRandom()  # which timed calls are checked: not predictable from outside
_LOG_TAIL_CHARS = 2000
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


@dataclass(frozen=True)
class JudgeSettings:
    """Deadlines, the timing protocol, concurrency, and which checks beyond correctness run.

    ``memcheck``: compute-sanitizer memcheck on every candidate that ran (passed, or gave wrong
    results, or crashed; not one that hung). ``racecheck``: shared-memory race detection on
    request, for candidates that ran to completion. ``profile``: the Nsight Compute instruction
    profile of correct candidates. docs/evaluation.md gives what each costs.
    """

    stage_timeout_s: float = 300.0
    # How candidates and baselines are timed: "cupti" (device time of every kernel, copy and
    # memset the call launches; the judge refuses to start without it) or, only when asked for,
    # "host-sync" (host wall time to a device synchronisation, launch overhead included).
    timing_method: TimingMethod = "cupti"
    # How long one call may keep the worker from its next message while the judge holds the GPU
    # alone: max(call_timeout_floor_s, call_timeout_ratio x the library's latency on that
    # workload), and never beyond the stage's deadline. A kernel that hangs then costs seconds
    # of the GPU, not the stage's minutes; a correct kernel 1000x slower than the library still
    # runs (the naive GQA decode, the slowest example, is 62x).
    call_timeout_floor_s: float = 5.0
    call_timeout_ratio: float = 1000.0
    warmup: int = WARMUP_CALLS
    iters: int = TIMED_CALLS
    trials: int = TRIALS
    # Evaluations in flight in the judge at once. Their GPU stages take turns (ptxgym.device.lock);
    # their CPU stages (worker and tool start-up, report reading) overlap those of others. More in
    # flight only lengthens each one's waits for the GPU once it is busy, and fewer leave it
    # idle: at 16 trajectories on the H200, 4 gave 2,113-2,242 evaluations/hour against
    # 1,805-1,858 at 6 and 8 on one host, and 1,902 against 1,821 at 3, 1,787 at 2 and under
    # 1,500 at 1 on another (docs/benchmarks.md, twenty-sixth and twenty-seventh sessions).
    concurrency: int = 4
    # Workers kept started ahead of need (each holds a CUDA context, about 0.9 GB of GPU memory).
    # A worker takes seconds to start (Python, torch, CUDA, CUPTI); with several started ahead,
    # back-to-back steps find one ready even when an evaluation is shorter than a start.
    spare_workers: int = 3
    # Sanitizer runs kept waiting beyond one per evaluation in flight, for each sanitizer
    # turned on (ptxgym.evaluate.tool_runs); each holds a CUDA context under its tool.
    spare_tool_runs: int = 1
    # Profile runs kept waiting, however many evaluations are in flight: Nsight Compute's own
    # process kept a CPU core busy for as long as its run lived (on the H200 host, 10.6
    # CPU-seconds per evaluation at one trajectory and 30.8 at 16, where one per evaluation in
    # flight waited: docs/benchmarks.md, tenth session). A profile wanted when none waits
    # starts one (seconds).
    spare_profile_runs: int = 2
    # How long the judge's exclusive holders may hand the GPU on to each other without
    # releasing its lock (ptxgym.device.lock.EXCLUSIVE_CHAIN_S): longer keeps start-ups, tool
    # runs' calls and other judges waiting longer; 0 releases it after every hold.
    exclusive_chain_s: float = EXCLUSIVE_CHAIN_S
    # Keep each workload's inputs seeds, references and baseline across requests (and the
    # baseline on disk). False rebuilds them for every request: only to measure what reuse saves.
    reuse_state: bool = True
    # Memory the kept workload states may hold: their references on the GPU and the tool runs'
    # inputs in host memory, together; beyond it the least recently used are dropped (and
    # rebuilt when needed again). An MHA backward d128 task's references take 1.6 GB (4 stages
    # x dQ, dK, dV in float32); the GEMM's tool inputs 256 MB.
    state_budget_bytes: int = 16 << 30
    # Timed calls whose outputs are checked, chosen at random by the judge and told to the
    # worker only once each call is over. The latency is a median, so a kernel that is fast by
    # skipping work must skip it in most timed calls: each check then catches it with
    # probability above 1/2, and three with probability above 7/8.
    timed_checks: int = 3
    # How much longer than the claimed device time the timed calls may take on the judge's own
    # clock, from the worker's word before each call to its word after it (both latencies the mean
    # of the trial medians): max(host_allowance_ms, host_allowance_ratio x claimed). The difference
    # is the calls' host side: launches, the device synchronisation, CUPTI's switching, the two
    # messages and the judge's reading of them. Beyond it the calls did work the device timer does
    # not see (host code computing part of the result), or the claim was forged: RUNTIME_ERROR
    # (ptxgym.evaluate.worker_protocol.judged_latency). With a stand-in worker on a CPU host of 2
    # cores, 150 calls of 0.2 ms honestly claimed were 0.03 ms longer on the judge's clock, 0.17 ms
    # with 8 other busy processes, 0.65 ms with a thread of the judge computing without pause, and 4
    # ms (refused) with both at once. The floor leaves a GPU host's launches and synchronisation
    # about 1.3 ms under load; the ratio lets a long call set up on the host for as long as it
    # computes. A claim can be forged this much below the calls' real time (docs/security.md).
    host_allowance_ms: float = HOST_ALLOWANCE_MS
    host_allowance_ratio: float = HOST_ALLOWANCE_RATIO
    memcheck: bool = True
    racecheck: bool = False
    sanitizer_timeout_s: float = DEFAULT_SANITIZER_TIMEOUT_S
    profile: bool = True
    # What counts the executed instructions: CUPTI's SASS metrics in a run of ours ("cupti": no
    # profiler set-up per run, the GPU held shared, counts of the target opcodes only, no kernel
    # facts; ptxgym.evaluate.count), used once its self-test passes at start-up, else Nsight
    # Compute's instrumented run ("ncu": the kernel facts of profile_details too).
    profile_method: ProfileMethod = "cupti"
    profile_timeout_s: float = DEFAULT_PROFILE_TIMEOUT_S
    # The share of CUPTI-counted qualified passes whose call Nsight Compute profiles as well, to
    # catch counts forged by the candidate's process (ptxgym.evaluate.count_audit): each audit
    # holds the GPU alone about 1.3 s on the H200, 0.03 s per evaluation at 0.02. 1.0 audits
    # every one (for the numbers a benchmark reports), 0.0 none.
    count_audit_rate: float = 0.02
    # The profile also collects each kernel's throughput against the GPU's peaks and its occupancy
    # (ptxgym.evaluate.profile.DETAIL_METRICS) for the feedback: hardware counter passes that hold
    # the GPU alone about 0.4 s longer per step on the H200. Only Nsight Compute collects them:
    # asked for, they make the profile Nsight Compute's whatever profile_method says.
    profile_details: bool = False
    # Workers and tool runs make their CUDA contexts holding the GPU's start-up lock shared,
    # never beside a timing that keeps start-ups out (ptxgym.device.lock). False lets them start
    # any time. On the H200 at 16 trajectories the GPU was then held alone, for the stages that
    # need it, 94 % of the time against 42-59 % with the lock; but start-ups beside a long kernel
    # timed with few calls moved its timing by up to 8 % (a 42-ms GEMM timed with 3 trials of 5;
    # docs/benchmarks.md).
    lock_startups: bool = True
    # A timing of at least this many timed calls per trial (``iters``) lets other processes make
    # their CUDA contexts beside it: it holds the GPU alone but not its start-up lock. A context
    # disturbs the calls it overlaps, which moves a median of few calls per trial (the 8 % above)
    # but should not move one of many. None: every timing keeps start-ups out, as until the
    # H200 has shown that the judge's 50 calls do not move (at 16 trajectories a timing waited
    # on start-ups 0.54 s per evaluation, 31 % of the time; docs/benchmarks.md, twenty-seventh
    # session). Whatever this judge's own start-ups do, this decides for its timings.
    startups_beside_iters: int | None = None
    # After a timing that keeps start-ups out, with no other timing of this judge in line, the
    # judge keeps the start-up lock up to this long for its next timing (within
    # exclusive_chain_s of the chain's start) and releases only the GPU's lock: checks go on,
    # and the start-ups waiting make their contexts together at the chain's end rather than in
    # every gap between timings, where each next timing waited for them (0.54 s per evaluation
    # at 16 trajectories on the H200, docs/benchmarks.md, twenty-seventh session). Start-ups
    # then wait about a chain (its exclusive_chain_s and its last hold): the spare workers and
    # tool runs must cover one. Another judge's timings that keep start-ups out wait through a
    # linger too, with the GPU's lock free. 0: the start-up lock goes with the GPU's, as until
    # measured.
    startup_linger_s: float = 0.0
    # Workers forked from a process of the judge's that has imported what a worker imports
    # (``worker_context``) instead of started afresh, which imports Python's and torch's modules
    # again: an evaluation with the tools off cost 1.3 CPU-seconds forked against 4.7 spawned on
    # the H200 host, whose 16 cores bound 16 trajectories (docs/benchmarks.md, tenth session).
    # False: spawned, for a judge whose environment torch must not read (docs/security.md).
    fork_workers: bool = True
    # The judge compares each of its threads' outputs on a CUDA stream of that thread's own,
    # not on the device's one default stream, where every comparison's read back waited for the
    # copies and comparisons other evaluations had queued before it (at judge concurrency 8
    # on the H200, a correctness stage took 2.1 s against 0.47 s alone; docs/benchmarks.md,
    # sixteenth session). Off until measured there.
    check_streams: bool = False

    def __post_init__(self) -> None:
        if self.startups_beside_iters is not None and self.startups_beside_iters < 1:
            raise ValueError(
                "startups_beside_iters must be None or at least 1, "
                f"not {self.startups_beside_iters}"
            )
        if not self.startup_linger_s >= 0:
            raise ValueError(f"startup_linger_s must be at least 0, not {self.startup_linger_s}")

    @property
    def startups_beside_timings(self) -> bool:
        """Whether this judge's timings let other processes make CUDA contexts beside them."""
        threshold = self.startups_beside_iters
        return threshold is not None and self.iters >= threshold


def timing_hold(device: int, settings: JudgeSettings) -> contextlib.AbstractContextManager[float]:
    """GPU ``device`` held alone for a timing under ``settings`` (``ptxgym.device.lock``):
    handed on to the process's next exclusive holder for up to ``exclusive_chain_s``, start-ups
    kept out unless ``startups_beside_timings`` (and then up to ``startup_linger_s`` longer);
    yields the wait."""
    return exclusive_gpu(
        device,
        settings.exclusive_chain_s,
        settings.startups_beside_timings,
        settings.startup_linger_s,
    )


@dataclass(frozen=True)
class Verdict:
    """What the judge concluded about one candidate."""

    status: Status
    message: str
    checks: tuple[CheckReport, ...] = ()
    timings: tuple[WorkloadTiming, ...] = ()
    worker_log: str = ""
    sanitizers: tuple[SanitizerReport, ...] = ()
    profile: InstructionProfile | None = None
    seconds: float = 0.0
    # Wall seconds per stage: state, worker_start, checks_gpu_wait, correctness (of which
    # correctness_compare, the judge's comparisons), arena_pin, checks_gpu, gpu_wait, timing,
    # worker_gpu, spares_start, tools_wait, count_audit, memcheck, racecheck, profile and
    # profile_read, its report reading (only the stages that ran); shared_attempt when the
    # verdict is a second attempt's; queued and judged (the judge's queue and the whole
    # evaluation) when a judge server answered.
    stage_seconds: dict[str, float] = field(default_factory=dict)
    # Which confinement steps took effect in the worker that ran the candidate.
    isolation: dict[str, bool] = field(default_factory=dict)
    # The workload whose first trial's inputs memcheck, racecheck and the profile ran on (the
    # task's first; the others are checked and timed, not covered by the tools); empty when no
    # tool ran.
    tools_workload: str = ""

    @property
    def latency_ms(self) -> float | None:
        return sum(t.latency_ms for t in self.timings) if self.timings else None

    @property
    def baseline_latency_ms(self) -> float | None:
        return sum(t.baseline_latency_ms for t in self.timings) if self.timings else None


@dataclass
class _Stage:
    name: str
    seed: int
    outliers: bool
    references: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class _TimingPlan:
    """One workload's timed loop in one evaluation: call ``i`` runs on inputs made from
    ``seed + i`` (fresh each call, so no output can be cached by pointer or content), and the
    outputs of the timed calls in ``checked`` go to the judge. Only the seed goes to the
    worker: it learns that a call is checked once the call is over."""

    seed: int
    checked: frozenset[int]


@dataclass
class _WorkloadState:
    spec: WorkloadSpec
    stages: list[_Stage]
    baseline_ms: float
    baseline_method: str
    # The first stage's inputs in host memory, for the tool runs (ptxgym.evaluate.single_call);
    # empty when no tool is on, and for every workload but the task's first.
    tool_inputs: dict[str, Any] = field(default_factory=dict)

    @property
    def nbytes(self) -> int:
        """Memory held by the reference outputs and the tool runs' inputs (the seeds and the
        baseline are small)."""
        held = [tensor for stage in self.stages for tensor in stage.references.values()]
        held += list(self.tool_inputs.values())
        return sum(int(item.nbytes) for item in held if hasattr(item, "nbytes"))


def worker_context(fork: bool) -> multiprocessing.context.BaseContext:
    """How the judge starts its workers: afresh (``spawn``), or with ``fork`` forked from a
    process of the judge's that has imported ``WORKER_IMPORTS`` (Python's ``forkserver``, which
    is never the judge itself: the judge holds a CUDA context, which a fork must not copy)."""
    if not fork:
        return multiprocessing.get_context("spawn")
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(list(WORKER_IMPORTS))
    return context


class _Worker:
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
            header, _ = _receive(self.conn, timeout_s)
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


class _Timeout(Exception):
    pass


class TimingUnavailable(RuntimeError):
    """The timing method the settings ask for cannot run here: the judge does not start rather
    than time otherwise unasked."""


class WorkerStartError(RuntimeError):
    """Workers cannot start on this host (a broken CUDA set-up, a confinement the platform
    refuses): no candidate can be evaluated, so the request fails with the worker's own words."""


def _receive(
    conn: Connection, timeout_s: float, arena: channel.Arena | None = None
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The next message, whole within ``timeout_s`` (else _Timeout)."""
    try:
        return channel.receive(conn, arena, timeout_s)
    except channel.ChannelTimeout:
        raise _Timeout from None


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
        self.states: collections.OrderedDict[tuple[str, str], _WorkloadState] = (
            collections.OrderedDict()
        )
        self._state_locks: dict[tuple[str, str], threading.Lock] = {}
        self._mutex = threading.Lock()  # guards the two dicts above, the spares, _in_flight
        # Each judge thread's CUDA stream for its comparisons (settings.check_streams): one per
        # thread, not per evaluation, as the caching allocator keeps freed blocks per stream.
        self._check_streams = threading.local()
        self.spares: list[_Worker] = []
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

    def _start_worker(self) -> _Worker:
        return _Worker(
            self.context,
            self.device,
            self.folder,
            self.settings.lock_startups,
            use_cupti=self.settings.timing_method == "cupti",
        )

    def _take_worker(self) -> _Worker:
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
            no_memory = _OUT_OF_MEMORY in log.lower() or self._memory_short()
            if attempt >= 2 and not (no_memory and time.monotonic() < memory_deadline):
                raise WorkerStartError(
                    f"{problem} ({attempt} starts); its output: {log or '(none)'}"
                )
            if no_memory:
                time.sleep(next(pauses))
            attempt += 1
            worker = self._start_worker()

    def _start_problem(self, worker: _Worker) -> str | None:
        """Why ``worker`` cannot take a job (None when it can)."""
        try:
            worker.wait_ready(_WORKER_START_TIMEOUT_S)
        except _Timeout:
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

    def workload_state(self, task: Task, workload: WorkloadSpec) -> _WorkloadState:
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

    def _build_state(self, task: Task, workload: WorkloadSpec) -> _WorkloadState:
        torch = self.torch
        reference = resolve_callable(task.callables.reference)
        baseline = resolve_callable(task.callables.baseline)
        payload = workload.payload()
        stages = [_Stage(f"trial{i}", secrets.randbits(62), False) for i in range(TRIALS)]
        stages.append(_Stage("outliers", secrets.randbits(62), True))
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
        return _WorkloadState(workload, stages, baseline_ms, method, tool_inputs)

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
        if not _sharing_may_explain(verdict, ended_sharing):
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
                _tensor_bytes(task, w, {**task.definition.inputs, **task.definition.outputs})
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
                    or _OUT_OF_MEMORY not in str(exc).lower()
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
        verdict = _with_memory_errors(verdict, sanitizers)
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
        states: list[_WorkloadState],
        worker: _Worker,
        stages: dict[str, float],
        before_timing: Callable[[], None],
    ) -> Verdict:
        plans = {s.spec.name: self._timing_plan() for s in states}
        library = hand_candidate(prepared.library, worker.home, prepared.entry)
        job = _worker_job(task, library, states, plans, self.settings)
        job["entry"], job["facts"] = prepared.entry, prepared.facts
        # The outputs come back through shared memory sized for the largest output set.
        arena = channel.Arena.create(max(_output_bytes(task, s.spec) for s in states))
        job["arena_bytes"] = arena.size
        checks = _ReferenceChecks(self, task, states, plans)
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
                ended=lambda: _how_it_ended(worker),
                before_timing=before_timing,
            )
            return conversation.run()
        except (OSError, EOFError) as exc:  # the worker died before it took the arena
            return Verdict(Status.RUNTIME_ERROR, f"the process running the kernel is gone ({exc})")
        finally:
            arena.close()
            stages["correctness_compare"] = checks.compare_seconds

    def _timing_plan(self) -> _TimingPlan:
        """Fresh inputs for every call of a timed loop, from a seed of this evaluation, and
        which timed calls are checked: ``timed_checks`` of them, at random."""
        settings = self.settings
        timed = CallSchedule(settings.warmup, settings.iters, settings.trials).timed
        picks = _random.sample(timed, min(self.settings.timed_checks, len(timed)))
        return _TimingPlan(secrets.randbits(60), frozenset(picks))

    def _timed_references(self, task: Task, state: _WorkloadState, seed: int) -> dict[str, Any]:
        """The references for one timed call's inputs (made from the judge's own seed)."""
        reference = resolve_callable(task.callables.reference)
        inputs = make_inputs(task, state.spec.payload(), seed, False)
        references: dict[str, Any] = reference(inputs, **task.callables.params)
        return references

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


def _worker_job(
    task: Task,
    library: str,
    states: list[_WorkloadState],
    plans: dict[str, _TimingPlan],
    settings: JudgeSettings,
) -> dict[str, Any]:
    """What a worker is told: the task, the library, the timing protocol, and each workload's
    axes and seeds; never a reference, a baseline, or which timed calls are checked."""
    return {
        "task": task.model_dump(mode="json"),
        "library": library,
        "warmup": settings.warmup,
        "iters": settings.iters,
        "trials": settings.trials,
        "workloads": [
            {
                "name": s.spec.name,
                "axes": s.spec.axes,
                "sequences": s.spec.sequences,
                "checks": [
                    {"name": st.name, "seed": st.seed, "outliers": st.outliers} for st in s.stages
                ],
                "timing": {"seed": plans[s.spec.name].seed},
            }
            for s in states
        ],
    }


class CheckUnavailable(Exception):
    """Outputs the judge could not check, for a reason of the candidate's making (the message
    says which)."""


class OutputChecks(Protocol):
    """How a conversation checks outputs: the judge's ``_ReferenceChecks``, on the GPU, or a
    test's own. ``outputs`` may be views of the arena, valid during the call only."""

    def stage(self, workload: str, stage: str, outputs: dict[str, Any]) -> CheckReport: ...

    def timed_call(self, workload: str, call: int, outputs: dict[str, Any]) -> CheckReport: ...


class _ReferenceChecks:
    """The judge's checks: a worker's outputs copied to the GPU and compared with the
    references, a stage's from its workload state, a timed call's made from the judge's seed
    for that call."""

    def __init__(
        self,
        judge: Judge,
        task: Task,
        states: list[_WorkloadState],
        plans: dict[str, _TimingPlan],
    ) -> None:
        self.judge = judge
        self.task = task
        self.states = {state.spec.name: state for state in states}
        self.plans = plans
        # The judge's own seconds in the correctness stage's comparisons (outputs copied to the
        # GPU and compared): beside the worker's calls, what the stage's length is made of.
        self.compare_seconds = 0.0

    def stage(self, workload: str, stage: str, outputs: dict[str, Any]) -> CheckReport:
        state = self.states[workload]
        checked = next(s for s in state.stages if s.name == stage)
        started = time.perf_counter()
        try:
            return self._compare(
                state, stage, outputs, lambda: checked.references, outliers=checked.outliers
            )
        finally:
            self.compare_seconds += time.perf_counter() - started

    def timed_call(self, workload: str, call: int, outputs: dict[str, Any]) -> CheckReport:
        state = self.states[workload]
        seed = self.plans[workload].seed + call
        return self._compare(
            state,
            f"timed call {call}",
            outputs,
            lambda: self.judge._timed_references(self.task, state, seed),
        )

    def _compare(
        self,
        state: _WorkloadState,
        label: str,
        outputs: dict[str, Any],
        references: Callable[[], dict[str, Any]],
        *,
        outliers: bool = False,
    ) -> CheckReport:
        try:
            # Read back once per output (check_outputs), which syncs the stream: all of this
            # is done before the arena is wiped or the references freed.
            with self.judge.check_stream():
                on_gpu = {name: tensor.to("cuda") for name, tensor in outputs.items()}
                axes = self.task.axis_values(state.spec)
                return check_outputs(
                    self.task,
                    label,
                    state.spec.name,
                    axes,
                    on_gpu,
                    references(),
                    outliers=outliers,
                )
        except self.judge.torch.cuda.OutOfMemoryError:
            raise CheckUnavailable(
                f"the GPU ran out of memory while its outputs were checked "
                f"({state.spec.name}/{label}): the process running the kernel holds too much "
                "device memory"
            ) from None


class Conversation:
    """The judge's side of one evaluation's conversation with its worker.

    Each message is taken against the protocol's script
    (``ptxgym.evaluate.worker_protocol.Script``). Outputs are checked (``checks``), and the arena
    zeroed where they lay, before the answer. Each call of a timed loop is timed on the judge's own
    clock, the worker's timing is bounded by it (``protocol.judged_latency``), and the latency is
    the judge's reading of the claimed call times. Ends in a verdict: PASSED on ``done``, or the
    first failure, broken protocol included. Needs no GPU itself: a test can drive it with a
    stand-in worker."""

    def __init__(
        self,
        task: Task,
        states: list[_WorkloadState],
        plans: dict[str, _TimingPlan],
        settings: JudgeSettings,
        checks: OutputChecks,
        conn: Connection,
        arena: channel.Arena,
        stages: dict[str, float],
        ended: Callable[[], str],
        before_timing: Callable[[], None] = lambda: None,
    ) -> None:
        """``stages``: the evaluation's stage seconds, to which the correctness and timing
        stages (and the timing's parts, as the worker reported them) are added. ``ended``: how
        the worker's process ended, once its end of the channel is closed. ``before_timing``:
        called once every check has passed, before the worker is told to go on to its timing
        (the judge takes the GPU alone there)."""
        self.settings = settings
        self.before_timing = before_timing
        self.checks = checks
        self.conn = conn
        self.arena = arena
        self.stages = stages
        self.ended = ended
        self.baselines = {state.spec.name: state.baseline_ms for state in states}
        self.script = protocol.Script(
            [
                protocol.WorkloadScript(
                    state.spec.name,
                    tuple(stage.name for stage in state.stages),
                    protocol.output_layouts(task, state.spec),
                    plans[state.spec.name].checked,
                )
                for state in states
            ],
            tuple(task.definition.inputs),
            settings.warmup,
            settings.iters,
            settings.trials,
        )
        self.reports: list[CheckReport] = []
        self.timings: list[WorkloadTiming] = []
        self.started = time.perf_counter()
        # The judge's clock: when it last answered (the worker does nothing new before it has
        # the answer); for each call of the timed loop under way, that time and the arrival of
        # its ``calling``; and what it saw of each call that ran.
        self.answered = self.started
        self.calling: dict[int, tuple[float, float]] = {}
        self.clocks: dict[int, protocol.CallClock] = {}

    def message_timeout(self, due: protocol.Due) -> float:
        """How long the judge waits for the message ``due``: one call's bound
        (``JudgeSettings.call_timeout_floor_s`` and ``call_timeout_ratio``), within what is left
        of the stage's deadline."""
        left = self.settings.stage_timeout_s - (time.perf_counter() - self.started)
        # A message of no one workload (the end) is bounded by the slowest workload's library.
        baseline_ms = self.baselines.get(due.workload, max(self.baselines.values(), default=0.0))
        bound = max(
            self.settings.call_timeout_floor_s,
            self.settings.call_timeout_ratio * baseline_ms / 1e3,
        )
        return max(0.0, min(bound, left))

    def run(self) -> Verdict:
        """Take the worker's messages until it is done, fails, hangs or breaks the protocol."""
        due = self.script.due
        timeout = self.message_timeout(due)
        try:
            while True:
                due = self.script.due
                timeout = self.message_timeout(due)
                header, tensors = _receive(self.conn, timeout, self.arena)
                arrived = time.perf_counter()
                message = self.script.accept(header, tensors)
                if isinstance(message, protocol.WorkerError):
                    return self._verdict(Status.RUNTIME_ERROR, message.message)
                verdict = self._take(message, arrived)
                if verdict is not None:
                    return verdict
        except _Timeout:
            settings = self.settings
            return self._verdict(
                Status.TIMEOUT,
                f"no progress within {timeout:.1f} s during {due.where}: the kernel hangs or is "
                f"far too slow (a call may take at most max({settings.call_timeout_floor_s:g} s, "
                f"{settings.call_timeout_ratio:g} x the library's time), and the whole stage "
                f"{settings.stage_timeout_s:g} s)",
            )
        except (protocol.ProtocolError, channel.ChannelError) as exc:
            return self._verdict(
                Status.RUNTIME_ERROR,
                f"the process running the kernel broke the judge's protocol when {due} was "
                f"due: {exc}",
            )
        except (EOFError, OSError):
            return self._verdict(
                Status.RUNTIME_ERROR,
                f"the process running the kernel {self.ended()} during {due.where}",
            )
        except (CheckUnavailable, protocol.TimingDisagreement) as exc:
            return self._verdict(Status.RUNTIME_ERROR, str(exc))

    def _take(self, message: protocol.Message, arrived: float) -> Verdict | None:
        """Act on a message the script took, and answer it when it wants an answer; a verdict
        when the evaluation ends there."""
        due = message.due
        if due.kind == protocol.CALLING:
            self.calling[due.call] = (self.answered, arrived)
            return None
        if due.kind == protocol.RAN:
            since, called = self.calling.pop(due.call)
            self.clocks[due.call] = protocol.CallClock(
                (arrived - since) * 1e3, (arrived - called) * 1e3
            )
            # The script knows whether this call's outputs are due next.
            self._answer("keep" if self.script.due.kind == protocol.TIMED_CHECK else "next")
            return None
        if due.kind == protocol.CHECK:
            return self._check(message, self.checks.stage(due.workload, due.stage, message.outputs))
        if due.kind == protocol.TIMED_CHECK:
            report = self.checks.timed_call(due.workload, due.call, message.outputs)
            return self._check(message, report)
        if due.kind == protocol.TIMING:
            self._timing(message)
            return None
        return _passed(self.reports, self.timings)

    def _check(self, message: protocol.Message, report: CheckReport) -> Verdict | None:
        """Judge one checked call, its outputs copied out and compared (``report``)."""
        # Nothing of the outputs may stay where the worker could name it again.
        self.arena.wipe()
        self.reports.append(report)
        where = message.due.where
        if message.modified_inputs:
            return self._verdict(
                Status.INCORRECT_NUMERICAL,
                f"the kernel modified its input(s) {', '.join(message.modified_inputs)} "
                f"({where}); inputs are read-only",
            )
        if not report.ok:
            verdict = _incorrect(report, tuple(self.reports))
            if message.due.kind == protocol.TIMED_CHECK:
                verdict = replace(
                    verdict,
                    message=f"{verdict.message}; the correctness stage passed, but this call "
                    "of the timed loop (fresh inputs) was wrong: the result depends on earlier "
                    "calls (state kept between calls, a race, uninitialised memory) or on "
                    "being timed",
                )
            return verdict
        if message.due.kind == protocol.CHECK and self.script.due.kind != protocol.CHECK:
            self.stages["correctness"] = time.perf_counter() - self.started
            self.before_timing()
        self._answer("continue")
        return None

    def _timing(self, message: protocol.Message) -> None:
        """Take a workload's timing, bounded by what the judge saw of its calls."""
        workload = message.due.workload
        timed = self.script.schedule.timed
        judged = protocol.judged_latency(
            message.call_ms,
            [self.clocks[call] for call in timed],
            self.settings.iters,
            self.settings.trials,
            timed_calls=timed,
            allowance_ms=self.settings.host_allowance_ms,
            allowance_ratio=self.settings.host_allowance_ratio,
        )
        self.clocks.clear()
        baseline, latency = self.baselines[workload], judged.latency_ms
        self.timings.append(
            WorkloadTiming(
                workload,
                latency,
                baseline,
                baseline / latency,
                judged.trial_medians_ms,
                message.method,
                self.settings.warmup,
                self.settings.iters,
            )
        )
        if self.script.due.kind == protocol.DONE:
            self.stages["timing"] = (
                time.perf_counter() - self.started - self.stages.get("correctness", 0.0)
            )
        # What the host allowance bounds, to see how near honest calls come to it.
        host_side = (judged.wall_latency_ms - latency) / 1e3
        self.stages["timing_host_side"] = self.stages.get("timing_host_side", 0.0) + host_side
        for phase, seconds in message.phase_seconds.items():
            key = f"timing_{phase}"
            self.stages[key] = self.stages.get(key, 0.0) + seconds
        self._answer("continue")

    def _answer(self, kind: str) -> None:
        self.answered = time.perf_counter()
        channel.send(self.conn, {"kind": kind})

    def _verdict(self, status: Status, message: str) -> Verdict:
        return Verdict(status, message, tuple(self.reports), tuple(self.timings))


def _sharing_may_explain(verdict: Verdict, ended_sharing: bool) -> bool:
    """Whether the GPU shared with other evaluations could have caused this failure: a check's
    call that overran its bound beside other work (``ended_sharing``; a timed call has the GPU
    alone), or memory that was not there (the candidate's allocation, the judge's check, or
    memcheck's run failing for want of it, while another candidate may have held it all)."""
    if verdict.status is Status.TIMEOUT:
        return ended_sharing
    if verdict.status is Status.RUNTIME_ERROR:
        return _OUT_OF_MEMORY in verdict.message.lower()
    if verdict.status is Status.MEMORY_ERROR:
        findings = [f for report in verdict.sanitizers for f in report.findings]
        return bool(findings) and all(_OUT_OF_MEMORY in f.lower() for f in findings)
    return False


# How CUDA, torch, compute-sanitizer and the judge's checks all say it (cudaErrorMemoryAllocation
# reads "out of memory"; torch's OutOfMemoryError "... ran out of memory").
_OUT_OF_MEMORY = "out of memory"


def _passed(checks: list[CheckReport], timings: list[WorkloadTiming]) -> Verdict:
    latency = sum(t.latency_ms for t in timings)
    baseline = sum(t.baseline_latency_ms for t in timings)
    return Verdict(
        Status.PASSED,
        f"correct on {len(checks)} checks; {latency:.4f} ms vs baseline {baseline:.4f} ms",
        tuple(checks),
        tuple(timings),
    )


def _incorrect(report: CheckReport, checks: tuple[CheckReport, ...]) -> Verdict:
    status = {
        "shape": Status.INCORRECT_SHAPE,
        "dtype": Status.INCORRECT_DTYPE,
    }.get(report.first_problem, Status.INCORRECT_NUMERICAL)
    bad = [o for o in report.outputs if not o.ok]
    summary = "; ".join(f"{o.name}: {o.detail}" for o in bad)
    return Verdict(status, f"{report.workload}/{report.stage}: {summary}", checks)


def _how_it_ended(worker: _Worker) -> str:
    """How the worker's process ended, its end of the channel closed (waits for it a little)."""
    worker.process.join(timeout=5)
    code = worker.process.exitcode
    if code is not None and code < 0:
        return f"was killed by signal {-code}"
    return f"exited with code {code}"


def _memory_pauses() -> Iterator[float]:
    """The pauses between looks at device memory another candidate holds: _MEMORY_PAUSE_S,
    doubling up to _MEMORY_PAUSE_MAX_S, without end (each caller bounds its wait by
    _MEMORY_WAIT_S)."""
    pause = _MEMORY_PAUSE_S
    while True:
        yield pause
        pause = min(2 * pause, _MEMORY_PAUSE_MAX_S)


def _output_bytes(task: Task, workload: WorkloadSpec) -> int:
    """Bytes of the task's outputs for ``workload``, as laid out in an arena."""
    return _tensor_bytes(task, workload, task.definition.outputs)


def _tensor_bytes(task: Task, workload: WorkloadSpec, specs: Mapping[str, TensorSpec]) -> int:
    """Bytes of the tensors ``specs`` for ``workload``, each at an arena's alignment."""
    import torch

    axes = task.axis_values(workload)
    return channel.arena_bytes(
        [
            math.prod(axes[axis] for axis in spec.shape) * getattr(torch, spec.dtype).itemsize
            for spec in specs.values()
        ]
    )


def _with_memory_errors(verdict: Verdict, reports: tuple[SanitizerReport, ...]) -> Verdict:
    """MEMORY_ERROR when a sanitizer found errors: out-of-bounds or racy memory use is a defect
    even where this run's outputs happened to be right."""
    found = [r for r in reports if r.ok and r.errors]
    if not found:
        return verdict
    what = ", ".join(f"{r.tool} {r.errors} error{'s' if r.errors != 1 else ''}" for r in found)
    message = f"compute-sanitizer found memory errors in one call of the kernel ({what})"
    if verdict.status is not Status.PASSED:
        message += f"; the evaluation had found: {verdict.status.value}: {verdict.message}"
    return replace(verdict, status=Status.MEMORY_ERROR, message=message)
