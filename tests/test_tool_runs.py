"""Sanitizer and profiler runs started ahead of time, on the CPU, with stand-in tools.

The stand-ins behave like the real ones where it matters here: they start the single-call
program's job (its last argument), wait for the judge's word like ``ptxgym.single_call`` does,
and report. The judge starts every run the settings call for with the evaluation, then gives
the word only to those the verdict calls for and drops the others.
"""

from __future__ import annotations

import json
import stat
import sys
import time
from pathlib import Path

import pytest

from ptxgym.judge import Judge, JudgeSettings, _Stage, _WorkloadState
from ptxgym.outcome import Status
from ptxgym.tasks import get_task

GEMM = get_task("PTX-H100-GEMM")

# A stand-in tool: waits for the word in the job, leaves a mark saying which word came (in the
# folder above the job's, which outlives it), then reports as the real tool would.
_STAND_IN = """#!{python}
import json, sys, time
from pathlib import Path
job = json.loads(Path(sys.argv[-1]).read_text())
marks = Path({marks!r})
marks.mkdir(exist_ok=True)
name = {name!r}
(marks / (name + ".started")).write_text(str(time.monotonic()))
while True:
    if Path(job["stop"]).exists():
        (marks / (name + ".stopped")).touch()
        sys.exit(4)
    if Path(job["go"]).exists():
        break
    time.sleep(0.01)
(marks / (name + ".went")).write_text(str(time.monotonic()))
{report}
"""

# What the program prints last (where its seconds went), then the tool's summary.
_MEMCHECK_REPORT = (
    'print("ptxgym-single-call-seconds "\n'
    '      "{\\"context\\": 0.5, \\"gpu_wait\\": 0.25, \\"gpu\\": 1.0}")\n'
    'print("========= COMPUTE-SANITIZER\\n========= ERROR SUMMARY: 0 errors")'
)
# The stand-in ncu writes the report named after --export; the stand-in reader reads it.
_NCU_REPORT = """args = sys.argv
Path(args[args.index("--export") + 1]).write_text("report")"""
_READER = """
def load_report(path):
    raise RuntimeError("the stand-in reader only checks that reading starts")
"""


def _stand_in(folder: Path, name: str, report: str, marks: Path) -> Path:
    tool = folder / name
    tool.write_text(
        _STAND_IN.format(python=sys.executable, marks=str(marks), name=name, report=report)
    )
    tool.chmod(tool.stat().st_mode | stat.S_IXUSR)
    return tool


@pytest.fixture
def judge(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Judge:
    marks = tmp_path / "marks"
    tools = tmp_path / "tools"
    (tools / "extras" / "python").mkdir(parents=True)
    (tools / "extras" / "python" / "ncu_report.py").write_text(_READER)
    monkeypatch.setenv(
        "PTXGYM_COMPUTE_SANITIZER",
        str(_stand_in(tools, "compute-sanitizer", _MEMCHECK_REPORT, marks)),
    )
    monkeypatch.setenv("PTXGYM_NCU", str(_stand_in(tools, "ncu", _NCU_REPORT, marks)))
    monkeypatch.setenv("PTXGYM_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("PTXGYM_LOCK_DIR", str(tmp_path / "locks"))
    stand_in = Judge.__new__(Judge)  # the tool logic needs only the settings and the device
    stand_in.settings = JudgeSettings(memcheck=True, profile=True)
    stand_in.device = 0
    return stand_in


def _state() -> _WorkloadState:
    return _WorkloadState(GEMM.workloads[0], [_Stage("trial0", 7, False)], 1.0, "cupti")


def _wait_for(path: Path) -> None:
    deadline = time.monotonic() + 30
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert path.exists(), f"{path.name} never appeared"


def test_a_crash_runs_memcheck_and_drops_the_profile(judge: Judge, tmp_path: Path) -> None:
    pending = judge._start_tools(GEMM, "/x.so", _state())
    assert set(pending) == {"memcheck", "profile"}
    marks = tmp_path / "marks"
    _wait_for(marks / "compute-sanitizer.started")
    _wait_for(marks / "ncu.started")
    sanitizers, profile = judge._finish_tools(pending, Status.RUNTIME_ERROR)
    (memcheck,) = sanitizers
    assert memcheck.tool == "memcheck" and memcheck.ok and memcheck.clean
    assert memcheck.call_seconds == {"context": 0.5, "gpu_wait": 0.25, "gpu": 1.0}
    assert profile is None
    assert (marks / "compute-sanitizer.went").exists()
    assert not (marks / "ncu.went").exists()
    for run in pending.values():  # every folder is gone, every process too
        assert run.call is not None and not run.call.folder.exists()
        assert run.call.group is not None and run.call.group.process.poll() is not None


def test_a_pass_runs_both_and_a_hang_runs_neither(judge: Judge, tmp_path: Path) -> None:
    pending = judge._start_tools(GEMM, "/x.so", _state())
    sanitizers, profile = judge._finish_tools(pending, Status.PASSED)
    assert [s.tool for s in sanitizers] == ["memcheck"]
    # The stand-in reader fails on purpose: the profile ran, and its failure is an unknown.
    assert profile is not None and not profile.ok
    assert "stand-in reader" in profile.reason
    marks = tmp_path / "marks"
    assert (marks / "ncu.went").exists() and (marks / "compute-sanitizer.went").exists()

    pending = judge._start_tools(GEMM, "/x.so", _state())
    assert judge._finish_tools(pending, Status.TIMEOUT) == ((), None)


def test_the_job_tells_the_program_where_the_gpu_lock_and_the_judge_are(
    judge: Judge, tmp_path: Path
) -> None:
    pending = judge._start_tools(GEMM, "/x.so", _state())
    run = pending["memcheck"]
    assert run.call is not None
    job = json.loads((run.call.folder / "job.json").read_text())
    assert job["gpu_lock"] == str(tmp_path / "locks" / "gpu-0.lock")
    assert job["library"] == "/x.so" and job["seed"] == 7
    for each in pending.values():
        each.cancel()


def test_the_program_waits_for_go_and_gives_up_on_stop_or_a_dead_judge(tmp_path: Path) -> None:
    from ptxgym.processes import wait_for_word

    go, stop = tmp_path / "go", tmp_path / "stop"
    go.touch()
    assert wait_for_word(go, 1, stop=stop) is True
    stop.touch()
    assert wait_for_word(go, 1, stop=stop) is False  # stop wins over go
    stop.unlink()
    go.unlink()
    assert wait_for_word(go, 2**22 + 12345, stop=stop) is False  # no such process
    assert wait_for_word(go, 1, max_wait_s=0.05) is False  # nobody says anything


def test_the_last_seconds_line_of_a_run_is_the_one_read() -> None:
    from ptxgym.single_call import SECONDS_MARK, call_seconds

    fake = SECONDS_MARK + json.dumps({"context": 0.0, "gpu_wait": 0.0, "gpu": 0.0})
    real = SECONDS_MARK + json.dumps({"context": 1.5, "gpu_wait": 0.5, "gpu": 2.0})
    # A candidate may print a line of its own; the program's comes after the call returned.
    assert call_seconds(f"{fake}\nkernel output\n{real}\n== PROF == done") == {
        "context": 1.5,
        "gpu_wait": 0.5,
        "gpu": 2.0,
    }
    assert call_seconds("no such line") == {}
    assert call_seconds(SECONDS_MARK + '{"gpu": "x"}') == {}  # malformed: nothing, no error
