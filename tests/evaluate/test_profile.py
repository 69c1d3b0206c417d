"""The profile stage's logic on the CPU: families from opcode counts, unknown profiles, feedback."""

from __future__ import annotations

import stat
import subprocess
import sys
from pathlib import Path

import pytest

from ptxgym.build.result import CompileResult
from ptxgym.build.sass import SassInventory
from ptxgym.evaluate import profile
from ptxgym.evaluate.profile import (
    DETAIL_METRICS,
    PROFILE_METRICS,
    families_executed,
    profile_candidate,
)
from ptxgym.feedback import render_feedback
from ptxgym.outcome import InstructionProfile, KernelFacts, Outcome, Status
from ptxgym.tasks import get_task

H100 = get_task("PTX-H100-GEMM")
B200 = get_task("PTX-B200-GEMM")
WORKLOAD = {"axes": H100.workloads[0].axes, "sequences": {}}


def test_hopper_families_from_executed_counts() -> None:
    assert families_executed(H100, {"HGMMA": 512, "FFMA": 10}) == {
        "compute": True,
        "data_movement": False,
    }
    assert families_executed(H100, {"UBLKCP": 1}) == {"compute": False, "data_movement": True}
    assert families_executed(H100, {"HGMMA": 0, "UTMALDG": 0}) == {
        "compute": False,
        "data_movement": False,
    }


def test_blackwell_compute_needs_mma_and_tmem_readback() -> None:
    assert not families_executed(B200, {"UTCHMMA": 4})["compute"]
    assert families_executed(B200, {"UTCHMMA": 4, "LDTM": 8})["compute"]
    assert families_executed(B200, {"UTCQMMA": 4, "LDTM": 8})["compute"]


def test_an_unknown_profile_never_qualifies() -> None:
    assert InstructionProfile(False, "ncu failed").qualified is None
    assert InstructionProfile(True, families={"compute": False}).qualified is False
    assert InstructionProfile(True, families={"compute": True}).qualified is True


@pytest.fixture
def library(tmp_path: Path) -> str:
    """A stand-in for a built library: each run gets a copy of it."""
    path = tmp_path / "x.so"
    path.write_bytes(b"a stand-in library")
    return str(path)


def test_missing_profiler_gives_unknown(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PTXGYM_NCU", "/nonexistent/ncu")
    result = profile_candidate(H100, "/nonexistent.so", WORKLOAD, {}, device=0)
    assert not result.ok and result.qualified is None
    assert "not found" in result.reason


def _fake_ncu(folder: Path, body: str, report_module: str = "") -> Path:
    """An executable standing in for ncu, beside a fake ``extras/python/ncu_report.py``."""
    (folder / "extras" / "python").mkdir(parents=True)
    (folder / "extras" / "python" / "ncu_report.py").write_text(report_module)
    ncu = folder / "ncu"
    ncu.write_text(f"#!/bin/sh\n{body}\n")
    ncu.chmod(ncu.stat().st_mode | stat.S_IXUSR)
    return ncu


def test_failing_profiler_gives_unknown_with_its_words(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, library: str
) -> None:
    monkeypatch.setenv("PTXGYM_NCU", str(_fake_ncu(tmp_path, "echo 'ERR_NVGPUCTRPERM'; exit 1")))
    result = profile_candidate(H100, library, WORKLOAD, {}, device=0)
    assert not result.ok and "exit code 1" in result.reason and "ERR_NVGPUCTRPERM" in result.reason


def test_hanging_profiler_is_killed_and_gives_unknown(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, library: str
) -> None:
    monkeypatch.setenv("PTXGYM_NCU", str(_fake_ncu(tmp_path, "sleep 60")))
    result = profile_candidate(H100, library, WORKLOAD, {}, device=0, timeout_s=1)
    assert not result.ok and "within 1 s" in result.reason


# A stand-in for Nsight Compute's report interface: two profiled launches with known metrics.
_FAKE_REPORT_MODULE = """
class _Names:
    def __init__(self, names):
        self.names = names
    def as_string(self, index):
        return self.names[index]

class _Metric:
    def __init__(self, value):
        self.value = value
    def correlation_ids(self):
        return _Names(list(self.value))
    def num_instances(self):
        return len(self.value)
    def as_uint64(self, index):
        return list(self.value.values())[index]
    def as_double(self):
        return float(self.value)

class _Action:
    def __init__(self, name, metrics):
        self._name, self.metrics = name, metrics
    def name(self):
        return self._name
    def metric_by_name(self, name):
        return _Metric(self.metrics[name]) if name in self.metrics else None

class _Range:
    def __init__(self, actions):
        self.actions = actions
    def num_actions(self):
        return len(self.actions)
    def action_by_idx(self, index):
        return self.actions[index]

class _Report:
    def num_ranges(self):
        return 1
    def range_by_idx(self, index):
        return _Range([
            _Action("producer", {
                "sass__thread_inst_executed_true_per_opcode": {"HGMMA": 256, "FFMA": 7},
                "sass__inst_executed_per_opcode": {"HGMMA": 8, "FFMA": 1},
                "gpu__time_duration.sum": 1500000.0,
                "sm__throughput.avg.pct_of_peak_sustained_elapsed": 81.5,
                "launch__registers_per_thread": 168,
            }),
            _Action("epilogue", {
                "sass__thread_inst_executed_true_per_opcode": {"HGMMA": 128},
                "sass__inst_executed_per_opcode": {"HGMMA": 4},
            }),
        ])

def load_report(path):
    assert open(path).read() == "report"
    return _Report()
"""


@pytest.fixture
def recording_ncu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fake ncu that records its arguments and writes the report file named after --export;
    the file its arguments go to."""
    ncu = _fake_ncu(
        tmp_path,
        'echo "$@" > "$(dirname "$0")/args"\n'
        'while [ "$1" != "--export" ]; do shift; done; printf report > "$2"',
        _FAKE_REPORT_MODULE,
    )
    monkeypatch.setenv("PTXGYM_NCU", str(ncu))
    return tmp_path / "args"


def test_report_is_read_through_the_report_interface(recording_ncu: Path, library: str) -> None:
    result = profile_candidate(H100, library, WORKLOAD, {}, device=0)
    assert result.ok, result.reason
    assert result.thread_counts == {"HGMMA": 384, "FFMA": 7}
    assert result.warp_counts == {"HGMMA": 12, "FFMA": 1}
    assert result.families == {"compute": True, "data_movement": False}
    assert result.kernels == (
        KernelFacts(
            "producer", duration_us=1500.0, sm_throughput_pct=81.5, registers_per_thread=168
        ),
        KernelFacts("epilogue"),
    )
    arguments = recording_ncu.read_text()
    for expected in (
        "--profile-from-start off",
        "--clock-control none",
        "--metrics sass__thread_inst_executed_true_per_opcode,sass__inst_executed_per_opcode,"
        "gpu__time_duration.sum,",
        "-m ptxgym.evaluate.single_call",
    ):
        assert expected in arguments
    assert "--section" not in arguments  # named metrics only: each section adds replay passes
    # The details (hardware counter passes of their own) only on request.
    assert not any(metric in arguments for metric in DETAIL_METRICS.values())


def test_details_are_collected_on_request(recording_ncu: Path, library: str) -> None:
    result = profile_candidate(H100, library, WORKLOAD, {}, device=0, details=True)
    assert result.ok, result.reason
    metrics = recording_ncu.read_text().split("--metrics ")[1].split()[0].split(",")
    assert set(metrics) == {*PROFILE_METRICS, *DETAIL_METRICS.values()}


def test_a_report_the_profiled_program_writes_itself_is_never_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, library: str
) -> None:
    # The profiled program's folder is its working directory: a report forged there (by a
    # candidate, before the tool writes its own) is not where the judge reads the report from.
    ncu = _fake_ncu(
        tmp_path,
        "printf report > profile.ncu-rep\n"
        'while [ "$1" != "--export" ]; do shift; done\n'
        'case "$2" in "$PWD"/*) printf report > "$2";; esac',
        _FAKE_REPORT_MODULE,
    )
    monkeypatch.setenv("PTXGYM_NCU", str(ncu))
    result = profile_candidate(H100, library, WORKLOAD, {}, device=0)
    assert not result.ok and "the profiled run failed" in result.reason


def test_module_usage() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "ptxgym.evaluate.profile"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 2 and "usage" in result.stderr


def _passed(profile_: InstructionProfile | None, sass_present: dict[str, bool]) -> Outcome:
    build = CompileResult(
        ok=True,
        log="",
        source_hash="0",
        arch="sm_90a",
        seconds=1.0,
        sass=SassInventory(tool="cuobjdump", kernels=(), families_present=sass_present),
    )
    return Outcome(
        H100.id,
        Status.PASSED,
        "correct",
        "gpu",
        compile=build,
        speedup=0.5,
        qualified=profile_.qualified if profile_ else None,
        profile=profile_,
    )


def test_feedback_names_executed_families_with_counts() -> None:
    executed = InstructionProfile(
        True,
        thread_counts={"HGMMA": 16384, "UTMALDG": 128, "FFMA": 9},
        warp_counts={"HGMMA": 512, "UTMALDG": 128},
        kernels=(
            KernelFacts(
                "gemm_ws_kernel",
                duration_us=1523.4,
                sm_throughput_pct=88.2,
                memory_throughput_pct=41.0,
                dram_throughput_pct=22.5,
                achieved_occupancy_pct=18.7,
                theoretical_occupancy_pct=18.75,
                registers_per_thread=168,
                grid_size=2048,
                block_size=384,
            ),
            KernelFacts("tiny"),
        ),
        families={"compute": True, "data_movement": True},
    )
    text = render_feedback(_passed(executed, {"compute": True, "data_movement": True}), H100)
    assert "- wgmma: executed (HGMMA 16,384 / 512)" in text
    assert "- TMA: executed (UTMALDG 128 / 128)" in text
    assert "Qualified: yes." in text
    assert (
        "- gemm_ws_kernel: 1523.4 us, SM throughput 88%, memory throughput 41%, "
        "DRAM throughput 22%, achieved occupancy 19%, theoretical occupancy 19%, "
        "168 registers/thread, grid 2048 x 384 threads"
    ) in text
    assert "- tiny: " in text  # a launch without facts is still named


def test_feedback_says_present_in_sass_but_never_executed() -> None:
    idle = InstructionProfile(
        True,
        thread_counts={"FFMA": 9},
        kernels=(KernelFacts("k"),),
        families={"compute": False, "data_movement": False},
    )
    text = render_feedback(_passed(idle, {"compute": True, "data_movement": False}), H100)
    assert "- wgmma: present in SASS but never executed" in text
    assert "- TMA: not executed (no UTMALDG/UBLKCP in the code)" in text
    assert "Qualified: no; a correct kernel qualifies by executing wgmma or TMA." in text


def test_feedback_for_unknown_and_missing_profiles() -> None:
    unknown = InstructionProfile(False, "the profile did not finish within 300 s")
    assert "unknown (the profile did not finish" in render_feedback(_passed(unknown, {}), H100)
    assert "unknown (not profiled)" in render_feedback(_passed(None, {}), H100)
    assert profile.THREAD_METRIC == "sass__thread_inst_executed_true_per_opcode"
