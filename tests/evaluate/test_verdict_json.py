"""Verdicts through JSON text and back (``ptxgym.evaluate.verdict_json``): exact, field by field.

Representative verdicts (a pass with timings, sanitizer reports and a profile; wrong outputs
with their check reports; a crash) and many random ones go through ``json.dumps``/``json.loads``
as they do between a judge and its clients, and come back identical: same types (tuples, enums,
floats and integers kept apart, None), same values (NaN and the sign of zero included).
Anything that is not a verdict is refused with an error naming the field.
"""

from __future__ import annotations

import dataclasses
import json
import math
import random
from collections.abc import Callable
from typing import Any

import pytest

from ptxgym.evaluate.verdict import Verdict
from ptxgym.evaluate.verdict_json import VerdictFormatError, verdict_from_json, verdict_to_json
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

PASSED = Verdict(
    Status.PASSED,
    "passed",
    checks=(
        CheckReport(
            "random", "M4096", (OutputCheck("C", True, max_abs_error=0.0039, total=1 << 24),)
        ),
    ),
    timings=(
        WorkloadTiming("M4096", 1.25, 0.5, 0.4, (1.24, 1.25, 1.3), "cupti"),
        WorkloadTiming("M8192", 9.0, 4.0, 4.0 / 9.0, (), "host-sync"),
    ),
    sanitizers=(
        SanitizerReport("memcheck", True, seconds=3.5, call_seconds={"context": 0.5}),
        SanitizerReport("racecheck", False, reason="compute-sanitizer was not found"),
    ),
    profile=InstructionProfile(
        True,
        thread_counts={"HGMMA": 1 << 40, "UTMALDG": 12},
        warp_counts={"HGMMA": 1 << 35},
        kernels=(
            KernelFacts("gemm_kernel<128, 256>", duration_us=310.5, grid_size=132.0),
            KernelFacts("epilogue"),
        ),
        families={"compute": True, "data_movement": False},
        seconds=4.0,
        read_seconds=0.25,
        call_seconds={"gpu": 0.125},
    ),
    seconds=12.5,
    stage_seconds={"state": 0.0, "timing": 2.75},
    isolation={"writes_confined": True, "network_isolated": False},
)
INCORRECT = Verdict(
    Status.INCORRECT_NUMERICAL,
    "M4096/random: 12 of 16777216 elements differ",
    checks=(
        CheckReport(
            "random",
            "M4096",
            (
                OutputCheck(
                    "C",
                    False,
                    "numerical",
                    "12 mismatched",
                    max_abs_error=math.inf,
                    max_rel_error=math.nan,
                    mismatched=12,
                    non_finite=3,
                    total=1 << 24,
                    worst=(
                        Mismatch((0, 17), math.nan, 1.5),
                        Mismatch((4095, 0), -math.inf, -0.0),
                    ),
                ),
                OutputCheck("LSE", False, "shape", "the output was not returned"),
            ),
        ),
    ),
)
CRASHED = Verdict(
    Status.RUNTIME_ERROR,
    'the process running the kernel is gone (exit code -11) "quoted" \\ ünïcode',
    worker_log="Traceback (most recent call last):\n  ...\nSIGSEGV\n",
    sanitizers=(
        SanitizerReport(
            "memcheck",
            True,
            errors=2,
            findings=("Invalid __global__ write of size 4", "... 1 more"),
        ),
    ),
    stage_seconds={"worker_start": 1.0},
)


def _assert_identical(got: object, expected: object, where: str = "verdict") -> None:
    """``got`` equals ``expected`` with the same types all the way down, NaN equal to NaN and
    the sign of a zero kept (``==`` would take a list for a tuple and 1 for 1.0)."""
    assert type(got) is type(expected), f"{where}: {type(got)} instead of {type(expected)}"
    if dataclasses.is_dataclass(expected):
        for field in dataclasses.fields(expected):
            _assert_identical(
                getattr(got, field.name), getattr(expected, field.name), f"{where}.{field.name}"
            )
    elif isinstance(expected, tuple):
        assert isinstance(got, tuple) and len(got) == len(expected), where
        for index, (item, wanted) in enumerate(zip(got, expected, strict=True)):
            _assert_identical(item, wanted, f"{where}[{index}]")
    elif isinstance(expected, dict):
        assert isinstance(got, dict) and list(got) == list(expected), where
        for key, wanted in expected.items():
            _assert_identical(got[key], wanted, f"{where}[{key!r}]")
    elif isinstance(expected, float):
        assert isinstance(got, float)
        same = (math.isnan(got) and math.isnan(expected)) or (
            got == expected and math.copysign(1, got) == math.copysign(1, expected)
        )
        assert same, f"{where}: {got!r} instead of {expected!r}"
    else:
        assert got == expected, f"{where}: {got!r} instead of {expected!r}"


def _through_the_wire(verdict: Verdict) -> Verdict:
    return verdict_from_json(json.loads(json.dumps(verdict_to_json(verdict))))


@pytest.mark.parametrize("verdict", [PASSED, INCORRECT, CRASHED, Verdict(Status.TIMEOUT, "")])
def test_representative_verdicts_round_trip_exactly(verdict: Verdict) -> None:
    _assert_identical(_through_the_wire(verdict), verdict)


class _Random:
    """Random values of each kind a verdict holds, the awkward ones often."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)

    def number(self) -> float:
        extremes = [0.0, -0.0, math.nan, math.inf, -math.inf, 5e-324, 1.7976931348623157e308]
        return self.rng.choice([*extremes, self.rng.uniform(-1e6, 1e6), self.rng.random()])

    def maybe_number(self) -> float | None:
        return None if self.rng.random() < 0.3 else self.number()

    def count(self) -> int:
        return self.rng.choice([0, 1, self.rng.randrange(1 << 62), -self.rng.randrange(1000)])

    def flag(self) -> bool:
        return self.rng.random() < 0.5

    def text(self) -> str:
        alphabet = 'abc XYZ_09"\\\n\t\u00e9\u4e2d\U0001f600\x00'
        return "".join(self.rng.choice(alphabet) for _ in range(self.rng.randrange(12)))

    def mapping(self, value: Callable[[], Any]) -> dict[str, Any]:
        return {self.text(): value() for _ in range(self.rng.randrange(4))}

    def several(self, item: Callable[[], Any]) -> tuple[Any, ...]:
        return tuple(item() for _ in range(self.rng.randrange(4)))

    def output_check(self) -> OutputCheck:
        worst = self.several(
            lambda: Mismatch(self.several(self.count), self.number(), self.number())
        )
        return OutputCheck(
            self.text(),
            self.flag(),
            self.text(),
            self.text(),
            self.number(),
            self.number(),
            self.count(),
            self.count(),
            self.count(),
            worst,
        )

    def profile(self) -> InstructionProfile:
        return InstructionProfile(
            self.flag(),
            self.text(),
            self.text(),
            self.text(),
            self.mapping(self.count),
            self.mapping(self.count),
            self.several(
                lambda: KernelFacts(self.text(), *(self.maybe_number() for _ in range(9)))
            ),
            self.mapping(self.flag),
            None if self.flag() else self.count(),
            self.maybe_number(),
            self.number(),
            self.number(),
            self.number(),
            self.mapping(self.number),
            self.text(),
        )

    def verdict(self) -> Verdict:
        """A verdict with every field of every record set at random (not necessarily coherent:
        the conversion must not care)."""
        return Verdict(
            self.rng.choice(list(Status)),
            self.text(),
            self.several(
                lambda: CheckReport(self.text(), self.text(), self.several(self.output_check))
            ),
            self.several(
                lambda: WorkloadTiming(
                    self.text(),
                    self.number(),
                    self.number(),
                    self.number(),
                    self.several(self.number),
                    self.text(),
                    self.count(),
                    self.count(),
                )
            ),
            self.text(),
            self.several(
                lambda: SanitizerReport(
                    self.text(),
                    self.flag(),
                    self.count(),
                    self.several(self.text),
                    self.text(),
                    self.number(),
                    self.mapping(self.number),
                )
            ),
            None if self.rng.random() < 0.3 else self.profile(),
            self.number(),
            self.mapping(self.number),
            self.mapping(self.flag),
        )


@pytest.mark.parametrize("seed", range(200))
def test_random_verdicts_round_trip_exactly(seed: int) -> None:
    verdict = _Random(seed).verdict()
    _assert_identical(_through_the_wire(verdict), verdict)


def test_every_field_of_every_record_is_written() -> None:
    """A field added to a record must be added to the conversion too (or it would be dropped
    on the way, silently: its default would come back)."""
    written = verdict_to_json(PASSED)
    records: list[tuple[type, dict[str, Any]]] = [
        (Verdict, written),
        (CheckReport, written["checks"][0]),
        (OutputCheck, written["checks"][0]["outputs"][0]),
        (Mismatch, verdict_to_json(INCORRECT)["checks"][0]["outputs"][0]["worst"][0]),
        (WorkloadTiming, written["timings"][0]),
        (SanitizerReport, written["sanitizers"][0]),
        (InstructionProfile, written["profile"]),
        (KernelFacts, written["profile"]["kernels"][0]),
    ]
    for record, data in records:
        assert set(data) == {field.name for field in dataclasses.fields(record)}, record


def _with(data: dict[str, Any], path: list[Any], value: object) -> dict[str, Any]:
    """A copy of ``data`` with the item at ``path`` set to ``value`` (or removed: ``...``)."""
    copy: dict[str, Any] = json.loads(json.dumps(data))
    holder = copy
    for key in path[:-1]:
        holder = holder[key]
    if value is ...:
        del holder[path[-1]]
    else:
        holder[path[-1]] = value
    return copy


GOOD = verdict_to_json(INCORRECT)


@pytest.mark.parametrize(
    ("data", "named"),
    [
        ([GOOD], "verdict: expected an object"),
        (_with(GOOD, ["status"], "HACKED"), "verdict.status: 'HACKED' is not a status"),
        (_with(GOOD, ["status"], 1), "verdict.status: expected a string"),
        (_with(GOOD, ["message"], ...), "verdict: fields missing ['message']"),
        (_with(GOOD, ["__reduce__"], "os.system"), "unknown ['__reduce__']"),
        (_with(GOOD, ["seconds"], "1.0"), "verdict.seconds: expected a number"),
        (_with(GOOD, ["seconds"], True), "verdict.seconds: expected a number"),
        (_with(GOOD, ["checks"], {"0": {}}), "verdict.checks: expected a list"),
        (
            _with(GOOD, ["checks", 0, "outputs", 0, "mismatched"], 1.5),
            "verdict.checks[0].outputs[0].mismatched: expected an integer",
        ),
        (
            _with(GOOD, ["checks", 0, "outputs", 0, "total"], False),
            "verdict.checks[0].outputs[0].total: expected an integer",
        ),
        (
            _with(GOOD, ["checks", 0, "outputs", 0, "worst", 1, "index"], [1, "2"]),
            "verdict.checks[0].outputs[0].worst[1].index[1]: expected an integer",
        ),
        (_with(GOOD, ["checks", 0, "outputs", 0, "ok"], 0), "outputs[0].ok: expected true"),
        (_with(GOOD, ["isolation"], {"writes_confined": "yes"}), "verdict.isolation['writes"),
        (_with(GOOD, ["profile"], []), "verdict.profile: expected an object"),
        (
            _with(verdict_to_json(PASSED), ["profile", "kernels", 0, "grid_size"], "132"),
            "verdict.profile.kernels[0].grid_size: expected a number",
        ),
        (
            _with(verdict_to_json(PASSED), ["timings", 1, "trial_medians_ms"], [None]),
            "verdict.timings[1].trial_medians_ms[0]: expected a number",
        ),
    ],
)
def test_what_is_not_a_verdict_is_refused_naming_the_field(data: object, named: str) -> None:
    with pytest.raises(VerdictFormatError) as refusal:
        verdict_from_json(data)
    assert named in str(refusal.value)
