"""The report by action language and with MFU: Triton and CUDA runs kept apart, the per-task best
MFU beside best speedup, and the Triton-against-CUDA table, against hand-computed values."""

from __future__ import annotations

import csv
import io
import json
from dataclasses import fields, replace
from pathlib import Path

import pytest
from turn_records import B200, H100, RECORDS, turn, write

from ptxgym.bench.languages import LanguageRow, language_rows
from ptxgym.bench.plots import fast_p_model_figure
from ptxgym.bench.report import report
from ptxgym.bench.runs import NOTHING_RAN, load
from ptxgym.cli import main
from ptxgym.records.turns import TurnRecord


def timed(record: TurnRecord, mfu: float) -> TurnRecord:
    return replace(record, outcome={"speed_of_light": {"mfu": mfu, "achieved_tflops": 1.0}})


def spoken(records: list[TurnRecord], language: str) -> list[TurnRecord]:
    return [replace(record, language=language) for record in records]


def cell(markdown: str, heading: str, task_id: str, column: str) -> str:
    """The cell of ``column`` in ``task_id``'s row of the table under ``## heading``."""
    lines = markdown.splitlines()
    start = lines.index(f"## {heading}")
    header = next(line for line in lines[start:] if line.startswith("| task |"))
    row = next(line for line in lines[start:] if line.startswith(f"| {task_id} |"))
    columns = [part.strip() for part in header.strip("|").split("|")]
    cells = [part.strip() for part in row.strip("|").split("|")]
    return cells[columns.index(column)]


# --------------------------------------------------------------------------------------------
# Languages are never pooled


@pytest.fixture
def two_languages(tmp_path: Path) -> list[Path]:
    """The same run, ``r`` (the file's stem, as ``ptxgym run`` names it), in each language."""
    (tmp_path / "cuda").mkdir()
    (tmp_path / "triton").mkdir()
    return [
        write(tmp_path / "cuda" / "r.jsonl", RECORDS),
        write(tmp_path / "triton" / "r.jsonl", spoken(RECORDS, "triton")),
    ]


def test_runs_of_two_languages_are_two_runs_and_two_models(two_languages: list[Path]) -> None:
    cuda, triton = load(two_languages)
    assert (cuda.label, triton.label) == ("r (full)", "r (full, triton)")
    assert len(cuda.records()) == len(triton.records()) == len(RECORDS)
    document = json.loads(report(two_languages, fmt="json"))
    models = {(row["agent"], row["knowledge"], row["language"]): row for row in document["models"]}
    assert list(models) == [("test", "full", "cuda"), ("test", "full", "triton")]
    # Not pooled: each has the 4 trajectories and 8 turns of one copy of the records.
    assert {(row["trajectories"], row["turns"]) for row in models.values()} == {(4, 8)}
    assert models[("test", "full", "triton")]["correct_mean"] == pytest.approx(7 / 12)
    tasks = document["tasks"]
    assert {row["language"] for row in tasks} == {"cuda", "triton"}
    assert len(tasks) == 2 * len([row for row in tasks if row["language"] == "cuda"])
    assert {row["language"] for row in document["categories"]} == {"cuda", "triton"}
    labels = [line.get_label() for line in fast_p_model_figure(load(two_languages)).axes[0].lines]
    assert labels == ["test (full)", "test (full, triton)"]


def test_each_language_gets_its_own_table_that_names_it(two_languages: list[Path]) -> None:
    lines = report(two_languages).splitlines()
    for language in ("cuda", "triton"):
        row = f"| test | full | {language} | 2 | 2 | 4 | 8 | 0.58 [0.17–1.00] |"
        assert any(line.startswith(row) for line in lines)
    assert lines.index("## r") < lines.index("## r (triton)")
    intros = [line for line in lines if line.startswith("Agent test, knowledge full, language ")]
    assert [intro.split(":")[0] for intro in intros] == [
        "Agent test, knowledge full, language cuda",
        "Agent test, knowledge full, language triton",
    ]


def test_a_turn_recorded_twice_in_one_language_is_still_an_error(
    two_languages: list[Path],
) -> None:
    """One run name and key in two languages are two turns (two files of one stem); in one
    language, the same turn twice."""
    _, triton = two_languages
    with pytest.raises(ValueError, match=r"in run 'r' \(triton\) is recorded twice"):
        load([*two_languages, triton])


# --------------------------------------------------------------------------------------------
# Best MFU per task

# H100 (three turns at most, so the limits are ≤1 and ≤3). t: trajectory; q, u, n: correct with
# the target instructions executed, not executed, not profiled.
#   variant 0, t0: q 30%, u 60%, wrong;   t1: n 50%, q 42%
#   variant 1, t0: wrong, q 20%, u (no MFU measured)
# B200: one correct, qualified turn whose speed of light was not measured.
MFU_RECORDS = [
    timed(turn(H100, 0, 0, 1, speedup=1.0, qualified=True), 0.30),
    timed(turn(H100, 0, 0, 2, speedup=1.0, qualified=False), 0.60),
    turn(H100, 0, 0, 3),
    timed(turn(H100, 0, 1, 1, speedup=1.0, qualified=None), 0.50),
    timed(turn(H100, 0, 1, 2, speedup=1.0, qualified=True), 0.42),
    turn(H100, 1, 0, 1),
    timed(turn(H100, 1, 0, 2, speedup=1.0, qualified=True), 0.20),
    turn(H100, 1, 0, 3, speedup=1.0, qualified=False),
    turn(B200, 0, 0, 1, speedup=1.0, qualified=True),
]


def test_the_per_task_best_mfu_per_variant_and_turn_limit(tmp_path: Path) -> None:
    """≤1: variant 0's first turns give 30% (^Inst) and 50%; variant 1's first turn is wrong.
    ≤3: variant 0 gives 42% and 60%, variant 1 20% and 20%: means 31% and 40%."""
    path = write(tmp_path / "mfu.jsonl", MFU_RECORDS)
    rows = json.loads(report([path], fmt="json"))["tasks"]
    mfu = {(r["task_id"], r["limit"]): r for r in rows if r["metric"] == "best_mfu"}
    assert set(mfu) == {(task_id, k) for task_id in (H100, B200) for k in (1, 3)}
    first, every = mfu[(H100, 1)], mfu[(H100, 3)]
    assert (first["inst_mean"], first["inst_n"], first["unrestricted_mean"]) == (0.30, 1, 0.50)
    assert (first["variants"], first["unrestricted_n"]) == (2, 1)
    assert every["inst_mean"] == pytest.approx(0.31)
    assert (every["inst_min"], every["inst_max"], every["inst_n"]) == (0.20, 0.42, 2)
    assert every["unrestricted_mean"] == pytest.approx(0.40)
    assert (every["unrestricted_min"], every["unrestricted_max"]) == (0.20, 0.60)
    assert mfu[(B200, 3)]["inst_n"] == mfu[(B200, 3)]["unrestricted_n"] == 0

    markdown = report([path])
    header = next(line for line in markdown.splitlines() if line.startswith("| task |"))
    assert "| best speedup ≤1 | best speedup ≤3 | best MFU ≤1 | best MFU ≤3 | Fast_1 ≤1 |" in header
    assert cell(markdown, "r", H100, "best MFU ≤1") == "30.0% (50.0%)"
    assert cell(markdown, "r", H100, "best MFU ≤3") == "31.0% [20.0%–42.0%] (40.0% [20.0%–60.0%])"
    assert cell(markdown, "r", B200, "best MFU ≤3") == "– (–)"
    assert "best MFU (for a run whose turns were timed on a GPU with known peaks)" in markdown

    table = list(csv.DictReader(io.StringIO(report([path], fmt="csv"))))
    key = (H100, "best_mfu", "3")
    (row,) = [r for r in table if (r["task_id"], r["metric"], r["limit"]) == key]
    assert (row["language"], row["inst_min"], row["unrestricted_max"]) == ("cuda", "0.2", "0.6")


def test_no_mfu_column_without_a_measurement(tmp_path: Path) -> None:
    plain = write(tmp_path / "plain.jsonl", RECORDS)
    assert "MFU" not in report([plain])
    rows = json.loads(report([plain], fmt="json"))["tasks"]
    assert "best_mfu" not in {row["metric"] for row in rows}
    # Beside a run that measured MFU, a run that did not still has no column of dashes.
    other = [replace(record, run="other") for record in RECORDS]
    both = report([write(tmp_path / "both.jsonl", MFU_RECORDS + other)])
    assert cell(both, "r", H100, "best MFU ≤1") == "30.0% (50.0%)"
    with pytest.raises(ValueError, match="best MFU ≤1"):
        cell(both, "other", H100, "best MFU ≤1")


# --------------------------------------------------------------------------------------------
# Triton against CUDA


def by(
    agent: str, run: str, language: str, knowledge: str, records: list[TurnRecord]
) -> list[TurnRecord]:
    return [
        replace(record, agent=agent, run=run, language=language, knowledge=knowledge)
        for record in records
    ]


# llm, knowledge full, in CUDA: H100 (v0: wrong, q2.0 at 40%; v1: u1.5 at 55%, wrong) and B200
# (CUDA only: no comparison). In Triton: H100 (v0: q0.8, n1.2, no MFU measured). solo plays H100
# in CUDA only, and llm at knowledge none in Triton only: neither is compared.
CUDA_RUN = by(
    "llm",
    "c",
    "cuda",
    "full",
    [
        turn(H100, 0, 0, 1),
        timed(turn(H100, 0, 0, 2, speedup=2.0, qualified=True), 0.40),
        timed(turn(H100, 1, 0, 1, speedup=1.5, qualified=False), 0.55),
        turn(H100, 1, 0, 2),
        turn(B200, 0, 0, 1, speedup=1.0, qualified=True),
    ],
)
TRITON_RUN = by(
    "llm",
    "t",
    "triton",
    "full",
    [
        turn(H100, 0, 0, 1, speedup=0.8, qualified=True),
        turn(H100, 0, 0, 2, speedup=1.2, qualified=None),
    ],
)
UNPAIRED = by("solo", "s", "cuda", "full", [turn(H100, 0, 0, 1, speedup=9.0, qualified=True)])
UNPAIRED += by("llm", "n", "triton", "none", [turn(H100, 0, 0, 1, speedup=9.0, qualified=True)])
COMPARED = CUDA_RUN + TRITON_RUN + UNPAIRED

EXPECTED = [
    # 2 trajectories, 4 turns: 2 correct, 1 of them qualified; best 2.0 (qualified), MFU^Inst 40%
    # (the 55% turn did not execute the target instructions).
    LanguageRow("llm", "full", H100, "cuda", 2, 4, 0.5, 0.25, 2.0, 2.0, 0.40, reached_gpu=True),
    # 1 trajectory, 2 turns, both correct, one qualified; no MFU measured.
    LanguageRow("llm", "full", H100, "triton", 1, 2, 1.0, 0.5, 1.2, 0.8, None, reached_gpu=True),
]
LANGUAGE_HEADER = (
    "| agent | knowledge | task | language | trajectories | turns | correct | correct^Inst | "
    "best speedup | best speedup^Inst | best MFU^Inst |"
)


def test_the_language_rows_are_the_tasks_played_in_both_languages() -> None:
    # The Triton records first: CUDA still comes first within the comparison.
    assert language_rows(TRITON_RUN + CUDA_RUN + UNPAIRED) == EXPECTED
    assert language_rows(CUDA_RUN + UNPAIRED) == []


def test_the_report_sets_triton_against_cuda(tmp_path: Path) -> None:
    path = write(tmp_path / "compared.jsonl", COMPARED)
    lines = report([path]).splitlines()
    start = lines.index("## Triton against CUDA")
    assert lines.index("## Per model") < start < lines.index("## c")
    assert lines[start + 2 : start + 6] == [
        LANGUAGE_HEADER,
        "|---" * 11 + "|",
        "| llm | full | PTX-H100-GEMM | cuda | 2 | 4 | 0.50 | 0.25 | 2.00 | 2.00 | 40.0% |",
        "| llm | full | PTX-H100-GEMM | triton | 1 | 2 | 1.00 | 0.50 | 1.20 | 0.80 | – |",
    ]
    assert lines[start + 7].startswith("For every agent, knowledge level and task recorded in ")

    document = json.loads(report([path], fmt="json"))
    assert document["languages"] == [row.flat() for row in EXPECTED]
    assert document["languages"][1]["best_mfu_inst"] is None
    table = list(csv.DictReader(io.StringIO(report([path], fmt="csv", csv_table="languages"))))
    assert [(r["language"], r["correct_inst"], r["best_mfu_inst"]) for r in table] == [
        ("cuda", "0.25", "0.4"),
        ("triton", "0.5", ""),
    ]


def test_the_language_table_has_no_mfu_column_without_a_measurement(tmp_path: Path) -> None:
    untimed = [replace(record, outcome={}) for record in COMPARED]
    text = report([write(tmp_path / "untimed.jsonl", untimed)])
    assert LANGUAGE_HEADER.removesuffix(" best MFU^Inst |") in text
    assert "MFU" not in text
    cuda, _ = json.loads(report([tmp_path / "untimed.jsonl"], fmt="json"))["languages"]
    assert cuda["best_mfu_inst"] is None


def test_a_comparison_of_compile_only_runs_says_its_zeros_are_not_results(tmp_path: Path) -> None:
    built = [
        replace(record, status="COMPILED", evaluator="compile-only", correct=False, speedup=None)
        for record in COMPARED
    ]
    cuda, triton = language_rows(built)
    assert not cuda.reached_gpu and not triton.reached_gpu
    assert (cuda.correct, cuda.best_speedup) == (0.0, None)
    text = report([write(tmp_path / "built.jsonl", built)])
    for language in ("cuda", "triton"):
        assert (
            f"{NOTHING_RAN} for llm (full) on {H100} in {language} (compile-only evaluation): "
            "its zeros are not results."
        ) in text
    assert "on PTX-H100-GEMM in" not in report([write(tmp_path / "gpu.jsonl", COMPARED)])


def test_no_comparison_without_a_task_in_two_languages(tmp_path: Path) -> None:
    path = write(tmp_path / "cuda.jsonl", CUDA_RUN + UNPAIRED)
    assert "Triton against CUDA" not in report([path])
    assert json.loads(report([path], fmt="json"))["languages"] == []
    header = ",".join(column.name for column in fields(LanguageRow))
    assert report([path], fmt="csv", csv_table="languages") == header + "\n"


def test_cli_prints_the_language_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path / "compared.jsonl", COMPARED)
    assert main(["report", str(path), "--format", "csv", "--csv-table", "languages"]) == 0
    table = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert [(r["agent"], r["task_id"], r["language"]) for r in table] == [
        ("llm", H100, "cuda"),
        ("llm", H100, "triton"),
    ]
