"""Memory safety: one call of the candidate under compute-sanitizer (memcheck, or racecheck).

The judge runs this as its own operation after the correctness and timing stages, in a
disposable process (``ptxgym.evaluate.single_call``) started by compute-sanitizer. That process
allocates every input and output with the CUDA driver, each an allocation of its own, so a
write past the end of an output lands outside any allocation, where memcheck sees it (inside a
caching allocator's pool it would hit a neighbour and go unnoticed). The report keeps the error
count and the first findings, demangled (compute-sanitizer's default) and trimmed: no host
backtraces, file paths cut to the file name, a bounded number of lines.

A sanitizer that is missing, fails or times out gives a report that is not ``ok``: the memory
safety of the candidate is then unknown, and the step goes on.
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Literal

from ptxgym import paths
from ptxgym.evaluate.single_call import CallJob, PendingCall
from ptxgym.outcome import SanitizerReport
from ptxgym.tasks import Task

if TYPE_CHECKING:
    import numpy
    from numpy.typing import NDArray

Tool = Literal["memcheck", "racecheck"]
DEFAULT_TIMEOUT_S = 120.0
ERROR_EXIT_CODE = 86
MAX_FINDINGS = 3
_LINES_PER_FINDING = 6
_LINE_CHARS = 240
_PREFIX = re.compile(r"^=========(?: |$)")
_PATH = re.compile(r"(?<![\w.])(?:\.{1,2}|~)?(?:/[\w.+-]+)*/([\w.+-]+)")
_ERROR_SUMMARY = re.compile(r"ERROR SUMMARY: (\d+) errors?")
_RACE_SUMMARY = re.compile(r"RACECHECK SUMMARY: \d+ hazards? displayed \((\d+) errors?")


def find_compute_sanitizer() -> str | None:
    """``$PTXGYM_COMPUTE_SANITIZER``, else on PATH, else in CUDA's bin folder."""
    return paths.cuda_tool("compute-sanitizer", override="PTXGYM_COMPUTE_SANITIZER")


class PendingSanitizer:
    """A compute-sanitizer tool run started ahead of need
    (``ptxgym.evaluate.single_call.PendingCall``): ``finish`` hands it one call's job and reads the
    tool's report; ``cancel`` drops it."""

    def __init__(self, *, device: int, tool: Tool = "memcheck", lock_startup: bool = True) -> None:
        """``lock_startup``: as ``ptxgym.evaluate.single_call.PendingCall``'s."""
        self.tool = tool
        self.call: PendingCall | None = None
        sanitizer = find_compute_sanitizer()
        if sanitizer is None:
            return
        # The checked call holds the GPU shared: what it finds does not depend on what else runs,
        # and it never runs beside a timing (ptxgym.device.lock).
        self.call = PendingCall(
            device=device, prefix=f"ptxgym-{tool}-", lock_startup=lock_startup, exclusive=False
        )
        self.call.start(
            [
                sanitizer,
                "--tool",
                tool,
                "--error-exitcode",
                str(ERROR_EXIT_CODE),
                "--print-limit",
                str(MAX_FINDINGS * 4),
                "--target-processes",
                "application-only",
                *self.call.program,
            ]
        )

    def finish(self, job: CallJob, timeout_s: float = DEFAULT_TIMEOUT_S) -> SanitizerReport:
        """Run ``job``'s call under the tool; never raises for the candidate's or the tool's
        failures (they give a report that is not ``ok``)."""
        started = time.perf_counter()
        tool = self.tool

        def unknown(reason: str) -> SanitizerReport:
            return SanitizerReport(
                tool, False, reason=reason, seconds=time.perf_counter() - started
            )

        if self.call is None:
            return unknown("compute-sanitizer was not found")
        try:
            code, output = self.call.run(job, timeout_s)
        finally:
            self.call.close()
        if code is None:
            return unknown(f"{tool} did not finish within {timeout_s:.0f} s")
        errors = parse_error_count(output)
        if errors is None:
            tail = "\n".join(output.strip().splitlines()[-8:])
            return unknown(f"{tool} ended (exit code {code}) without its summary: {tail}")
        findings = parse_findings(output)
        return SanitizerReport(
            tool,
            True,
            errors,
            findings,
            seconds=time.perf_counter() - started,
            call_seconds=self.call.seconds(output),
        )

    def cancel(self) -> None:
        if self.call is not None:
            self.call.close()


def sanitize_candidate(
    task: Task,
    library: str,
    workload: Mapping[str, Any],
    inputs: Mapping[str, NDArray[numpy.uint8]],
    *,
    device: int,
    tool: Tool = "memcheck",
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> SanitizerReport:
    """Run one call of the candidate on ``workload`` under ``tool``, with ``inputs`` (made by
    ``ptxgym.evaluate.worker.host_inputs``)."""
    job = CallJob(task, library, workload, inputs)
    return PendingSanitizer(device=device, tool=tool).finish(job, timeout_s)


def parse_error_count(output: str) -> int | None:
    """The number of errors in the tool's summary line, or None when there is no summary."""
    for pattern in (_RACE_SUMMARY, _ERROR_SUMMARY):
        found = pattern.search(output)
        if found:
            return int(found.group(1))
    return None


def parse_findings(output: str) -> tuple[str, ...]:
    """The first findings of the tool's output, each a few lines without host backtraces, and
    with file paths cut to the file name (the build folder means nothing to the model)."""
    findings: list[str] = []
    block: list[str] = []
    in_backtrace = False

    def close() -> None:
        if block and len(findings) < MAX_FINDINGS:
            findings.append("\n".join(block[:_LINES_PER_FINDING]))
        block.clear()

    for raw in output.splitlines():
        if not _PREFIX.match(raw):
            continue
        line = _PREFIX.sub("", raw).rstrip()
        stripped = line.strip()
        if not stripped:
            close()
            in_backtrace = False
            continue
        if stripped.startswith(("COMPUTE-SANITIZER", "ERROR SUMMARY", "RACECHECK SUMMARY")):
            close()
            continue
        if "host backtrace" in stripped or stripped.startswith("Host Frame"):
            in_backtrace = True
            continue
        if in_backtrace and raw.startswith("=========         "):
            continue
        in_backtrace = False
        line = _PATH.sub(r"\1", line)
        block.append(line if len(line) <= _LINE_CHARS else line[: _LINE_CHARS - 3] + "...")
    close()
    return tuple(findings)
