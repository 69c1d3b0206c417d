"""The memory-safety stage on the CPU: compute-sanitizer's output parsed, unknown results, the
judge's choice of tools and the MEMORY_ERROR verdict, and the feedback text."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from ptxgym.evaluate.judge import Judge
from ptxgym.evaluate.judge_settings import JudgeSettings
from ptxgym.evaluate.sanitizer import parse_error_count, parse_findings, sanitize_candidate
from ptxgym.evaluate.verdict import Verdict, with_memory_errors
from ptxgym.feedback import render_feedback
from ptxgym.outcome import Outcome, SanitizerReport, Status
from ptxgym.tasks import get_task

GEMM = get_task("PTX-H100-GEMM")
WORKLOAD = {"axes": GEMM.workloads[0].axes, "sequences": {}}

MEMCHECK_OUTPUT = """\
========= COMPUTE-SANITIZER
========= Invalid __global__ write of size 2 bytes
=========     at gemm_tn_kernel(const __nv_bfloat16 *, __nv_bfloat16 *, int)+0x1a30 in /root/.cache/ptxgym/builds/ab/abcd/candidate.cu:142
=========     by thread (3,0,0) in block (63,63,0)
=========     Access at 0x7f3a2c000000 is out of bounds
=========     and is 1 bytes after the nearest allocation at 0x7f3a28000000 of size 134217728 bytes
=========     Saved host backtrace up to driver entry point at kernel launch time
=========         Host Frame: [0x2f2a1b] in libcuda.so.1
=========         Host Frame: gemm in /root/.cache/ptxgym/builds/ab/abcd/candidate.so
=========
========= Program hit cudaErrorLaunchFailure (error 719) due to "unspecified launch failure" on CUDA API call to cudaStreamSynchronize.
=========     Saved host backtrace up to driver entry point at error
=========         Host Frame: [0x11] in libcudart.so
=========
a line the program itself printed
========= ERROR SUMMARY: 2 errors
"""  # noqa: E501

RACECHECK_OUTPUT = """\
========= COMPUTE-SANITIZER
========= Error: Race reported between Write access at k()+0x90 in ./candidate.cu:7
=========     and Read access at k()+0xb0 in ./candidate.cu:9 [128 hazards]
=========
========= RACECHECK SUMMARY: 1 hazard displayed (1 error, 0 warnings)
"""


def test_memcheck_findings_are_trimmed_without_backtraces_or_paths() -> None:
    assert parse_error_count(MEMCHECK_OUTPUT) == 2
    findings = parse_findings(MEMCHECK_OUTPUT)
    assert len(findings) == 2
    first = findings[0].splitlines()
    assert first[0] == "Invalid __global__ write of size 2 bytes"
    assert first[1].endswith("in candidate.cu:142")
    assert "/root" not in findings[0] and "Host Frame" not in findings[0]
    assert len(first) == 5  # the backtrace and everything below it are dropped
    assert findings[1].startswith("Program hit cudaErrorLaunchFailure")
    assert "a line the program itself printed" not in "".join(findings)


def test_racecheck_summary_counts_errors_not_warnings() -> None:
    assert parse_error_count(RACECHECK_OUTPUT) == 1
    assert (
        parse_error_count("========= RACECHECK SUMMARY: 3 hazards displayed (0 errors, 3 warnings)")
        == 0
    )
    assert parse_findings(RACECHECK_OUTPUT)[0].endswith("in candidate.cu:9 [128 hazards]")
    assert parse_error_count("no summary here") is None


def test_long_outputs_give_at_most_three_findings() -> None:
    block = (
        "========= Invalid __global__ read of size 4 bytes\n=========     at k()+0x10\n=========\n"
    )
    findings = parse_findings(block * 50 + "========= ERROR SUMMARY: 50 errors\n")
    assert len(findings) == 3


def _fake_sanitizer(folder: Path, body: str) -> Path:
    tool = folder / "compute-sanitizer"
    tool.write_text(f"#!/bin/sh\n{body}\n")
    tool.chmod(tool.stat().st_mode | stat.S_IXUSR)
    return tool


def _library(tmp_path: Path) -> str:
    """A stand-in for a built library: each run gets a copy of it."""
    library = tmp_path / "x.so"
    library.write_bytes(b"a stand-in library")
    return str(library)


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        ("sleep 60", "did not finish within 1 s"),
        ("echo 'Device not supported'; exit 1", "without its summary: Device not supported"),
    ],
)
def test_a_failing_sanitizer_gives_unknown(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, body: str, reason: str
) -> None:
    monkeypatch.setenv("PTXGYM_COMPUTE_SANITIZER", str(_fake_sanitizer(tmp_path, body)))
    report = sanitize_candidate(GEMM, _library(tmp_path), WORKLOAD, {}, device=0, timeout_s=1)
    assert not report.ok and report.clean is None and reason in report.reason


def test_missing_sanitizer_gives_unknown(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PTXGYM_COMPUTE_SANITIZER", "/nonexistent/compute-sanitizer")
    report = sanitize_candidate(GEMM, _library(tmp_path), WORKLOAD, {}, device=0)
    assert report.clean is None and "not found" in report.reason


def test_the_sanitizer_runs_the_single_call_program(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    arguments = tmp_path / "arguments"
    body = f"echo \"$@\" > {arguments}\ncat <<'END'\n{MEMCHECK_OUTPUT}END\nexit 86"
    monkeypatch.setenv("PTXGYM_COMPUTE_SANITIZER", str(_fake_sanitizer(tmp_path, body)))
    report = sanitize_candidate(GEMM, _library(tmp_path), WORKLOAD, {}, device=0, tool="memcheck")
    assert report.ok and report.errors == 2 and report.clean is False
    assert len(report.findings) == 2
    recorded = arguments.read_text()
    assert "--tool memcheck --error-exitcode 86" in recorded
    assert "-m ptxgym.evaluate.single_call" in recorded and recorded.strip().endswith("spec.json")


def test_memory_errors_turn_any_verdict_into_memory_error() -> None:
    found = SanitizerReport("memcheck", True, errors=2, findings=("Invalid write",))
    clean = SanitizerReport("memcheck", True)
    unknown = SanitizerReport("memcheck", False, reason="not found")
    passed = Verdict(Status.PASSED, "correct")
    assert with_memory_errors(passed, (clean,)) is passed
    assert with_memory_errors(passed, (unknown,)) is passed
    flagged = with_memory_errors(passed, (found,))
    assert flagged.status is Status.MEMORY_ERROR and "memcheck 2 errors" in flagged.message
    crashed = with_memory_errors(Verdict(Status.RUNTIME_ERROR, "illegal address"), (found,))
    assert crashed.status is Status.MEMORY_ERROR
    assert "the evaluation had found: RUNTIME_ERROR: illegal address" in crashed.message


@pytest.mark.parametrize(
    ("settings", "status", "tools"),
    [
        (JudgeSettings(), Status.PASSED, ["memcheck", "profile"]),
        (JudgeSettings(), Status.INCORRECT_NUMERICAL, ["memcheck"]),
        (JudgeSettings(), Status.RUNTIME_ERROR, ["memcheck"]),
        (JudgeSettings(), Status.TIMEOUT, []),
        (JudgeSettings(racecheck=True), Status.PASSED, ["memcheck", "racecheck", "profile"]),
        (JudgeSettings(racecheck=True), Status.RUNTIME_ERROR, ["memcheck"]),
        (JudgeSettings(memcheck=False), Status.PASSED, ["profile"]),
        (JudgeSettings(memcheck=False, profile=False), Status.PASSED, []),
        (JudgeSettings(profile=False), Status.PASSED, ["memcheck"]),
    ],
)
def test_which_tools_run_for_which_verdict(
    settings: JudgeSettings, status: Status, tools: list[str]
) -> None:
    judge = Judge.__new__(Judge)  # only the settings matter here; no GPU state is made
    judge.settings = settings
    assert judge._tools(status) == tools


def test_feedback_shows_findings_and_unknowns() -> None:
    outcome = Outcome(
        GEMM.id,
        Status.MEMORY_ERROR,
        "compute-sanitizer found memory errors in one call of the kernel (memcheck 2 errors)",
        "gpu",
        sanitizers=(
            SanitizerReport("memcheck", True, 2, parse_findings(MEMCHECK_OUTPUT)),
            SanitizerReport("racecheck", False, reason="racecheck did not finish within 120 s"),
        ),
    )
    text = render_feedback(outcome, GEMM)
    assert "- memcheck: 2 errors; the first:" in text
    assert "in candidate.cu:142" in text
    assert "- racecheck: unknown (racecheck did not finish within 120 s)" in text
    assert "Fix the out-of-bounds or misaligned access reported above." in text
