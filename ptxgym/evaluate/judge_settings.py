"""The judge's settings: deadlines, the timing protocol, concurrency, the GPU's locks, and which
checks beyond correctness run; and the hold a timing takes under them."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

from ptxgym.device.lock import EXCLUSIVE_CHAIN_S, exclusive_gpu
from ptxgym.evaluate.profile import DEFAULT_TIMEOUT_S as DEFAULT_PROFILE_TIMEOUT_S
from ptxgym.evaluate.sanitizer import DEFAULT_TIMEOUT_S as DEFAULT_SANITIZER_TIMEOUT_S
from ptxgym.evaluate.timing import (
    HOST_ALLOWANCE_MS,
    HOST_ALLOWANCE_RATIO,
    TIMED_CALLS,
    TRIALS,
    WARMUP_CALLS,
    TimingMethod,
)
from ptxgym.evaluate.tool_runs import ProfileMethod


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
    # but not one of the judge's 50: on the H200 the task's GEMM (1.42 ms) timed with the
    # judge's protocol beside each of the judge's three kinds of start-up (a worker's, a count
    # run's, a memcheck run's; eight processes in a loop) stayed within the quiet spread (1.46 %;
    # 18 disturbed timings, -0.97 % to +0.66 %), as did a 41-ms GEMM beside plain and memcheck
    # start-ups; and at 16 trajectories the median speedup moved 0.03 % from one trajectory's
    # while the rate rose to 2,128 evaluations/hour (timings had waited on start-ups 0.54 s per
    # evaluation, 31 % of the time; docs/benchmarks.md, twenty-seventh and thirty-first
    # sessions). So the judge's own protocol lets them in; a shorter one (the GPU tests' 5 calls)
    # keeps them out. None: every timing keeps start-ups out.
    startups_beside_iters: int | None = TIMED_CALLS
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
    # (``ptxgym.evaluate.worker_process.worker_context``) instead of started afresh, which imports
    # Python's and torch's modules again: an evaluation with the tools off cost 1.3
    # CPU-seconds forked against 4.7 spawned on the H200 host, whose 16 cores bound 16
    # trajectories (docs/benchmarks.md, tenth session). False: spawned, for a judge whose
    # environment torch must not read (docs/security.md).
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
