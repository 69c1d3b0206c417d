"""Device time of a call: all work it launches, on any stream, with a cold L2.

Used the same way for candidates (in the worker) and baselines (in the judge), so the two are
comparable. A measurement is ``trials`` trials, each ``warmup`` untimed calls and then ``iters``
timed ones (``CallSchedule``: PTXBench's protocol, 10 warm-up and 50 timed calls per trial, 3
trials). Before every timed call, outside the measured window: the caller's ``prepare`` (poison
outputs, pick the input set), an L2 flush (a write over twice the L2 size), and a reset of the
persisting-L2 carve-out. The caller may also be told, outside the window too, when each call
(warm-up included) is about to start and when it is over, the device synchronised
(``before``/``after``: the worker reports each call to the judge, which times it from outside).
The call is bracketed by CUPTI timestamps; its device time is the span
from the first start to the last end of the kernels, copies and memsets whose launching API call
(runtime or driver, any thread) fell inside the bracket. API calls are recorded only around the
calls: the preparations between them make about 20,000 per measurement, whose reading took
0.8 s on the H200, while the GPU was held alone. Without CUPTI, the fallback is host
wall time from just before the call to the end of a device-wide synchronisation, which includes
launch overhead; the record says which method measured it. The latency is the mean of the
per-trial medians of the calls' times (``latency_of``), the judge's formula for what a worker
claims as well.
"""

from __future__ import annotations

import bisect
import statistics
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from typing import Any, Literal

from ptxgym.outcome import WorkloadTiming as WorkloadTiming  # still given here, where it was first

WARMUP_CALLS = 10
TIMED_CALLS = 50
TRIALS = 3
# How much longer than its claimed device time a timed call may take on the judge's clock:
# max(HOST_ALLOWANCE_MS, HOST_ALLOWANCE_RATIO x the device time) (the judge's settings' defaults;
# ptxgym.evaluate.worker_protocol.judged_latency). Here, beside the protocol, so that the prompt
# states the judge's numbers without importing the judge.
HOST_ALLOWANCE_MS = 2.0
HOST_ALLOWANCE_RATIO = 1.0
# The parts of a measurement's host time (``TimingResult.phase_seconds``).
TIMING_PHASES = ("prepare", "flush", "calls", "messages", "cupti")
# How a measurement timed the calls (``TimingResult.method``): CUPTI's device records, or the
# host's clock up to a device-wide synchronisation.
TimingMethod = Literal["cupti", "host-sync"]
TIMING_METHODS: tuple[TimingMethod, ...] = ("cupti", "host-sync")


@dataclass(frozen=True)
class TimingResult:
    """Every timed call's time, the medians per trial and their mean, in milliseconds."""

    method: str
    call_ms: tuple[float, ...]
    trial_medians_ms: tuple[float, ...]
    latency_ms: float
    persisting_l2_reset: bool
    # Host seconds of the whole measurement by part, for the stage breakdown (nothing is judged
    # on them): ``prepare`` (the caller's, and the warm-up calls), ``flush`` (L2), ``calls``
    # (the call and the synchronisation after it), ``messages`` (the caller's ``before`` and
    # ``after``), ``cupti`` (starting, flushing and reading the activity).
    phase_seconds: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class CallSchedule:
    """The calls of one measurement in order, numbered from the first warm-up call: each of
    ``trials`` trials is ``warmup`` untimed calls, then ``iters`` timed ones. The worker, the
    judge's script of the conversation and its choice of checked calls all number calls so."""

    warmup: int
    iters: int
    trials: int

    @property
    def calls(self) -> int:
        """How many calls the measurement makes, warm-up included."""
        return self.trials * (self.warmup + self.iters)

    def is_timed(self, call: int) -> bool:
        return 0 <= call < self.calls and call % (self.warmup + self.iters) >= self.warmup

    @property
    def timed(self) -> tuple[int, ...]:
        """The timed calls' numbers, in order."""
        return tuple(call for call in range(self.calls) if self.is_timed(call))


def latency_of(
    call_ms: Sequence[float], iters: int, trials: int
) -> tuple[tuple[float, ...], float]:
    """The median of each trial's ``iters`` consecutive calls, and the latency: their mean.

    One formula for every latency: the worker's and the baseline's measurements, and the
    judge's own reading of what a worker claims and of what it saw from outside."""
    if len(call_ms) != iters * trials:
        raise ValueError(f"{len(call_ms)} call times for {trials} trials of {iters} calls")
    medians = tuple(statistics.median(call_ms[t * iters : (t + 1) * iters]) for t in range(trials))
    return medians, statistics.fmean(medians)


class _Cupti:
    """CUPTI activity collection through cupti-python; one instance per process."""

    _API_KINDS = ("RUNTIME", "DRIVER")
    _DEVICE_KINDS = ("CONCURRENT_KERNEL", "MEMCPY", "MEMSET")

    def __init__(self) -> None:
        from cupti import cupti

        self.cupti = cupti
        self.api: list[tuple[int, int]] = []  # (start, correlation id)
        self.device: dict[int, list[tuple[int, int]]] = {}  # correlation id -> [(start, end)]
        kind = cupti.ActivityKind
        self._api_kinds = {int(getattr(kind, name)) for name in self._API_KINDS}
        self._device_kinds = {int(getattr(kind, name)) for name in self._DEVICE_KINDS}
        cupti.activity_register_callbacks(self._buffer_requested, self._buffer_completed)

    @staticmethod
    def _buffer_requested() -> tuple[int, int]:
        return 8 << 20, 0

    def _buffer_completed(self, activities: list[Any]) -> None:
        for activity in activities:
            kind = int(activity.kind)
            if kind in self._api_kinds:
                self.api.append((activity.start, activity.correlation_id))
            elif kind in self._device_kinds:
                self.device.setdefault(activity.correlation_id, []).append(
                    (activity.start, activity.end)
                )

    def start(self) -> None:
        """Record device work from here on (API calls only inside ``recording_api``)."""
        self.api.clear()
        self.device.clear()
        for name in self._DEVICE_KINDS:
            self.cupti.activity_enable(getattr(self.cupti.ActivityKind, name))

    @contextmanager
    def recording_api(self) -> Iterator[None]:
        """Record the API calls (any thread's) made in this block."""
        for name in self._API_KINDS:
            self.cupti.activity_enable(getattr(self.cupti.ActivityKind, name))
        try:
            yield
        finally:
            for name in self._API_KINDS:
                self.cupti.activity_disable(getattr(self.cupti.ActivityKind, name))

    def stop(self) -> None:
        self.cupti.activity_flush_all(1)
        for name in self._DEVICE_KINDS:
            self.cupti.activity_disable(getattr(self.cupti.ActivityKind, name))

    def timestamp(self) -> int:
        return int(self.cupti.get_timestamp())

    def spans_ms(self, brackets: list[tuple[int, int]]) -> list[float]:
        """Device span of the work launched inside each (start, end) bracket, in ms."""
        return device_spans_ms(self.api, self.device, brackets)


def device_spans_ms(
    api: list[tuple[int, int]],
    device: Mapping[int, list[tuple[int, int]]],
    brackets: list[tuple[int, int]],
) -> list[float]:
    """For each (begin, end) bracket of host timestamps: the span from the first start to the
    last end of the device work (``device``: correlation id -> [(start, end)]) whose launching
    API call (``api``: [(start, correlation id)]) started inside the bracket, in ms. A bracket
    that launched no device work is charged its host time.

    The API records are sorted once and each bracket's are found by bisection, not by a scan of
    all of them per bracket, which grows with the product of the two counts."""
    ordered = sorted(api)
    starts = [start for start, _ in ordered]
    spans = []
    for begin, end in brackets:
        inside = ordered[bisect.bisect_left(starts, begin) : bisect.bisect_right(starts, end)]
        windows = [window for _, correlation in inside for window in device.get(correlation, ())]
        if windows:
            first = min(start for start, _ in windows)
            last = max(stop for _, stop in windows)
            spans.append((last - first) / 1e6)
        else:
            # The call launched no device work: only its host time can be charged.
            spans.append((end - begin) / 1e6)
    return spans


@contextmanager
def seconds_into(seconds: dict[str, float], name: str) -> Iterator[None]:
    """Add the block's wall seconds to ``seconds[name]`` (for stage breakdowns)."""
    started = time.perf_counter()
    yield
    seconds[name] = seconds.get(name, 0.0) + time.perf_counter() - started


_cupti: _Cupti | None = None


def _cupti_or_none() -> _Cupti | None:
    global _cupti
    if _cupti is None:
        try:
            _cupti = _Cupti()
        except Exception:  # any failure to load or register means: fall back, and say so
            return None
    return _cupti


class Timer:
    """Times calls on the current CUDA device with the protocol above."""

    def __init__(self, *, use_cupti: bool = True) -> None:
        import torch

        self.torch = torch
        properties = torch.cuda.get_device_properties(torch.cuda.current_device())
        l2_bytes = int(getattr(properties, "L2_cache_size", 64 << 20))
        # Made at the first flush, while the GPU is held alone: a process's start-up, which
        # holds the start-up lock shared, makes its CUDA context and nothing else on the GPU
        # (ptxgym.device.lock).
        self.flush_bytes = max(2 * l2_bytes, 256 << 20)
        self.flush_buffer: Any = None
        self.cupti = _cupti_or_none() if use_cupti else None
        self._phases: dict[str, float] = {}
        self.runtime = _cuda_runtime()

    def _reset_l2(self) -> bool:
        if self.flush_buffer is None:
            self.flush_buffer = self.torch.empty(
                self.flush_bytes, dtype=self.torch.uint8, device="cuda"
            )
        self.flush_buffer.zero_()
        if self.runtime is None:
            return False
        limit = self.runtime.cudaLimit.cudaLimitPersistingL2CacheSize
        set_ok = self.runtime.cudaDeviceSetLimit(limit, 0)[0] == 0
        reset_ok = self.runtime.cudaCtxResetPersistingL2Cache()[0] == 0
        return bool(set_ok and reset_ok)

    def measure(
        self,
        call: Callable[[int], None],
        prepare: Callable[[int], None],
        *,
        warmup: int = WARMUP_CALLS,
        iters: int = TIMED_CALLS,
        trials: int = TRIALS,
        before: Callable[[int], None] | None = None,
        after: Callable[[int], None] | None = None,
    ) -> TimingResult:
        """Time ``call(i)`` ``iters`` times per trial, each trial after ``warmup`` untimed
        calls; ``i`` numbers the calls in order, warm-up included (``CallSchedule``).

        ``before(i)``, when given, runs right before call ``i`` (its preparation and the L2
        flush done, the device synchronised), and ``after(i)`` right after it, the device
        synchronised; both for the warm-up calls too, and neither inside the measured window."""
        self._phases = dict.fromkeys(TIMING_PHASES, 0.0)
        hooks = _Hooks(before, after, self._phases)
        timed_by = self._timed_by_host if self.cupti is None else self._timed_by_cupti
        times: list[float] = []
        reset_ok = True
        for trial in range(trials):
            first = trial * (warmup + iters)
            self._warm_up(call, prepare, hooks, first, warmup)
            trial_times, trial_reset_ok = timed_by(call, prepare, hooks, first + warmup, iters)
            times += trial_times
            reset_ok = reset_ok and trial_reset_ok
        medians, latency = latency_of(times, iters, trials)
        return TimingResult(
            method="cupti" if self.cupti is not None else "host-sync",
            call_ms=tuple(times),
            trial_medians_ms=medians,
            latency_ms=latency,
            persisting_l2_reset=reset_ok,
            phase_seconds=dict(self._phases),
        )

    def _warm_up(
        self,
        call: Callable[[int], None],
        prepare: Callable[[int], None],
        hooks: _Hooks,
        first: int,
        count: int,
    ) -> None:
        """``count`` untimed calls from index ``first``."""
        for index in range(first, first + count):
            with self._phase("prepare"):
                prepare(index)
                # The call may run on a stream of its own: order it after the preparation.
                self.torch.cuda.synchronize()
            hooks.before(index)
            with self._phase("prepare"):
                call(index)
                self.torch.cuda.synchronize()
            hooks.after(index)

    def _phase(self, name: str) -> AbstractContextManager[None]:
        return seconds_into(self._phases, name)

    def _timed_by_host(
        self,
        call: Callable[[int], None],
        prepare: Callable[[int], None],
        hooks: _Hooks,
        first: int,
        count: int,
    ) -> tuple[list[float], bool]:
        """``count`` calls from index ``first``, each timed on the host up to a device-wide
        synchronisation (the fallback without CUPTI)."""
        reset_ok = True
        times = []
        for i in range(first, first + count):
            reset_ok = self._prepare(prepare, i) and reset_ok
            hooks.before(i)
            with self._phase("calls"):
                started = time.perf_counter()
                call(i)
                self.torch.cuda.synchronize()
                times.append((time.perf_counter() - started) * 1e3)
            hooks.after(i)
        return times, reset_ok

    def _timed_by_cupti(
        self,
        call: Callable[[int], None],
        prepare: Callable[[int], None],
        hooks: _Hooks,
        first: int,
        count: int,
    ) -> tuple[list[float], bool]:
        """``count`` calls from index ``first``, each bracketed by CUPTI timestamps: device work
        recorded over all of them, API calls only inside the brackets, and the records read once
        at the end."""
        assert self.cupti is not None
        reset_ok = True
        brackets = []
        with self._phase("cupti"):
            self.cupti.start()
        try:
            for i in range(first, first + count):
                reset_ok = self._prepare(prepare, i) and reset_ok
                hooks.before(i)
                with self._phase("calls"):
                    with self.cupti.recording_api():
                        begin = self.cupti.timestamp()
                        call(i)
                        end = self.cupti.timestamp()
                    self.torch.cuda.synchronize()
                brackets.append((begin, end))
                hooks.after(i)
        finally:
            with self._phase("cupti"):
                self.cupti.stop()
        with self._phase("cupti"):
            return self.cupti.spans_ms(brackets), reset_ok

    def _prepare(self, prepare: Callable[[int], None], index: int) -> bool:
        """The caller's preparation, then the L2 flush, both finished before the call."""
        with self._phase("prepare"):
            prepare(index)
        with self._phase("flush"):
            reset_ok = self._reset_l2()
            self.torch.cuda.synchronize()
        return reset_ok


@dataclass(frozen=True)
class _Hooks:
    """The caller's ``before`` and ``after`` (each optional), their time added to the
    ``messages`` phase of ``phases``."""

    run_before: Callable[[int], None] | None
    run_after: Callable[[int], None] | None
    phases: dict[str, float]

    def before(self, index: int) -> None:
        if self.run_before is not None:
            with seconds_into(self.phases, "messages"):
                self.run_before(index)

    def after(self, index: int) -> None:
        if self.run_after is not None:
            with seconds_into(self.phases, "messages"):
                self.run_after(index)


def _cuda_runtime() -> Any:
    try:
        from cuda.bindings import runtime
    except ImportError:
        return None
    return runtime
