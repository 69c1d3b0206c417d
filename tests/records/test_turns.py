"""The trajectory record's action language and MFU: older schemas read as CUDA, the recorder
writes the env's language, and a turn's MFU comes from its speed-of-light measurement."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from turn_records import H100, turn

from ptxgym import paths
from ptxgym.env import PTXKernelEnv
from ptxgym.records.turns import SCHEMA_VERSION, TurnRecord, best_mfu, read_records
from ptxgym.wrappers import TrajectoryRecorder

# The fields each schema version added, which an older record does not have.
ADDED_IN_2 = ("category", "instructions_required", "quality", "transition")
ADDED_IN_3 = ("language",)


def _older(record: TurnRecord, schema: int, added: tuple[str, ...]) -> str:
    """``record`` as a line of an older schema: without the fields added after it."""
    data = json.loads(record.to_json())
    for key in added:
        del data[key]
    return json.dumps(data | {"schema": schema})


def test_the_schema_is_3_and_a_new_record_names_its_language() -> None:
    record = replace(turn(H100, 0, 0, 1), language="triton")
    assert SCHEMA_VERSION == record.schema == 3
    assert TurnRecord.from_json(record.to_json()) == record


@pytest.mark.parametrize(
    ("schema", "added"), [(2, ADDED_IN_3), (1, ADDED_IN_2 + ADDED_IN_3)], ids=["v2", "v1"]
)
def test_an_older_record_reads_as_cuda(schema: int, added: tuple[str, ...]) -> None:
    line = _older(turn(H100, 0, 0, 1, speedup=2.0, qualified=True), schema, added)
    record = TurnRecord.from_json(line)
    assert (record.language, record.schema) == ("cuda", SCHEMA_VERSION)
    assert (record.speedup, record.qualified) == (2.0, True)


def test_a_newer_schema_is_refused() -> None:
    data = json.loads(turn(H100, 0, 0, 1).to_json()) | {"schema": SCHEMA_VERSION + 1}
    with pytest.raises(ValueError, match="schema 4 is not supported"):
        TurnRecord.from_data(data)


@pytest.mark.parametrize(
    ("status", "reached"),
    [
        ("PASSED", True),
        ("INCORRECT_NUMERICAL", True),
        ("COMPILED", False),
        ("COMPILE_ERROR", False),
    ],
)
def test_a_turn_reached_the_gpu_when_it_was_judged_past_its_build(
    status: str, reached: bool
) -> None:
    assert replace(turn(H100, 0, 0, 1), status=status).reached_gpu is reached


def _timed(record: TurnRecord, mfu: object) -> TurnRecord:
    return replace(record, outcome={"speed_of_light": {"mfu": mfu, "achieved_tflops": 1.0}})


def test_a_turns_mfu_is_its_speed_of_light_measurement() -> None:
    record = turn(H100, 0, 0, 1, speedup=1.0, qualified=True)
    assert _timed(record, 0.42).mfu == 0.42
    assert _timed(record, 1).mfu == 1.0
    # Not timed, timed on a GPU without known peaks (no speed_of_light), or not a number.
    assert record.mfu is None
    assert replace(record, outcome={"speed_of_light": None}).mfu is None
    assert _timed(record, None).mfu is None
    assert _timed(record, True).mfu is None


def test_the_best_mfu_counts_the_turns_that_best_speedup_counts() -> None:
    records = [
        _timed(turn(H100, 0, 0, 1, speedup=1.0, qualified=True), 0.30),
        _timed(turn(H100, 0, 0, 2, speedup=1.0, qualified=False), 0.60),
        _timed(turn(H100, 0, 0, 3, speedup=1.0, qualified=None), 0.50),
        _timed(turn(H100, 0, 0, 4), 0.90),  # wrong: a wrong kernel's speed is no result
        turn(H100, 0, 0, 5, speedup=3.0, qualified=True),  # correct, MFU not measured
    ]
    assert best_mfu(records, inst=True) == 0.30
    assert best_mfu(records, inst=False) == 0.60
    assert best_mfu(records[3:], inst=False) is None
    assert best_mfu([], inst=True) is None


TRITON_GEMM = (paths.examples_dir() / "triton" / "gemm.py").read_text(encoding="utf-8")


@pytest.mark.parametrize(
    ("language", "action", "status"),
    [
        # No code block: judged without a build, so this needs no nvcc.
        ("cuda", "no kernel here", "FORMAT_ERROR"),
        # A Triton module is byte-compiled on the CPU (docs/triton.md).
        ("triton", f"```python\n{TRITON_GEMM}```", "COMPILED"),
    ],
)
def test_the_recorder_writes_the_envs_language(
    tmp_path: Path, language: str, action: str, status: str
) -> None:
    path = tmp_path / "r.jsonl"
    inner = PTXKernelEnv(H100, turns=1, evaluator="compile-only", language=language)
    env = TrajectoryRecorder(inner, path, run="ci", agent="scripted")
    env.reset(seed=0)
    assert env.step(action)[4]["status"] == status
    env.close()
    (record,) = read_records(path)
    assert (record.language, record.status, record.schema) == (language, status, SCHEMA_VERSION)
