"""The judge's verdict on one candidate, and how the judge's stages make and amend it."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from ptxgym.outcome import CheckReport, InstructionProfile, SanitizerReport, Status, WorkloadTiming


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


# How CUDA, torch, compute-sanitizer and the judge's checks all say it (cudaErrorMemoryAllocation
# reads "out of memory"; torch's OutOfMemoryError "... ran out of memory").
OUT_OF_MEMORY = "out of memory"


def sharing_may_explain(verdict: Verdict, ended_sharing: bool) -> bool:
    """Whether the GPU shared with other evaluations could have caused this failure: a check's
    call that overran its bound beside other work (``ended_sharing``; a timed call has the GPU
    alone), or memory that was not there (the candidate's allocation, the judge's check, or
    memcheck's run failing for want of it, while another candidate may have held it all)."""
    if verdict.status is Status.TIMEOUT:
        return ended_sharing
    if verdict.status is Status.RUNTIME_ERROR:
        return OUT_OF_MEMORY in verdict.message.lower()
    if verdict.status is Status.MEMORY_ERROR:
        findings = [f for report in verdict.sanitizers for f in report.findings]
        return bool(findings) and all(OUT_OF_MEMORY in f.lower() for f in findings)
    return False


def passed_verdict(checks: list[CheckReport], timings: list[WorkloadTiming]) -> Verdict:
    """PASSED, with the latency summed over the workloads against the library's."""
    latency = sum(t.latency_ms for t in timings)
    baseline = sum(t.baseline_latency_ms for t in timings)
    return Verdict(
        Status.PASSED,
        f"correct on {len(checks)} checks; {latency:.4f} ms vs baseline {baseline:.4f} ms",
        tuple(checks),
        tuple(timings),
    )


def incorrect_verdict(report: CheckReport, checks: tuple[CheckReport, ...]) -> Verdict:
    """The failed check ``report`` as a verdict: its first problem's status, and what each
    wrong output showed."""
    status = {
        "shape": Status.INCORRECT_SHAPE,
        "dtype": Status.INCORRECT_DTYPE,
    }.get(report.first_problem, Status.INCORRECT_NUMERICAL)
    bad = [o for o in report.outputs if not o.ok]
    summary = "; ".join(f"{o.name}: {o.detail}" for o in bad)
    return Verdict(status, f"{report.workload}/{report.stage}: {summary}", checks)


def with_memory_errors(verdict: Verdict, reports: tuple[SanitizerReport, ...]) -> Verdict:
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
