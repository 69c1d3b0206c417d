"""Crafted trajectory records for the tests of reports and records: ``turn`` makes one, and
``RECORDS`` is a small set of runs whose metrics the report tests compute by hand."""

from __future__ import annotations

from pathlib import Path

from ptxgym.records.turns import TurnRecord

H100, B200 = "PTX-H100-GEMM", "PTX-B200-GEMM"


def turn(
    task_id: str,
    variant: int,
    trajectory: int,
    number: int,
    speedup: float | None = None,
    qualified: bool | None = None,
    run: str = "r",
) -> TurnRecord:
    """A turn: correct when it has a speedup."""
    correct = speedup is not None
    return TurnRecord(
        run=run,
        task_id=task_id,
        prompt_variant=variant,
        knowledge="full",
        trajectory=trajectory,
        turn=number,
        agent="test",
        status="PASSED" if correct else "INCORRECT_NUMERICAL",
        correct=correct,
        qualified=qualified,
        speedup=speedup,
        latency_ms=None,
        baseline_latency_ms=None,
        reward=0.0,
        reward_components={},
        source=None,
        feedback="",
        message="",
        step_seconds=0.0,
        evaluator="gpu",
    )


# H100, variant 0: wrong, then correct and qualified at 2.0x.
# H100, variant 1: correct unqualified at 0.5x, then correct with an unknown profile at 1.5x.
# B200, variant 0: two trajectories, every turn wrong.
RECORDS = [
    turn(H100, 0, 0, 1),
    turn(H100, 0, 0, 2, speedup=2.0, qualified=True),
    turn(H100, 1, 0, 1, speedup=0.5, qualified=False),
    turn(H100, 1, 0, 2, speedup=1.5, qualified=None),
    turn(B200, 0, 0, 1),
    turn(B200, 0, 0, 2),
    turn(B200, 0, 1, 1),
    turn(B200, 0, 1, 2),
]


def write(path: Path, records: list[TurnRecord]) -> Path:
    path.write_text("".join(record.to_json() + "\n" for record in records), encoding="utf-8")
    return path
