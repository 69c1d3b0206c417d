"""Datasets made of recorded turns (:class:`~ptxgym.records.turns.TurnRecord`), without running
anything again.

- :func:`repair_pairs` and :func:`write_repair_dataset`: failure→repair training pairs, each
  failing turn with a source and the first later ``PASSED`` turn of its trajectory.
- :func:`export_flashinfer`: the turns that produced a source as a FlashInfer-Trace dataset
  (definitions, workloads, solutions and traces; ``ptxgym.interop.flashinfer_trace``).

Both take any iterable of records (``read_records(path)``, or several runs chained) and group
them by trajectory, the last record of a turn recorded twice winning. See docs/metrics.md.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from ptxgym.build.result import CompileResult
from ptxgym.interop import flashinfer_trace as trace
from ptxgym.outcome import Outcome, Status
from ptxgym.records.turns import TurnRecord
from ptxgym.tasks import Task, get_task

__all__ = ["export_flashinfer", "repair_pairs", "solution_name", "write_repair_dataset"]

_PASSED = Status.PASSED.value

# run, task, variant, knowledge, language, trajectory
TrajectoryKey = tuple[str, str, int, str, str, int]


def _trajectories(records: Iterable[TurnRecord]) -> dict[TrajectoryKey, list[TurnRecord]]:
    """Records grouped by trajectory, ordered by turn; for a turn recorded twice, the last."""
    groups: dict[TrajectoryKey, dict[int, TurnRecord]] = {}
    for record in records:
        key = (
            record.run,
            record.task_id,
            record.prompt_variant,
            record.knowledge,
            record.language,
            record.trajectory,
        )
        groups.setdefault(key, {})[record.turn] = record
    return {key: [turns[t] for t in sorted(turns)] for key, turns in groups.items()}


def repair_pairs(records: Iterable[TurnRecord]) -> list[dict[str, Any]]:
    """Failure→repair pairs: each failing turn with a source, and the first later PASSED turn.

    Pairs are formed within one trajectory (same run, task, variant, knowledge, language,
    index). A failure with no later correct turn gives no pair; several failures may share one
    repair.
    """
    pairs: list[dict[str, Any]] = []
    for (run, task_id, variant, knowledge, language, index), turns in _trajectories(
        records
    ).items():
        for position, failed in enumerate(turns):
            if failed.status == _PASSED or failed.source is None:
                continue
            repaired = next((t for t in turns[position + 1 :] if t.status == _PASSED), None)
            if repaired is None:
                continue
            pairs.append(
                {
                    "run": run,
                    "task_id": task_id,
                    "prompt_variant": variant,
                    "knowledge": knowledge,
                    "language": language,
                    "trajectory": index,
                    "failed_turn": failed.turn,
                    "failed_status": failed.status,
                    "failed_source": failed.source,
                    "feedback": failed.feedback,
                    "repaired_turn": repaired.turn,
                    "repaired_source": repaired.source,
                    "repaired_speedup": repaired.speedup,
                    "repaired_qualified": repaired.qualified,
                }
            )
    return pairs


def write_repair_dataset(records: Iterable[TurnRecord], path: str | os.PathLike[str]) -> int:
    """Write :func:`repair_pairs` as JSONL (the file is replaced); returns how many."""
    pairs = repair_pairs(records)
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    with target.open("w", encoding="utf-8") as handle:
        handle.writelines(json.dumps(pair) + "\n" for pair in pairs)
    return len(pairs)


_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def solution_name(record: TurnRecord, definition: str) -> str:
    """``<run>_<definition>_v<variant>_<knowledge>_t<trajectory>_<turn>``, file-name safe.

    FlashInfer-Bench requires solution names to be unique across a whole dataset, hence the
    definition; knowledge levels of one run would clash without it.
    """
    name = (
        f"{record.run}_{definition}_v{record.prompt_variant}_{record.knowledge}"
        f"_t{record.trajectory}_{record.turn}"
    )
    return _UNSAFE.sub("-", name)


def _environment(record: TurnRecord) -> trace.Environment:
    libs = {k: v for k, v in record.versions.items() if k != "gpu"}
    gpu = record.versions.get("gpu", "").strip()
    # FlashInfer names hardware NVIDIA_H100; nvidia-smi says "NVIDIA H100 80GB HBM3".
    hardware = _UNSAFE.sub("_", gpu) if gpu else "unknown"
    return trace.Environment(hardware=hardware, libs=libs)


def _outcome(record: TurnRecord) -> Outcome:
    """The fields of the record's Outcome that ``trace_from_outcome`` reads."""
    build = record.outcome.get("compile")
    compile_result = None
    if isinstance(build, Mapping):
        compile_result = CompileResult(
            ok=bool(build.get("ok", False)),
            log=str(build.get("log", "")),
            source_hash=str(build.get("source_hash", "")),
            arch=str(build.get("arch", "")),
            seconds=float(build.get("seconds", 0.0)),
        )
    return Outcome(
        task_id=record.task_id,
        status=Status(record.status),
        message=record.message,
        evaluator=record.evaluator,
        compile=compile_result,
        latency_ms=record.latency_ms,
        baseline_latency_ms=record.baseline_latency_ms,
        speedup=record.speedup,
        qualified=record.qualified,
        instructions_required=record.instructions_required,
    )


def _correctness(record: TurnRecord, workload: str) -> trace.Correctness | None:
    """Error maxima over every check of ``workload``; NaN when they do not bound the error.

    ptxgym's maxima skip non-finite elements, and a shape or dtype failure measures nothing.
    """
    outputs = [
        output
        for check in record.outcome.get("checks", [])
        if check.get("workload") == workload
        for output in check.get("outputs", [])
    ]
    if not outputs:
        return None
    if any(o.get("non_finite") or o.get("problem") in ("shape", "dtype") for o in outputs):
        return trace.Correctness(max_relative_error=math.nan, max_absolute_error=math.nan)
    return trace.Correctness(
        max_relative_error=max(float(o["max_rel_error"]) for o in outputs),
        max_absolute_error=max(float(o["max_abs_error"]) for o in outputs),
    )


def _traces(
    task: Task, workloads: Sequence[trace.Workload], record: TurnRecord, name: str
) -> list[trace.Trace]:
    """One trace per task workload for a recorded turn.

    ptxgym evaluates the whole workload pool and gives one status, so every workload gets that
    status. A PASSED turn's latencies come from the outcome's per-workload ``timings``; with no
    timing for a workload, the totals stand for it only when the pool has one workload.
    """
    outcome = _outcome(record)
    timings = {t["workload"]: t for t in record.outcome.get("timings", [])}
    environment = _environment(record)
    traces: list[trace.Trace] = []
    for spec, workload in zip(task.workloads, workloads, strict=True):
        figures = outcome
        timing = timings.get(spec.name)
        if outcome.status is Status.PASSED and timing is not None:
            figures = replace(
                outcome,
                latency_ms=timing["latency_ms"],
                baseline_latency_ms=timing["baseline_latency_ms"],
                speedup=timing["speedup"],
            )
        elif outcome.status is Status.PASSED and len(task.workloads) > 1:
            figures = replace(outcome, latency_ms=None, baseline_latency_ms=None, speedup=None)
        traces.append(
            trace.trace_from_outcome(
                task,
                workload,
                name,
                figures,
                environment=environment,
                correctness=_correctness(record, spec.name),
                timestamp=record.timestamp or None,
            )
        )
    return traces


def export_flashinfer(records: Iterable[TurnRecord], out_dir: str | os.PathLike[str]) -> list[Path]:
    """Write the turns that produced a source as a FlashInfer-Trace dataset under ``out_dir``.

    Definitions, workloads and blobs come from
    :func:`ptxgym.interop.flashinfer_trace.write_trace_set` for every task with such a turn; each
    turn adds ``solutions/<definition>/<name>.json`` (see :func:`solution_name`; the author is the
    record's agent) and one trace per workload to ``traces/<op_type>/<definition>.jsonl``. Files are
    rewritten whole, so exporting the same records again gives the same dataset. Tasks that
    FlashInfer-Trace cannot describe (``flashinfer_trace.export_problem``) are left out. Returns
    the files written.
    """
    root = Path(out_dir)
    by_task: dict[str, list[TurnRecord]] = {}
    for turns in _trajectories(records).values():
        for record in turns:
            if record.source is not None:
                by_task.setdefault(record.task_id, []).append(record)
    tasks = [get_task(task_id) for task_id in by_task]
    tasks = [task for task in tasks if trace.export_problem(task) is None]
    written = trace.write_trace_set(root, tasks)
    owners: dict[str, tuple[str, tuple[str, int, str, int, int]]] = {}
    for task in tasks:
        definition = trace.definition_name(task)
        kind = trace.op_type(task)
        workloads = [
            record.workload
            for record in trace.read_jsonl(root / "workloads" / kind / f"{definition}.jsonl")
        ]
        lines: list[str] = []
        for record in by_task[task.id]:
            assert record.source is not None
            name = solution_name(record, definition)
            identity = (record.run, record.key)
            if owners.setdefault(name, identity) != identity:
                raise trace.TraceExportError(f"two turns map to the solution name {name!r}")
            solution = trace.solution_from_source(
                task, record.source, name=name, author=record.agent or "unknown"
            )
            path = root / "solutions" / definition / f"{name}.json"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(
                solution.model_dump_json(indent=2, exclude_unset=True) + "\n", encoding="utf-8"
            )
            written.append(path)
            lines += [
                t.model_dump_json(exclude_unset=True) + "\n"
                for t in _traces(task, workloads, record, name)
            ]
        traces_path = root / "traces" / kind / f"{definition}.jsonl"
        traces_path.parent.mkdir(parents=True, exist_ok=True)
        traces_path.write_text("".join(lines), encoding="utf-8")
        written.append(traces_path)
    return written
