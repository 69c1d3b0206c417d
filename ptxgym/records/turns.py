"""The trajectory record: one JSON line per turn, append-only.

Written by the ``TrajectoryRecorder`` wrapper (and so by ``ptxgym run``), read by the resume logic
of ``ptxgym run`` and by ``ptxgym report``. A line holds everything needed to recompute the metrics
and to build training data without re-running anything.
"""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import gymnasium as gym

from ptxgym.outcome import Status
from ptxgym.records import transitions
from ptxgym.records.metrics import Turn

# Version 2 added the task's category and kind, the code-quality metrics and the transition
# from the turn before; version 3 the action language. An older record reads with the defaults
# of the fields added after it (every record before version 3 was of a CUDA run).
SCHEMA_VERSION = 3
_READABLE_SCHEMAS = (1, 2, SCHEMA_VERSION)


@dataclass(frozen=True)
class TurnRecord:
    """One turn of one trajectory."""

    run: str
    task_id: str
    prompt_variant: int
    knowledge: str
    trajectory: int
    turn: int  # 1-based
    agent: str
    status: str
    correct: bool
    qualified: bool | None  # None: not profiled, or the profile failed
    speedup: float | None
    latency_ms: float | None
    baseline_latency_ms: float | None
    reward: float
    reward_components: dict[str, float]
    source: str | None
    feedback: str
    message: str
    step_seconds: float
    evaluator: str
    versions: dict[str, str] = field(default_factory=dict)
    timestamp: str = ""
    outcome: dict[str, Any] = field(default_factory=dict)
    # How the agent's model produced the action, when a model did (ptxgym.agents): the reply in
    # full, the model, prompt and completion tokens, seconds, finish reason, attempts.
    generation: dict[str, Any] = field(default_factory=dict)
    # The task's category (docs/tasks.md) and whether it requires target instructions (False:
    # a performance task, which has no Fast_p^Inst).
    category: str = ""
    instructions_required: bool = True
    # The source's code-quality metrics (ptxgym.records.quality.CodeQuality), empty without one.
    quality: dict[str, Any] = field(default_factory=dict)
    # The transition from the trajectory's previous turn in the recording process
    # (ptxgym.records.transitions.Transition: events and diff); empty for a first turn.
    transition: dict[str, Any] = field(default_factory=dict)
    # The action language the agent wrote the kernel in (ptxgym.languages: "cuda", "triton").
    language: str = "cuda"
    schema: int = SCHEMA_VERSION

    @property
    def key(self) -> tuple[str, int, str, int, int]:
        """Identifies the turn within a run: (task, variant, knowledge, trajectory, turn)."""
        return (self.task_id, self.prompt_variant, self.knowledge, self.trajectory, self.turn)

    @property
    def reached_gpu(self) -> bool:
        """Whether the turn was run on a GPU: built and judged past the build (the built turns
        of a compile-only evaluation stop at COMPILED)."""
        status = Status(self.status)
        return status.compiled and status is not Status.COMPILED

    @property
    def mfu(self) -> float | None:
        """The MFU of the turn's timing (``outcome["speed_of_light"]["mfu"]``); None when it was
        not measured (not timed, or on a GPU whose peaks ``envs/devices.yaml`` does not list)."""
        bound = self.outcome.get("speed_of_light") or {}
        value = bound.get("mfu") if isinstance(bound, dict) else None
        if isinstance(value, bool) or not isinstance(value, int | float):
            return None
        return float(value)

    def as_turn(self) -> Turn:
        return Turn(self.correct, self.qualified, self.speedup, self.instructions_required)

    def as_transition_turn(self) -> transitions.Turn:
        return transitions.Turn(self.turn, self.status, self.correct, self.speedup, self.source)

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, line: str) -> TurnRecord:
        return cls.from_data(json.loads(line))

    @classmethod
    def from_data(cls, data: dict[str, Any]) -> TurnRecord:
        if data.get("schema") not in _READABLE_SCHEMAS:
            raise ValueError(f"trajectory record schema {data.get('schema')!r} is not supported")
        return cls(**{**data, "schema": SCHEMA_VERSION})


def best_mfu(records: Iterable[TurnRecord], *, inst: bool) -> float | None:
    """The largest MFU among the records' turns that count (correct, and with ``inst`` also
    executed the target instructions, as for best speedup); None when none has one."""
    return max(
        (
            mfu
            for record in records
            if record.as_turn().counts(inst=inst) and (mfu := record.mfu) is not None
        ),
        default=None,
    )


def read_records(path: Path) -> Iterator[TurnRecord]:
    """Every complete record in a JSONL file; a torn last line (a crash mid-write) is skipped."""
    for data in read_lines(path):
        yield TurnRecord.from_data(data)


def read_lines(path: Path) -> Iterator[Any]:
    """The JSON value of each non-empty line of a JSONL file. A torn last line (a crash
    mid-write) is skipped; an unreadable line before the end is an error."""
    with path.open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            if not line.strip():
                continue
            try:
                value = json.loads(line)
            except json.JSONDecodeError:
                if handle.read().strip():  # only the final line may be torn
                    raise ValueError(f"{path}:{number}: not a JSON line") from None
                return
            yield value


def append_line(path: Path, line: str, complete: Callable[[str], object] = json.loads) -> None:
    """Append one line to a JSONL file durably; safe with other writers of the same file
    (flock). A last line a crash left unfinished is finished first: given its newline when
    ``complete`` accepts it, cut otherwise (``complete`` raises for an incomplete line)."""
    data = line.encode("utf-8")
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        _end_last_line(fd, path, complete)
        written = 0
        while written < len(data):
            written += os.write(fd, data[written:])
        os.fsync(fd)
    finally:
        os.close(fd)  # also releases the lock


def _end_last_line(fd: int, path: Path, complete: Callable[[str], object]) -> None:
    """Finish a last line that a crash left without its newline, before appending after it.

    ``read_lines`` skips a torn line only at the end of a file, so a line appended after one
    would make the file unreadable. A complete line that lacks only its newline gets one;
    anything else is cut.
    """
    size = os.fstat(fd).st_size
    if size == 0 or os.pread(fd, 1, size - 1) == b"\n":
        return
    start = size
    while start > 0:
        chunk_start = max(0, start - (1 << 16))
        newline = os.pread(fd, start - chunk_start, chunk_start).rfind(b"\n")
        if newline >= 0:
            start = chunk_start + newline + 1
            break
        start = chunk_start
    try:
        complete(os.pread(fd, size - start, start).decode("utf-8"))
    except (ValueError, TypeError, AttributeError):  # not UTF-8, not JSON, not a whole line
        os.ftruncate(fd, start)
        # Arguments, not an f-string: the logger %-formats its message, and a path may hold "%".
        gym.logger.warn(
            "%s: dropped a torn last line (%d bytes) left by a crash", path, size - start
        )
        return
    os.write(fd, b"\n")
