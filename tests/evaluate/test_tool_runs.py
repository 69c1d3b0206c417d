"""Sanitizer and profiler runs started ahead of need, on the CPU, with stand-in tools.

The stand-ins behave like the real ones where it matters here: they read the single-call program's
spec (their last argument), wait for the judge's word like ``ptxgym.evaluate.single_call`` does,
read the job handed over with it, and report. The judge keeps runs of every tool its settings turn
on waiting (``ptxgym.evaluate.tool_runs``), hands a job only to those the verdict calls for, and
keeps the others waiting for the next evaluation.
"""

from __future__ import annotations

import json
import os
import stat
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import get_args

import numpy
import pytest

from ptxgym.evaluate.judge import Judge
from ptxgym.evaluate.judge_settings import JudgeSettings
from ptxgym.evaluate.single_call import _POISON_PATTERNS, CallJob
from ptxgym.evaluate.tool_runs import ToolKind, ToolRuns
from ptxgym.evaluate.worker import poison
from ptxgym.evaluate.workload_state import CheckStage, WorkloadState
from ptxgym.outcome import InstructionProfile, SanitizerReport, Status
from ptxgym.tasks import get_task
from ptxgym.tasks.schema import DType

GEMM = get_task("PTX-H100-GEMM")

# A stand-in tool: waits for the word in the job, leaves a mark saying which word came (in the
# folder above the job's, which outlives it), then reports as the real tool would.
_STAND_IN = """#!{python}
import json, os, sys, time
from pathlib import Path
spec = json.loads(Path(sys.argv[-1]).read_text())
marks = Path({marks!r})
marks.mkdir(exist_ok=True)
name = {name!r} + "-" + str(os.getpid())
(marks / (name + ".started")).write_text(str(time.monotonic()))
while True:
    if Path(spec["stop"]).exists():
        (marks / (name + ".stopped")).touch()
        sys.exit(4)
    if Path(spec["go"]).exists():
        break
    time.sleep(0.01)
job = json.loads(Path(spec["job"]).read_text())
job["input_bytes"] = {{k: Path(v).read_bytes().hex() for k, v in job["inputs"].items()}}
job["library_bytes"] = Path(job["library"]).read_text()
(marks / (name + ".went")).write_text(json.dumps(job))
(marks / (name + ".went-at")).write_text(str(time.monotonic()))
time.sleep({hold})  # the program's start-up after the word, before it has the GPU
Path(spec["taken"]).touch()
(marks / (name + ".taken-at")).write_text(str(time.monotonic()))
{report}
"""

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


def _stand_in(folder: Path, name: str, report: str, marks: Path, hold: float = 0.0) -> Path:
    tool = folder / name
    tool.write_text(
        _STAND_IN.format(
            python=sys.executable, marks=str(marks), name=name, report=report, hold=hold
        )
    )
    tool.chmod(tool.stat().st_mode | stat.S_IXUSR)
    return tool


@pytest.fixture
def judge(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Judge]:
    marks = tmp_path / "marks"
    tools = tmp_path / "tools"
    (tools / "extras" / "python").mkdir(parents=True)
    (tools / "extras" / "python" / "ncu_report.py").write_text(_READER)
    monkeypatch.setenv(
        "PTXGYM_COMPUTE_SANITIZER",
        str(_stand_in(tools, "compute-sanitizer", _MEMCHECK_REPORT, marks)),
    )
    monkeypatch.setenv("PTXGYM_NCU", str(_stand_in(tools, "ncu", _NCU_REPORT, marks, hold=0.5)))
    monkeypatch.setenv("PTXGYM_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("PTXGYM_LOCK_DIR", str(tmp_path / "locks"))
    stand_in = Judge.__new__(Judge)  # the tool logic needs the settings, device and the runs
    stand_in.settings = JudgeSettings(memcheck=True, profile=True)
    stand_in.profile_method = "ncu"
    stand_in.device = 0
    stand_in._mutex = threading.Lock()
    stand_in._in_flight = 1  # the evaluation under test
    stand_in.tool_runs = ToolRuns(0, ["memcheck", "profile"], spare=1, spare_profiles=2)
    yield stand_in
    stand_in.tool_runs.close()


def _library(tmp_path: Path) -> str:
    """A stand-in for a built library: the judge hands each run a copy of it."""
    library = tmp_path / "x.so"
    library.write_bytes(b"a stand-in library")
    return str(library)


def _state() -> WorkloadState:
    inputs = {"A": numpy.array([1, 2], numpy.uint8), "B": numpy.array([3], numpy.uint8)}
    return WorkloadState(GEMM.workloads[0], [CheckStage("trial0", 7, False)], 1.0, "cupti", inputs)


def _finish(
    judge: Judge, tmp_path: Path, status: Status, early: Sequence[ToolKind] = ()
) -> tuple[tuple[SanitizerReport, ...], InstructionProfile | None]:
    """The tools for a verdict of ``status``, ``early`` given their word with the worker's job
    (as the judge does for those whose calls share the GPU)."""
    state = _state()
    job = CallJob(GEMM, _library(tmp_path), state.spec.payload(), state.tool_inputs)
    with ThreadPoolExecutor(max_workers=3) as pool:
        given = {kind: judge._give_word(pool, kind, job) for kind in early}
        return judge._finish_tools(pool, job, status, given)


def _marks(tmp_path: Path, suffix: str) -> list[Path]:
    return sorted((tmp_path / "marks").glob(f"*.{suffix}"))


def _wait_for(tmp_path: Path, suffix: str, count: int) -> list[Path]:
    deadline = time.monotonic() + 30
    while len(_marks(tmp_path, suffix)) < count and time.monotonic() < deadline:
        time.sleep(0.01)
    found = _marks(tmp_path, suffix)
    assert len(found) >= count, f"{count} '{suffix}' marks expected, {len(found)} appeared"
    return found


def test_runs_wait_started_ahead_sanitizers_per_evaluation_in_flight_profiles_fixed(
    judge: Judge, tmp_path: Path
) -> None:
    # A sanitizer run for each evaluation in flight plus the spare; the profile runs' number
    # does not grow with the evaluations (Nsight Compute's process keeps a core busy).
    judge.tool_runs.top_up(3)
    assert judge.tool_runs.waiting("memcheck") == 4
    assert judge.tool_runs.waiting("profile") == 2
    _wait_for(tmp_path, "started", 6)  # every program started before any job
    assert not _marks(tmp_path, "went")
    judge.tool_runs.top_up(1)  # fewer evaluations: nothing started, nothing dropped
    assert judge.tool_runs.waiting("memcheck") == 4 and len(_marks(tmp_path, "started")) == 6
    runs = [run for kind in ("memcheck", "profile") for run in judge.tool_runs._waiting[kind]]
    judge.tool_runs.close()
    assert judge.tool_runs.waiting("profile") == 0
    for run in runs:  # every program ended, every folder gone
        assert run.call is not None and not run.call.alive and not run.call.folder.exists()


def test_a_crash_runs_memcheck_and_keeps_the_profile_waiting(judge: Judge, tmp_path: Path) -> None:
    judge.tool_runs.top_up(1)
    sanitizers, profile = _finish(judge, tmp_path, Status.RUNTIME_ERROR)
    (memcheck,) = sanitizers
    assert memcheck.tool == "memcheck" and memcheck.ok and memcheck.clean
    # The run's own account, and the judge's: writing the job, then waiting for the end.
    judged = {key: memcheck.call_seconds.pop(key) for key in ("handover", "until_end")}
    assert memcheck.call_seconds == {"context": 0.5, "gpu_wait": 0.25, "gpu": 1.0}
    assert all(seconds >= 0.0 for seconds in judged.values())
    assert profile is None
    (went,) = _marks(tmp_path, "went")
    assert went.name.startswith("compute-sanitizer-")
    job = json.loads(went.read_text())  # the job is handed over with the word
    # A copy in the run's own folder: the program may read nothing of the build cache.
    library = Path(job["library"])
    assert library.name == "candidate.so" and library.parent.name.startswith("ptxgym-memcheck")
    assert job["library_bytes"] == "a stand-in library"
    assert job["input_bytes"] == {"A": "0102", "B": "03"}
    assert job["task"]["id"] == GEMM.id
    # The profile run nobody needed waits on for the next evaluation; memcheck's is replaced.
    assert judge.tool_runs.waiting("profile") == 2
    assert judge.tool_runs.waiting("memcheck") == 2


def test_a_pass_runs_both_and_a_hang_runs_neither(judge: Judge, tmp_path: Path) -> None:
    sanitizers, profile = _finish(judge, tmp_path, Status.PASSED)
    assert [s.tool for s in sanitizers] == ["memcheck"]
    # The stand-in reader fails on purpose: the profile ran, and its failure is an unknown.
    assert profile is not None and not profile.ok
    assert "stand-in reader" in profile.reason
    assert sorted(p.name.split("-")[0] for p in _marks(tmp_path, "went")) == ["compute", "ncu"]
    # The profile has the GPU first: memcheck got its word only once the profile held it.
    (ncu_taken,) = (p for p in _marks(tmp_path, "taken-at") if p.name.startswith("ncu-"))
    (memcheck_went,) = (p for p in _marks(tmp_path, "went-at") if p.name.startswith("compute-"))
    assert float(memcheck_went.read_text()) >= float(ncu_taken.read_text())
    assert _finish(judge, tmp_path, Status.TIMEOUT) == ((), None)
    assert len(_marks(tmp_path, "went")) == 2


def test_tools_that_share_the_gpu_go_with_the_worker_and_a_hang_cancels_them(
    judge: Judge, tmp_path: Path
) -> None:
    # A CUPTI count shares the GPU and goes early with the sanitizers; Nsight Compute's
    # profile holds it alone and waits for a pass.
    assert judge._shared_tools() == ["memcheck"]
    judge.profile_method = "cupti"
    assert judge._shared_tools() == ["memcheck", "profile"]
    judge.profile_method = "ncu"
    # Given its word with the worker's job, memcheck's report is the verdict's.
    (memcheck,), _ = _finish(judge, tmp_path, Status.INCORRECT_NUMERICAL, early=["memcheck"])
    assert memcheck.ok and memcheck.clean
    # A hang calls for no tool: the early run is ended, not awaited (it would hang too).
    started = time.monotonic()
    assert _finish(judge, tmp_path, Status.TIMEOUT, early=["memcheck"]) == ((), None)
    assert time.monotonic() - started < 10


def test_a_run_whose_program_ended_while_waiting_is_replaced(judge: Judge, tmp_path: Path) -> None:
    judge.tool_runs.top_up(0)
    (run,) = judge.tool_runs._waiting["memcheck"]
    assert run.call is not None and run.call.group is not None
    run.call.group.kill()  # as a failed start-up would end
    taken = judge.tool_runs.take("memcheck")
    assert taken is not run and taken.call is not None and taken.call.alive
    assert not run.call.folder.exists()  # the dead one is cleaned up
    taken.cancel()


def test_the_spec_tells_the_program_where_the_gpu_lock_and_the_judge_are(
    judge: Judge, tmp_path: Path
) -> None:
    run = judge.tool_runs.take("memcheck")
    assert run.call is not None
    spec = json.loads((run.call.folder / "spec.json").read_text())
    assert spec["gpu_lock"] == str(tmp_path / "locks" / "gpu-0.lock")
    assert spec["judge_pid"] == os.getpid()
    assert Path(spec["job"]).parent == run.call.folder
    run.cancel()
    assert not run.call.folder.exists()


def test_the_program_waits_for_go_and_gives_up_on_stop_or_a_dead_judge(tmp_path: Path) -> None:
    from ptxgym.sandbox.processes import wait_for_word

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
    from ptxgym.evaluate.single_call import SECONDS_MARK, call_seconds

    fake = SECONDS_MARK + json.dumps({"context": 0.0, "gpu_wait": 0.0, "gpu": 0.0})
    parts = {"context": 1.5, "gpu_wait": 0.5, "load": 0.1, "inputs": 0.2}
    real = SECONDS_MARK + json.dumps({**parts, "call": 1.5, "gpu": 2.0, "other": 9.0})
    # A candidate may print a line of its own; the program's comes after the call returned.
    # Only the program's own keys are read.
    assert call_seconds(f"{fake}\nkernel output\n{real}\n== PROF == done") == {
        **parts,
        "call": 1.5,
        "gpu": 2.0,
    }
    assert call_seconds("no such line") == {}
    assert call_seconds(SECONDS_MARK + '{"gpu": "x"}') == {}  # malformed: nothing, no error


@pytest.mark.parametrize("dtype", sorted(get_args(DType)))
def test_a_tool_run_poisons_outputs_as_the_worker_does(dtype: str) -> None:
    # The single-call program sets its outputs with memsets of bit patterns; the worker fills
    # its tensors with NaN (or -0x7EADBEEF): the same bytes, for every output dtype.
    import torch

    size, pattern = _POISON_PATTERNS[dtype]
    tensor = torch.zeros(3, dtype=getattr(torch, dtype))
    poison({"out": tensor})
    assert tensor.view(torch.uint8).numpy().tobytes() == pattern.to_bytes(size, "little") * 3
