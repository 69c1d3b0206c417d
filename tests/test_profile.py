"""The profile stage's logic on the CPU: families from opcode counts, unknown profiles, feedback."""

from __future__ import annotations

import stat
import subprocess
import sys
from pathlib import Path

import pytest

from ptxgym import profile
from ptxgym.compiler import CompileResult
from ptxgym.feedback import render_feedback
from ptxgym.outcome import Outcome, Status
from ptxgym.profile import InstructionProfile, families_executed, profile_candidate
from ptxgym.sass import SassInventory
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


def test_missing_profiler_gives_unknown(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PTXGYM_NCU", "/nonexistent/ncu")
    result = profile_candidate(H100, "/nonexistent.so", WORKLOAD, 1, device=0)
    assert not result.ok and result.qualified is None
    assert "not found" in result.reason


def _fake_ncu(folder: Path, body: str) -> Path:
    """An executable standing in for ncu, beside a fake ``extras/python/ncu_report.py``."""
    (folder / "extras" / "python").mkdir(parents=True)
    (folder / "extras" / "python" / "ncu_report.py").write_text("")
    ncu = folder / "ncu"
    ncu.write_text(f"#!/bin/sh\n{body}\n")
    ncu.chmod(ncu.stat().st_mode | stat.S_IXUSR)
    return ncu


def test_failing_profiler_gives_unknown_with_its_words(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PTXGYM_NCU", str(_fake_ncu(tmp_path, "echo 'ERR_NVGPUCTRPERM'; exit 1")))
    result = profile_candidate(H100, "/nonexistent.so", WORKLOAD, 1, device=0)
    assert not result.ok and "exit code 1" in result.reason and "ERR_NVGPUCTRPERM" in result.reason


def test_hanging_profiler_is_killed_and_gives_unknown(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PTXGYM_NCU", str(_fake_ncu(tmp_path, "sleep 60")))
    result = profile_candidate(H100, "/nonexistent.so", WORKLOAD, 1, device=0, timeout_s=1)
    assert not result.ok and "within 1 s" in result.reason


def test_module_usage() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "ptxgym.profile"], capture_output=True, text=True, check=False
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
        kernels=("k",),
        families={"compute": True, "data_movement": True},
    )
    text = render_feedback(_passed(executed, {"compute": True, "data_movement": True}), H100)
    assert "- wgmma: executed (HGMMA 16,384 / 512)" in text
    assert "- TMA: executed (UTMALDG 128 / 128)" in text
    assert "Qualified: yes." in text


def test_feedback_says_present_in_sass_but_never_executed() -> None:
    idle = InstructionProfile(
        True,
        thread_counts={"FFMA": 9},
        kernels=("k",),
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
