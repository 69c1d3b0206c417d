"""Nsight Compute's audit of CUPTI counts: the judge's check on counts the candidate's own
process wrote.

A CUPTI count run (``ptxgym.evaluate.count``) writes its counts from the process that runs the
candidate's host code, so a candidate could forge them (docs/security.md). On a share of the
qualified passes (``JudgeSettings.count_audit_rate``) the judge also profiles the same call with
Nsight Compute, whose report the candidate cannot write, and compares the target opcodes' counts
(Nsight Compute counts every opcode; a count run only those of the task's target families).
Counts that differ make the profile unknown, which never qualifies; an audit that cannot be made
(Nsight Compute missing, or its instrumented run failing to launch the kernel) leaves the counts
as they were and says so.
"""

from __future__ import annotations

from dataclasses import replace

from ptxgym.build.sass import matches_any, target_patterns
from ptxgym.outcome import InstructionProfile
from ptxgym.tasks import Task

AGREED = "agreed: Nsight Compute counted the same target instructions"


def audited(
    task: Task, counted: InstructionProfile, audit: InstructionProfile
) -> InstructionProfile:
    """``counted`` (CUPTI's) after Nsight Compute's ``audit`` of the same call: unknown, with
    every difference named, when their counts of ``task``'s target opcodes differ; else as it
    was, with what the audit found in ``audit``."""
    patterns = target_patterns(task)

    def targets(counts: dict[str, int]) -> dict[str, int]:
        return {opcode: count for opcode, count in counts.items() if matches_any(opcode, patterns)}

    if not audit.ok:
        return replace(counted, audit=f"inconclusive: Nsight Compute failed ({audit.reason})")
    differences = [
        f"{opcode} {kind} {mine:,} against Nsight Compute's {theirs:,}"
        for kind, ours, reference in (
            ("threads", targets(counted.thread_counts), targets(audit.thread_counts)),
            ("warps", targets(counted.warp_counts), targets(audit.warp_counts)),
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
