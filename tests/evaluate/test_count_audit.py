"""Nsight Compute's audit of CUPTI counts (``ptxgym.evaluate.count_audit``), on CPU: counts that
agree are kept, counts that differ make the profile unknown, an audit that fails changes nothing
but says so; the judge audits the share of qualified CUPTI counts its settings ask for."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import pytest

from ptxgym.evaluate.count_audit import AGREED, audited
from ptxgym.evaluate.judge import Judge
from ptxgym.evaluate.judge_settings import JudgeSettings
from ptxgym.evaluate.verdict import Verdict
from ptxgym.evaluate.verdict_json import verdict_from_json, verdict_to_json
from ptxgym.outcome import InstructionProfile, Status
from ptxgym.tasks import get_task

GEMM = get_task("PTX-H100-GEMM")

COUNTED = InstructionProfile(
    True,
    method="cupti",
    thread_counts={"HGMMA": 268_435_456, "UTMALDG": 524_288},
    warp_counts={"HGMMA": 8_388_608, "UTMALDG": 524_288},
    families={"compute": True, "data_movement": True},
    flops_executed=1_099_511_627_776,
    coverage=1.0,
    min_coverage=0.5,
)


def test_counts_nsight_compute_confirms_are_kept() -> None:
    audit = replace(COUNTED, method="ncu")
    result = audited(GEMM, COUNTED, audit)
    assert result.ok and result.qualified is True and result.audit == AGREED


def test_opcodes_outside_the_target_families_are_not_compared() -> None:
    """Nsight Compute counts every opcode; a count run only the target families' (HGMMA and
    UTMALDG here): BAR, BRA and the like on one side only are no difference."""
    audit = replace(
        COUNTED,
        method="ncu",
        thread_counts={**COUNTED.thread_counts, "BAR": 786_432, "BRA": 69_276_146},
        warp_counts={**COUNTED.warp_counts, "BAR": 24_576, "BRA": 2_164_880},
    )
    result = audited(GEMM, COUNTED, audit)
    assert result.ok and result.audit == AGREED


def test_counts_that_differ_make_the_profile_unknown_and_name_the_difference() -> None:
    # A forgery: a wgmma compiled in and never run, claimed to have done all the work.
    audit = replace(
        COUNTED, method="ncu", thread_counts={"UTMALDG": 524_288}, warp_counts={"UTMALDG": 524_288}
    )
    result = audited(GEMM, COUNTED, audit)
    assert result.ok is False and result.qualified is None and result.audit == "disagreed"
    assert "HGMMA threads 268,435,456 against Nsight Compute's 0" in result.reason
    assert "HGMMA warps 8,388,608 against Nsight Compute's 0" in result.reason


def test_an_audit_that_cannot_be_made_leaves_the_counts_and_says_why() -> None:
    audit = InstructionProfile(False, "LaunchFailed (exit code 9)", method="ncu")
    result = audited(GEMM, COUNTED, audit)
    assert result.ok and result.qualified is True
    assert result.audit == "inconclusive: Nsight Compute failed (LaunchFailed (exit code 9))"


def test_the_audit_travels_from_the_judge_to_the_client() -> None:
    verdict = Verdict(Status.PASSED, "ok", profile=audited(GEMM, COUNTED, replace(COUNTED)))
    assert verdict_from_json(verdict_to_json(verdict)).profile == verdict.profile


@pytest.mark.parametrize(
    ("rate", "profile", "due"),
    [
        (1.0, COUNTED, True),
        (0.0, COUNTED, False),
        (1.0, replace(COUNTED, method="ncu"), False),  # Nsight Compute's own counts
        (1.0, replace(COUNTED, families={"compute": False}), False),  # not qualified
        (1.0, replace(COUNTED, method="sass", families={}), False),  # decided without a run
    ],
)
def test_the_judge_audits_the_share_of_qualified_cupti_counts_asked_for(
    rate: float, profile: InstructionProfile, due: bool
) -> None:
    judge = SimpleNamespace(settings=JudgeSettings(count_audit_rate=rate))
    assert Judge._audit_due(judge, profile) is due  # type: ignore[arg-type]
