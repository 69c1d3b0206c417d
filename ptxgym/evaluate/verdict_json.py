"""Verdicts as JSON, written and read field by field, so that they cross processes as data.

The judge's verdicts reach its clients over a pipe or a socket, in the messages of
``ptxgym.evaluate.judge_messages``. Pickle would let whoever writes on that connection run code in
the reader, so a ``Verdict`` and every record in it (``CheckReport``, ``OutputCheck``,
``Mismatch``, ``WorkloadTiming``, ``SanitizerReport``, ``InstructionProfile``, ``KernelFacts``)
travel as plain JSON values instead.

``verdict_to_json`` writes every field of each record, explicitly; ``verdict_from_json`` reads
them back, checking that each object has exactly its record's fields and that each value has the
field's type, and raises ``VerdictFormatError`` naming the first field that is wrong. The round
trip is exact: the status by its value, tuples from lists, None kept, integers and floats kept
apart. Non-finite floats (a NaN where an output was never written) travel as Python's ``json``
writes them (``NaN``, ``Infinity``); both ends of the connection are ptxgym.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Any, TypeVar

from ptxgym.evaluate.verdict import Verdict
from ptxgym.outcome import (
    CheckReport,
    InstructionProfile,
    KernelFacts,
    Mismatch,
    OutputCheck,
    SanitizerReport,
    Status,
    WorkloadTiming,
)

Record = TypeVar("Record")
Value = TypeVar("Value")


class VerdictFormatError(ValueError):
    """A JSON value that is not a verdict: the message names the field and what is wrong."""


# --------------------------------------------------------------------------------------------
# Writing


def verdict_to_json(verdict: Verdict) -> dict[str, Any]:
    """``verdict`` as JSON values (dicts, lists, strings, numbers, booleans, None)."""
    return {
        "status": verdict.status.value,
        "message": str(verdict.message),
        "checks": [_check_report_to_json(report) for report in verdict.checks],
        "timings": [_timing_to_json(timing) for timing in verdict.timings],
        "worker_log": str(verdict.worker_log),
        "sanitizers": [_sanitizer_to_json(report) for report in verdict.sanitizers],
        "profile": None if verdict.profile is None else _profile_to_json(verdict.profile),
        "seconds": float(verdict.seconds),
        "stage_seconds": {str(k): float(v) for k, v in verdict.stage_seconds.items()},
        "isolation": {str(k): bool(v) for k, v in verdict.isolation.items()},
        "tools_workload": str(verdict.tools_workload),
    }


def _check_report_to_json(report: CheckReport) -> dict[str, Any]:
    return {
        "stage": str(report.stage),
        "workload": str(report.workload),
        "outputs": [_output_check_to_json(output) for output in report.outputs],
    }


def _output_check_to_json(output: OutputCheck) -> dict[str, Any]:
    return {
        "name": str(output.name),
        "ok": bool(output.ok),
        "problem": str(output.problem),
        "detail": str(output.detail),
        "max_abs_error": float(output.max_abs_error),
        "max_rel_error": float(output.max_rel_error),
        "mismatched": int(output.mismatched),
        "non_finite": int(output.non_finite),
        "total": int(output.total),
        "worst_ratio": float(output.worst_ratio),
        "worst": [
            {
                "index": [int(i) for i in mismatch.index],
                "got": float(mismatch.got),
                "expected": float(mismatch.expected),
            }
            for mismatch in output.worst
        ],
    }


def _timing_to_json(timing: WorkloadTiming) -> dict[str, Any]:
    return {
        "workload": str(timing.workload),
        "latency_ms": float(timing.latency_ms),
        "baseline_latency_ms": float(timing.baseline_latency_ms),
        "speedup": float(timing.speedup),
        "trial_medians_ms": [float(m) for m in timing.trial_medians_ms],
        "method": str(timing.method),
        "warmup_calls": int(timing.warmup_calls),
        "timed_calls": int(timing.timed_calls),
    }


def _sanitizer_to_json(report: SanitizerReport) -> dict[str, Any]:
    return {
        "tool": str(report.tool),
        "ok": bool(report.ok),
        "errors": int(report.errors),
        "findings": [str(finding) for finding in report.findings],
        "reason": str(report.reason),
        "seconds": float(report.seconds),
        "call_seconds": {str(k): float(v) for k, v in report.call_seconds.items()},
    }


def _profile_to_json(profile: InstructionProfile) -> dict[str, Any]:
    return {
        "ok": bool(profile.ok),
        "reason": str(profile.reason),
        "method": str(profile.method),
        "note": str(profile.note),
        "audit": str(profile.audit),
        "thread_counts": {str(k): int(v) for k, v in profile.thread_counts.items()},
        "warp_counts": {str(k): int(v) for k, v in profile.warp_counts.items()},
        "kernels": [_kernel_facts_to_json(kernel) for kernel in profile.kernels],
        "families": {str(k): bool(v) for k, v in profile.families.items()},
        "flops_executed": None if profile.flops_executed is None else int(profile.flops_executed),
        "coverage": None if profile.coverage is None else float(profile.coverage),
        "min_coverage": float(profile.min_coverage),
        "seconds": float(profile.seconds),
        "read_seconds": float(profile.read_seconds),
        "call_seconds": {str(k): float(v) for k, v in profile.call_seconds.items()},
    }


def _kernel_facts_to_json(kernel: KernelFacts) -> dict[str, Any]:
    def optional(value: float | None) -> float | None:
        return None if value is None else float(value)

    return {
        "name": str(kernel.name),
        "duration_us": optional(kernel.duration_us),
        "sm_throughput_pct": optional(kernel.sm_throughput_pct),
        "memory_throughput_pct": optional(kernel.memory_throughput_pct),
        "dram_throughput_pct": optional(kernel.dram_throughput_pct),
        "achieved_occupancy_pct": optional(kernel.achieved_occupancy_pct),
        "theoretical_occupancy_pct": optional(kernel.theoretical_occupancy_pct),
        "registers_per_thread": optional(kernel.registers_per_thread),
        "grid_size": optional(kernel.grid_size),
        "block_size": optional(kernel.block_size),
    }


# --------------------------------------------------------------------------------------------
# Reading


def verdict_from_json(data: object) -> Verdict:
    """The verdict ``data`` holds (as ``verdict_to_json`` wrote it); a ``VerdictFormatError``
    for anything else."""
    fields = _Fields(data, "verdict", _VERDICT_FIELDS)
    status = fields.text("status")
    try:
        known_status = Status(status)
    except ValueError:
        raise VerdictFormatError(f"verdict.status: {status!r} is not a status") from None
    return Verdict(
        status=known_status,
        message=fields.text("message"),
        checks=fields.sequence("checks", _check_report_from_json),
        timings=fields.sequence("timings", _timing_from_json),
        worker_log=fields.text("worker_log"),
        sanitizers=fields.sequence("sanitizers", _sanitizer_from_json),
        profile=fields.optional_record("profile", _profile_from_json),
        seconds=fields.number("seconds"),
        stage_seconds=fields.mapping("stage_seconds", _number),
        isolation=fields.mapping("isolation", _flag),
        tools_workload=fields.text("tools_workload"),
    )


def _check_report_from_json(data: object, where: str) -> CheckReport:
    fields = _Fields(data, where, ("stage", "workload", "outputs"))
    return CheckReport(
        stage=fields.text("stage"),
        workload=fields.text("workload"),
        outputs=fields.sequence("outputs", _output_check_from_json),
    )


def _output_check_from_json(data: object, where: str) -> OutputCheck:
    fields = _Fields(data, where, _OUTPUT_CHECK_FIELDS)
    return OutputCheck(
        name=fields.text("name"),
        ok=fields.flag("ok"),
        problem=fields.text("problem"),
        detail=fields.text("detail"),
        max_abs_error=fields.number("max_abs_error"),
        max_rel_error=fields.number("max_rel_error"),
        mismatched=fields.count("mismatched"),
        non_finite=fields.count("non_finite"),
        total=fields.count("total"),
        worst=fields.sequence("worst", _mismatch_from_json),
        worst_ratio=fields.number("worst_ratio"),
    )


def _mismatch_from_json(data: object, where: str) -> Mismatch:
    fields = _Fields(data, where, ("index", "got", "expected"))
    return Mismatch(
        index=fields.sequence("index", _count),
        got=fields.number("got"),
        expected=fields.number("expected"),
    )


def _timing_from_json(data: object, where: str) -> WorkloadTiming:
    fields = _Fields(data, where, _TIMING_FIELDS)
    return WorkloadTiming(
        workload=fields.text("workload"),
        latency_ms=fields.number("latency_ms"),
        baseline_latency_ms=fields.number("baseline_latency_ms"),
        speedup=fields.number("speedup"),
        trial_medians_ms=fields.sequence("trial_medians_ms", _number),
        method=fields.text("method"),
        warmup_calls=fields.count("warmup_calls"),
        timed_calls=fields.count("timed_calls"),
    )


def _sanitizer_from_json(data: object, where: str) -> SanitizerReport:
    fields = _Fields(data, where, _SANITIZER_FIELDS)
    return SanitizerReport(
        tool=fields.text("tool"),
        ok=fields.flag("ok"),
        errors=fields.count("errors"),
        findings=fields.sequence("findings", _text),
        reason=fields.text("reason"),
        seconds=fields.number("seconds"),
        call_seconds=fields.mapping("call_seconds", _number),
    )


def _profile_from_json(data: object, where: str) -> InstructionProfile:
    fields = _Fields(data, where, _PROFILE_FIELDS)
    return InstructionProfile(
        ok=fields.flag("ok"),
        reason=fields.text("reason"),
        method=fields.text("method"),
        note=fields.text("note"),
        audit=fields.text("audit"),
        thread_counts=fields.mapping("thread_counts", _count),
        warp_counts=fields.mapping("warp_counts", _count),
        kernels=fields.sequence("kernels", _kernel_facts_from_json),
        families=fields.mapping("families", _flag),
        flops_executed=fields.optional_count("flops_executed"),
        coverage=fields.optional_number("coverage"),
        min_coverage=fields.number("min_coverage"),
        seconds=fields.number("seconds"),
        read_seconds=fields.number("read_seconds"),
        call_seconds=fields.mapping("call_seconds", _number),
    )


def _kernel_facts_from_json(data: object, where: str) -> KernelFacts:
    fields = _Fields(data, where, _KERNEL_FACTS_FIELDS)
    return KernelFacts(
        name=fields.text("name"),
        duration_us=fields.optional_number("duration_us"),
        sm_throughput_pct=fields.optional_number("sm_throughput_pct"),
        memory_throughput_pct=fields.optional_number("memory_throughput_pct"),
        dram_throughput_pct=fields.optional_number("dram_throughput_pct"),
        achieved_occupancy_pct=fields.optional_number("achieved_occupancy_pct"),
        theoretical_occupancy_pct=fields.optional_number("theoretical_occupancy_pct"),
        registers_per_thread=fields.optional_number("registers_per_thread"),
        grid_size=fields.optional_number("grid_size"),
        block_size=fields.optional_number("block_size"),
    )


_VERDICT_FIELDS = (
    "status",
    "message",
    "checks",
    "timings",
    "worker_log",
    "sanitizers",
    "profile",
    "seconds",
    "stage_seconds",
    "isolation",
    "tools_workload",
)
_OUTPUT_CHECK_FIELDS = (
    "name",
    "ok",
    "problem",
    "detail",
    "max_abs_error",
    "max_rel_error",
    "mismatched",
    "non_finite",
    "total",
    "worst",
    "worst_ratio",
)
_TIMING_FIELDS = (
    "workload",
    "latency_ms",
    "baseline_latency_ms",
    "speedup",
    "trial_medians_ms",
    "method",
    "warmup_calls",
    "timed_calls",
)
_SANITIZER_FIELDS = ("tool", "ok", "errors", "findings", "reason", "seconds", "call_seconds")
_PROFILE_FIELDS = (
    "ok",
    "reason",
    "method",
    "note",
    "audit",
    "thread_counts",
    "warp_counts",
    "kernels",
    "families",
    "flops_executed",
    "coverage",
    "min_coverage",
    "seconds",
    "read_seconds",
    "call_seconds",
)
_KERNEL_FACTS_FIELDS = (
    "name",
    "duration_us",
    "sm_throughput_pct",
    "memory_throughput_pct",
    "dram_throughput_pct",
    "achieved_occupancy_pct",
    "theoretical_occupancy_pct",
    "registers_per_thread",
    "grid_size",
    "block_size",
)


def _describe(value: object) -> str:
    """What a wrong value was, briefly: its JSON kind and the start of its text."""
    shown = repr(value)
    return f"{type(value).__name__} {shown[:60]}{'...' if len(shown) > 60 else ''}"


def _text(value: object, where: str) -> str:
    if not isinstance(value, str):
        raise VerdictFormatError(f"{where}: expected a string, got {_describe(value)}")
    return value


def _flag(value: object, where: str) -> bool:
    if not isinstance(value, bool):
        raise VerdictFormatError(f"{where}: expected true or false, got {_describe(value)}")
    return value


def _count(value: object, where: str) -> int:
    # A JSON true or false reads as a Python bool, which is an int too: refused here.
    if not isinstance(value, int) or isinstance(value, bool):
        raise VerdictFormatError(f"{where}: expected an integer, got {_describe(value)}")
    return value


def _number(value: object, where: str) -> float:
    # JSON writes a float with an integral value without a fraction only if it was an int; an
    # int is accepted where a float is expected, as Python does, and read as that float.
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise VerdictFormatError(f"{where}: expected a number, got {_describe(value)}")
    return float(value)


class _Fields:
    """The fields of one JSON object that must hold exactly ``names``: each read checks its
    field's type and names the field (``where``) when it is wrong."""

    def __init__(self, data: object, where: str, names: Collection[str]) -> None:
        if not isinstance(data, dict):
            raise VerdictFormatError(f"{where}: expected an object, got {_describe(data)}")
        missing = [name for name in names if name not in data]
        unknown = sorted(str(key) for key in data if key not in names)
        if missing or unknown:
            raise VerdictFormatError(f"{where}: fields missing {missing}, unknown {unknown}")
        self.data: dict[str, object] = data
        self.where = where

    def _at(self, name: str) -> tuple[object, str]:
        return self.data[name], f"{self.where}.{name}"

    def text(self, name: str) -> str:
        return _text(*self._at(name))

    def flag(self, name: str) -> bool:
        return _flag(*self._at(name))

    def count(self, name: str) -> int:
        return _count(*self._at(name))

    def number(self, name: str) -> float:
        return _number(*self._at(name))

    def optional_count(self, name: str) -> int | None:
        value, where = self._at(name)
        return None if value is None else _count(value, where)

    def optional_number(self, name: str) -> float | None:
        value, where = self._at(name)
        return None if value is None else _number(value, where)

    def sequence(self, name: str, read: Callable[[object, str], Value]) -> tuple[Value, ...]:
        """A JSON list, each element read by ``read`` (a value's type, or a record)."""
        value, where = self._at(name)
        if not isinstance(value, list):
            raise VerdictFormatError(f"{where}: expected a list, got {_describe(value)}")
        return tuple(read(item, f"{where}[{index}]") for index, item in enumerate(value))

    def optional_record(self, name: str, read: Callable[[object, str], Record]) -> Record | None:
        value, where = self._at(name)
        return None if value is None else read(value, where)

    def mapping(self, name: str, read: Callable[[object, str], Value]) -> dict[str, Value]:
        """A JSON object of any keys, each value read by ``read``."""
        value, where = self._at(name)
        if not isinstance(value, dict):
            raise VerdictFormatError(f"{where}: expected an object, got {_describe(value)}")
        return {str(key): read(item, f"{where}[{key!r}]") for key, item in value.items()}
