"""Sanitizer and profiler runs kept started ahead of need, for the judge.

A tool run's start-up (the tool, Python, a CUDA context under the tool) takes seconds; only the call
after the word is the candidate's. So the judge keeps, for each tool its settings turn on, runs
started and waiting, not yet bound to a candidate (``ptxgym.evaluate.single_call``), as it keeps
workers: a sanitizer run for every evaluation in flight, plus ``spare``; a fixed number of profile
runs (``spare_profiles``), since Nsight Compute's own process keeps a CPU core busy for as long as
its run lives (docs/benchmarks.md, tenth session). An evaluation takes the oldest waiting run of
each tool its verdict calls for and hands it the job; a run it does not need (a failed candidate is
not profiled) stays waiting for the next evaluation, so no start-up is wasted. A run whose program
ended while waiting (a failed start-up) is dropped at the next take, and a fresh one started when
none waits.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import Literal

from ptxgym.evaluate.count import PendingCount
from ptxgym.evaluate.profile import PendingProfile, profile_metrics
from ptxgym.evaluate.sanitizer import PendingSanitizer

ToolKind = Literal["memcheck", "racecheck", "profile"]
ProfileMethod = Literal["ncu", "cupti"]
PendingRun = PendingSanitizer | PendingProfile | PendingCount


class ToolRuns:
    """The waiting runs of each tool kind on one GPU."""

    def __init__(
        self,
        device: int,
        kinds: Iterable[ToolKind],
        spare: int,
        spare_profiles: int,
        profile_details: bool = False,
        lock_startups: bool = True,
        profile_method: ProfileMethod = "ncu",
    ) -> None:
        """``spare``: sanitizer runs kept waiting beyond one per evaluation in flight.
        ``spare_profiles``: profile runs kept waiting, whatever the evaluations in flight.
        ``profile_details``: profiles also collect ``ptxgym.evaluate.profile.DETAIL_METRICS``.
        ``lock_startups``: runs make their CUDA contexts holding the start-up lock shared.
        ``profile_method``: what the profile runs count with, Nsight Compute (``ncu``) or
        CUPTI's SASS metrics (``cupti``, ``ptxgym.evaluate.count``)."""
        self.profile_method = profile_method
        self.device = device
        self.spare = spare
        self.spare_profiles = spare_profiles
        self.lock_startups = lock_startups
        self.profile_metrics = profile_metrics(profile_details)
        self._waiting: dict[ToolKind, list[PendingRun]] = {kind: [] for kind in kinds}
        self._mutex = threading.Lock()

    @property
    def kinds(self) -> tuple[ToolKind, ...]:
        return tuple(self._waiting)

    def top_up(self, in_flight: int) -> None:
        """Start runs until each sanitizer, and the CUPTI count, has one waiting per evaluation
        in flight, plus ``spare``, and Nsight Compute's profile ``spare_profiles`` (its process
        keeps a core busy while it waits; a count run's is an idle Python)."""
        for kind in self._waiting:
            by_evaluation = kind != "profile" or self.profile_method == "cupti"
            wanted = in_flight + self.spare if by_evaluation else self.spare_profiles
            while True:
                with self._mutex:
                    if len(self._waiting[kind]) >= wanted:
                        break
                run = self._start(kind)
                with self._mutex:
                    self._waiting[kind].append(run)

    def take(self, kind: ToolKind) -> PendingRun:
        """The oldest waiting run of ``kind`` whose program still runs (a fresh one if none);
        the caller hands it a job and owns it."""
        while True:
            with self._mutex:
                run = self._waiting[kind].pop(0) if self._waiting[kind] else None
            if run is None:
                return self._start(kind)
            if run.call is None or run.call.alive:  # no tool at all: its finish says so
                return run
            run.cancel()

    def waiting(self, kind: ToolKind) -> int:
        with self._mutex:
            return len(self._waiting[kind])

    def close(self) -> None:
        """Cancel every waiting run (their programs end, their folders go)."""
        with self._mutex:
            runs = [run for waiting in self._waiting.values() for run in waiting]
            for waiting in self._waiting.values():
                waiting.clear()
        for run in runs:
            run.cancel()

    def _start(self, kind: ToolKind) -> PendingRun:
        if kind == "profile" and self.profile_method == "cupti":
            return PendingCount(device=self.device, lock_startup=self.lock_startups)
        if kind == "profile":
            return PendingProfile(
                device=self.device, metrics=self.profile_metrics, lock_startup=self.lock_startups
            )
        return PendingSanitizer(device=self.device, tool=kind, lock_startup=self.lock_startups)
