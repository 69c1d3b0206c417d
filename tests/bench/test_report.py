"""The report against hand-computed values from crafted trajectory records."""

from __future__ import annotations

import csv
import io
import json
from dataclasses import replace
from pathlib import Path

import pytest

from ptxgym.bench.records import TurnRecord
from ptxgym.bench.report import NOTHING_RAN, fast_p_figure, load, report
from ptxgym.cli import main

H100, B200 = "PTX-H100-GEMM", "PTX-B200-GEMM"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


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


@pytest.fixture
def run_file(tmp_path: Path) -> Path:
    return write(tmp_path / "run.jsonl", RECORDS)


def test_markdown_cells_are_means_over_variants_with_their_range(run_file: Path) -> None:
    lines = report([run_file]).splitlines()
    assert (
        "| task | correct ≤1 | correct ≤2 | best speedup ≤1 | best speedup ≤2 | Fast_1 ≤1 | "
        "Fast_1 ≤2 |"
    ) in lines
    # Per variant (inst, unrestricted): correct ≤1 (0, 0) and (0, 1); ≤2 (.5, .5) and (0, 1);
    # best ≤1 (–, –) and (–, .5); best ≤2 (2, 2) and (–, 1.5); Fast_1 ≤2 (.5, .5) and (0, .5).
    assert (
        "| PTX-H100-GEMM | 0.00 (0.50 [0.00–1.00]) | 0.25 [0.00–0.50] (0.75 [0.50–1.00]) | "
        "– (0.50) | 2.00 (1.75 [1.50–2.00]) | 0.00 (0.00) | 0.25 [0.00–0.50] (0.50) |"
    ) in lines
    assert (
        "| PTX-B200-GEMM | 0.00 (0.00) | 0.00 (0.00) | – (–) | – (–) | 0.00 (0.00) | 0.00 (0.00) |"
    ) in lines
    assert any("Statuses: INCORRECT_NUMERICAL 5, PASSED 3." in line for line in lines)


def test_csv_has_the_same_numbers(run_file: Path) -> None:
    rows = list(csv.DictReader(io.StringIO(report([run_file], fmt="csv", ps=(0.0, 1.0)))))
    # 2 tasks × (correctness, best speedup, Fast_0, Fast_1) × 2 limits
    assert len(rows) == 2 * 4 * 2
    by_key = {(r["task_id"], r["metric"], r["p"], r["limit"]): r for r in rows}
    best = by_key[(H100, "best_speedup", "", "2")]
    assert (best["inst_mean"], best["inst_min"], best["inst_max"], best["inst_n"]) == (
        "2.0",
        "2.0",
        "2.0",
        "1",
    )
    assert float(best["unrestricted_mean"]) == pytest.approx(1.75)
    assert (best["unrestricted_min"], best["unrestricted_max"], best["variants"]) == (
        "1.5",
        "2.0",
        "2",
    )
    undefined = by_key[(B200, "best_speedup", "", "1")]
    assert undefined["inst_mean"] == undefined["unrestricted_max"] == ""
    assert undefined["inst_n"] == "0"
    # Fast_0 is the correctness rate.
    fast0 = by_key[(H100, "fast_p", "0.0", "2")]
    correct = by_key[(H100, "turn_correctness", "", "2")]
    assert fast0["inst_mean"] == correct["inst_mean"] == "0.25"
    assert fast0["unrestricted_mean"] == correct["unrestricted_mean"] == "0.75"


def test_json_has_the_same_numbers(run_file: Path) -> None:
    rows = json.loads(report([run_file], fmt="json"))
    by_key = {(r["task_id"], r["metric"], r["p"], r["limit"]): r for r in rows}
    fast = by_key[(H100, "fast_p", 1.0, 2)]
    assert (fast["inst_mean"], fast["inst_min"], fast["inst_max"]) == (0.25, 0.0, 0.5)
    assert (fast["unrestricted_mean"], fast["unrestricted_min"]) == (0.5, 0.5)
    first = by_key[(H100, "turn_correctness", None, 1)]
    assert (first["unrestricted_mean"], first["unrestricted_min"], first["unrestricted_max"]) == (
        0.5,
        0.0,
        1.0,
    )
    best = by_key[(H100, "best_speedup", None, 1)]
    assert best["inst_mean"] is None and best["inst_n"] == 0 and best["unrestricted_mean"] == 0.5


def test_runs_split_across_files_pool_like_one_file(tmp_path: Path) -> None:
    one = report([write(tmp_path / "all.jsonl", RECORDS)], fmt="json")
    first = write(tmp_path / "a.jsonl", [r for r in RECORDS if r.prompt_variant == 0])
    second = write(tmp_path / "b.jsonl", [r for r in RECORDS if r.prompt_variant == 1])
    assert report([first, second], fmt="json") == one


def test_a_turn_recorded_twice_is_an_error(run_file: Path) -> None:
    with pytest.raises(ValueError, match="recorded twice"):
        report([run_file, run_file])


def test_each_run_gets_its_own_table(tmp_path: Path) -> None:
    other = [turn(H100, 0, 0, 1, speedup=3.0, qualified=True, run="other")]
    text = report([write(tmp_path / "two.jsonl", RECORDS + other)])
    assert "## r" in text and "## other" in text
    assert "| PTX-H100-GEMM | 1.00 (1.00) | 3.00 (3.00) | 1.00 (1.00) |" in text


def test_plot_draws_each_task_in_both_panels(run_file: Path, tmp_path: Path) -> None:
    figure = fast_p_figure(load([run_file]))
    inst, plain = figure.axes
    assert "Inst" in inst.get_title() and "Inst" not in plain.get_title()
    for ax in (inst, plain):
        assert ax.get_xscale() == "log"
        assert ax.get_xlabel() == "speedup threshold p (× library baseline)"
        curves = [line.get_label() for line in ax.get_lines()]
        assert [label for label in curves if not label.startswith("_")] == [H100, B200]
        assert not [text for text in ax.texts if NOTHING_RAN in text.get_text()]
    # H100's curves: the best qualified speedup is 2.0, the best of any correct turn also 2.0.
    assert [text.get_text() for text in inst.texts] == ["2×"]
    fast = inst.get_lines()[0].get_ydata()
    assert max(fast) == pytest.approx(0.25) and min(fast) == 0.0  # half of variant 0's turns
    plot = tmp_path / "plots" / "fastp.png"
    report([run_file], plot=plot)
    assert plot.read_bytes().startswith(PNG_MAGIC)


def _compiled(number: int, wgmma: bool | None) -> TurnRecord:
    """A compile-only turn: built (``wgmma`` present in SASS or not), or refused (None)."""
    record = replace(turn(H100, 0, 0, number), evaluator="compile-only")
    if wgmma is None:
        return replace(record, status="COMPILE_ERROR")
    families = {"compute": wgmma, "data_movement": False}
    sass = {"families_present": families, "error": None}
    return replace(record, status="COMPILED", outcome={"compile": {"sass": sass}})


COMPILE_ONLY = [_compiled(1, True), _compiled(2, False), _compiled(3, None)]


def test_a_run_without_a_gpu_shows_what_was_measured(tmp_path: Path) -> None:
    text = report([write(tmp_path / "cpu.jsonl", COMPILE_ONLY)])
    assert (
        "Built: 2 of 3 turns (67%). Target instructions in the SASS of built turns (static): "
        "wgmma in 1 of 2, TMA in 0 of 2."
    ) in text
    assert f"{NOTHING_RAN} (compile-only evaluation)" in text
    assert NOTHING_RAN not in report([write(tmp_path / "gpu.jsonl", RECORDS)])


def test_the_plot_of_a_run_without_a_gpu_says_nothing_ran(tmp_path: Path) -> None:
    figure = fast_p_figure(load([write(tmp_path / "cpu.jsonl", COMPILE_ONLY)]))
    for ax in figure.axes:
        assert [text.get_text().split(":")[0] for text in ax.texts] == [NOTHING_RAN]


def test_cli_report(run_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plot = tmp_path / "cli.png"
    code = main(
        ["report", str(run_file), "--format", "json", "--p", "0.5", "1", "--plot", str(plot)]
    )
    assert code == 0
    rows = json.loads(capsys.readouterr().out)
    assert {row["p"] for row in rows} == {None, 0.5, 1.0}
    assert plot.read_bytes().startswith(PNG_MAGIC)


def test_cli_report_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["report", str(tmp_path / "missing.jsonl")]) == 2
    assert "no such file" in capsys.readouterr().err
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    assert main(["report", str(empty)]) == 2
    assert "no trajectory records" in capsys.readouterr().err
