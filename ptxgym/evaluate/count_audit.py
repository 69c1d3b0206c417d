"""Nsight Compute's audit of CUPTI counts: the judge's check on counts the candidate's own
process wrote.

A CUPTI count run (``ptxgym.evaluate.count``) writes its counts from the process that runs the
candidate's host code, so a candidate could forge them (docs/security.md). On a share of the
qualified passes (``JudgeSettings.count_audit_rate``) the judge also profiles the same call with
Nsight Compute, whose report the candidate cannot write, and compares the target opcodes' counts.
Counts that differ make the profile unknown, which never qualifies; an audit that cannot be made
(Nsight Compute missing, or its instrumented run failing to launch the kernel) leaves the counts
as they were and says so.
"""

from __future__ import annotations

from dataclasses import replace

from ptxgym.evaluate.profile import InstructionProfile

AGREED = "agreed: Nsight Compute counted the same target instructions"


def audited(counted: InstructionProfile, audit: InstructionProfile) -> InstructionProfile:
    """``counted`` (CUPTI's) after Nsight Compute's ``audit`` of the same call: unknown, with
    every difference named, when their target opcode counts differ; else as it was, with what
    the audit found in ``audit``."""
    if not audit.ok:
        return replace(counted, audit=f"inconclusive: Nsight Compute failed ({audit.reason})")
    differences = [
        f"{opcode} {kind} {mine:,} against Nsight Compute's {theirs:,}"
        for kind, ours, reference in (
            ("threads", counted.thread_counts, audit.thread_counts),
            ("warps", counted.warp_counts, audit.warp_counts),
        )
        for opcode in sorted(set(ours) | set(reference))
        if (mine := ours.get(opcode, 0)) != (theirs := reference.get(opcode, 0))
    ]
    if not differences:
        return replace(counted, audit=AGREED)
    return replace(
        counted,
        ok=False,
        reason="the counts written by the candidate's process disagree with Nsight Compute's "
        "audit of the same call (" + "; ".join(differences[:4]) + ")",
        audit="disagreed",
    )
