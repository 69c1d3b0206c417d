"""The report against hand-computed values from crafted trajectory records."""

from __future__ import annotations

import csv
import io
import json
from dataclasses import replace
from pathlib import Path

import pytest
from matplotlib.axes import Axes
from matplotlib.collections import PolyCollection
from turn_records import B200, H100, RECORDS, turn, write

from ptxgym.bench.plots import fast_p_figure, fast_p_model_figure, report_figure
from ptxgym.bench.report import report
from ptxgym.bench.runs import NOTHING_RAN, load
from ptxgym.cli import main
from ptxgym.records.turns import TurnRecord

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


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
    rows = json.loads(report([run_file], fmt="json"))["tasks"]
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
    assert f"{NOTHING_RAN} for test (full) (compile-only evaluation)" in text
    assert NOTHING_RAN not in report([write(tmp_path / "gpu.jsonl", RECORDS)])
    (model,) = json.loads(report([tmp_path / "cpu.jsonl"], fmt="json"))["models"]
    assert model["reached_gpu"] is False and model["correct_mean"] == 0.0


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
    document = json.loads(capsys.readouterr().out)
    assert {row["p"] for row in document["tasks"]} == {None, 0.5, 1.0}
    assert [row["agent"] for row in document["models"]] == ["test"]
    assert {"fast_inst_p0.5_k1_mean", "fast_inst_p1_k1_mean"} <= set(document["models"][0])
    assert plot.read_bytes().startswith(PNG_MAGIC)


def test_cli_report_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["report", str(tmp_path / "missing.jsonl")]) == 2
    assert "no such file" in capsys.readouterr().err
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    assert main(["report", str(empty)]) == 2
    assert "no trajectory records" in capsys.readouterr().err


# The per-model table: two agents, each over 3 prompt variants × 2 tasks, in runs of their own.
# A turn code: x wrong; q, u, n correct at that speedup with the target instructions executed
# (q), not executed (u) or not profiled (n).
def played(
    run: str, agent: str, plays: dict[tuple[str, int, int], str], llm: bool
) -> list[TurnRecord]:
    """The turns of each (task, variant, trajectory)'s codes; with ``llm``, generation data:
    1000 prompt tokens, 100 × turn completion tokens and turn seconds per turn."""
    records = []
    for (task_id, variant, index), codes in plays.items():
        for number, code in enumerate(codes.split(), 1):
            qualified = {"q": True, "u": False, "n": None, "x": None}[code[0]]
            speedup = None if code == "x" else float(code[1:])
            record = turn(task_id, variant, index, number, speedup, qualified, run=run)
            generation = {
                "model": "gpt-test",
                "reply": "```cuda\n...\n```",
                "prompt_tokens": 1000,
                "completion_tokens": 100 * number,
                "seconds": float(number),
                "finish_reason": "stop",
                "attempts": 1,
            }
            records.append(replace(record, agent=agent, generation=generation if llm else {}))
    return records


# llm: 4 turns, one trajectory per task and variant. Per variant (8 turns each):
#   correct 2/8, 4/8, 6/8; correct^Inst 2/8, 2/8, 4/8; best speedup 2, 3, 8; best^Inst 2, 3, 6;
#   Fast_1^Inst ≤1 (first turns) 0/2, 1/2, 0/2 and ≤4 2/8, 2/8, 3/8 (q0.9 is not > 1).
LLM = played(
    "a",
    "llm",
    {
        (H100, 0, 0): "x q2 x x",
        (B200, 0, 0): "x x q1.5 x",
        (H100, 1, 0): "q1.5 q3 x x",
        (B200, 1, 0): "x u0.5 u0.8 x",
        (H100, 2, 0): "x q0.9 q1.2 q6",
        (B200, 2, 0): "n2 q4 x u8",
    },
    llm=True,
)
# scripted: 2 turns, two trajectories per task and variant, no generation. Per variant:
#   correct 2/8, 0, 4/8; correct^Inst 2/8, 0, 2/8; best speedup (and ^Inst) 2, none, 1;
#   Fast_1^Inst ≤1 1/4, 0, 0 (q1 is not > 1); ≤4 undefined (its trajectories have 2 turns).
SCRIPTED = played(
    "b",
    "scripted",
    {
        (H100, 0, 0): "q2 q2",
        (H100, 0, 1): "x x",
        (B200, 0, 0): "x x",
        (B200, 0, 1): "x x",
        (H100, 1, 0): "x x",
        (H100, 1, 1): "x x",
        (B200, 1, 0): "x x",
        (B200, 1, 1): "x x",
        (H100, 2, 0): "u0.5 u0.5",
        (H100, 2, 1): "q1 q1",
        (B200, 2, 0): "x x",
        (B200, 2, 1): "x x",
    },
    llm=False,
)
MODEL_HEADER = (
    "| agent | knowledge | language | tasks | variants | trajectories | turns | correct | "
    "correct^Inst | best speedup | best speedup^Inst | Fast_1^Inst ≤1 | Fast_1^Inst ≤4 | model | "
    "prompt tokens | completion tokens | model s/turn |"
)


@pytest.fixture
def models_file(tmp_path: Path) -> Path:
    return write(tmp_path / "models.jsonl", LLM + SCRIPTED)


def test_the_per_model_table_comes_first_with_means_ranges_and_tokens(models_file: Path) -> None:
    text = report([models_file])
    lines = text.splitlines()
    assert lines.index("## Per model") < lines.index(MODEL_HEADER) < lines.index("## a")
    assert lines.index("## a") < lines.index("## b")
    # ≤8 is past the longest trajectory (4 turns): no column.
    assert "≤8" not in text
    # Tokens: 24 turns × 1000; 6 trajectories × (100 + 200 + 300 + 400); seconds 1..4 → 2.5.
    assert (
        "| llm | full | cuda | 2 | 3 | 6 | 24 | 0.50 [0.25–0.75] | 0.33 [0.25–0.50] | "
        "4.33 [2.00–8.00] | 3.67 [2.00–6.00] | 0.17 [0.00–0.50] | 0.29 [0.25–0.38] | "
        "gpt-test | 24,000 | 6,000 | 2.50 |"
    ) in lines
    # Best speedup: the mean and range over the 2 variants that have one.
    assert (
        "| scripted | full | cuda | 2 | 3 | 12 | 24 | 0.25 [0.00–0.50] | 0.17 [0.00–0.25] | "
        "1.50 [1.00–2.00] | 1.50 [1.00–2.00] | 0.08 [0.00–0.25] | – | – | – | – | – |"
    ) in lines


def test_the_per_model_table_without_generation_has_no_token_columns(run_file: Path) -> None:
    lines = report([run_file]).splitlines()
    # Variant 0 pools H100's trajectory with B200's two (6 turns), variant 1 is H100's (2 turns):
    # correct 1/6 and 2/2, correct^Inst 1/6 and 0, best 2 and 1.5, best^Inst 2 and none.
    assert (
        "| agent | knowledge | language | tasks | variants | trajectories | turns | correct | "
        "correct^Inst | best speedup | best speedup^Inst | Fast_1^Inst ≤1 |"
    ) in lines
    assert (
        "| test | full | cuda | 2 | 2 | 4 | 8 | 0.58 [0.17–1.00] | 0.08 [0.00–0.17] | "
        "1.75 [1.50–2.00] | 2.00 | 0.00 |"
    ) in lines


def test_models_pool_runs_and_split_knowledge_levels(tmp_path: Path) -> None:
    again = [replace(record, run="again") for record in RECORDS]
    other = [replace(record, run="other", knowledge="none") for record in RECORDS]
    models = json.loads(report([write(tmp_path / "k.jsonl", RECORDS + again + other)], fmt="json"))
    rows = {(row["agent"], row["knowledge"]): row for row in models["models"]}
    assert list(rows) == [("test", "full"), ("test", "none")]
    pooled, alone = rows[("test", "full")], rows[("test", "none")]
    assert (pooled["trajectories"], pooled["turns"], alone["trajectories"], alone["turns"]) == (
        8,
        16,
        4,
        8,
    )
    # The same records twice: every rate and maximum is unchanged.
    for key in ("correct_mean", "correct_inst_min", "best_speedup_max", "fast_inst_p1_k1_mean"):
        assert pooled[key] == alone[key]
    assert pooled["correct_mean"] == pytest.approx(7 / 12)


def test_json_has_the_per_model_numbers(models_file: Path) -> None:
    document = json.loads(report([models_file], fmt="json"))
    assert set(document) == {"models", "tasks", "categories", "languages"}
    llm, scripted = document["models"]
    assert (llm["agent"], llm["knowledge"], llm["model"], scripted["model"]) == (
        "llm",
        "full",
        "gpt-test",
        None,
    )
    assert (llm["tasks"], llm["variants"], llm["trajectories"], llm["turns"]) == (2, 3, 6, 24)
    expected = {
        "correct": (0.5, 0.25, 0.75, 3),
        "correct_inst": (1 / 3, 0.25, 0.5, 3),
        "best_speedup": (13 / 3, 2.0, 8.0, 3),
        "best_speedup_inst": (11 / 3, 2.0, 6.0, 3),
        "fast_inst_p1_k1": (1 / 6, 0.0, 0.5, 3),
        "fast_inst_p1_k4": (0.875 / 3, 0.25, 0.375, 3),
    }
    for key, (mean, low, high, n) in expected.items():
        assert llm[f"{key}_mean"] == pytest.approx(mean), key
        assert (llm[f"{key}_min"], llm[f"{key}_max"], llm[f"{key}_n"]) == (low, high, n), key
    assert "fast_inst_p1_k8_mean" not in llm
    assert (scripted["best_speedup_mean"], scripted["best_speedup_n"]) == (1.5, 2)
    assert scripted["fast_inst_p1_k1_mean"] == pytest.approx(1 / 12)
    assert (scripted["fast_inst_p1_k4_mean"], scripted["fast_inst_p1_k4_n"]) == (None, 0)
    assert (
        llm["generated_turns"],
        llm["prompt_tokens"],
        llm["completion_tokens"],
        llm["model_seconds_per_turn"],
    ) == (24, 24000, 6000, 2.5)
    assert (
        scripted["generated_turns"],
        scripted["prompt_tokens"],
        scripted["completion_tokens"],
        scripted["model_seconds_per_turn"],
    ) == (0, None, None, None)
    # The per-task rows: 2 runs × 2 tasks × 3 metrics × 2 limits (≤1, ≤4 for a; ≤1, ≤2 for b).
    assert len(document["tasks"]) == 2 * 2 * 3 * 2


def test_csv_prints_the_per_model_table_when_asked(models_file: Path) -> None:
    text = report([models_file], fmt="csv", csv_table="models")
    llm, scripted = csv.DictReader(io.StringIO(text))
    assert text.splitlines()[0].startswith(
        "agent,knowledge,language,model,tasks,variants,trajectories,turns,reached_gpu,correct_mean,"
    )
    assert (llm["correct_mean"], llm["correct_min"], llm["correct_max"]) == ("0.5", "0.25", "0.75")
    assert (llm["prompt_tokens"], llm["completion_tokens"], llm["model_seconds_per_turn"]) == (
        "24000",
        "6000",
        "2.5",
    )
    assert (scripted["model"], scripted["prompt_tokens"], scripted["fast_inst_p1_k4_mean"]) == (
        "",
        "",
        "",
    )
    assert report([models_file], fmt="csv") == report([models_file], fmt="csv", csv_table="tasks")
    with pytest.raises(ValueError, match="only with the csv format"):
        report([models_file], csv_table="models")


def _bands(ax: Axes) -> list[float]:
    """The top of each shaded band in ``ax``, in drawing order."""
    return [
        max(vertex[1] for path in fill.get_paths() for vertex in path.vertices)
        for fill in ax.collections
        if isinstance(fill, PolyCollection)
    ]


def test_the_model_plot_shades_the_variants_around_their_mean(models_file: Path) -> None:
    figure = fast_p_model_figure(load([models_file]))
    inst, plain = figure.axes
    assert "Inst" in inst.get_title() and "Inst" not in plain.get_title()
    for ax in (inst, plain):
        labels = [line.get_label() for line in ax.get_lines()]
        assert labels == ["llm (full)", "scripted (full)"]
    # At the smallest threshold (0.01) every correct turn is fast: Fast_p is the correctness rate,
    # so the mean line starts at the variants' mean and the band reaches their maximum.
    llm, scripted = (line.get_ydata()[0] for line in inst.get_lines())
    assert (llm, scripted) == (pytest.approx(1 / 3), pytest.approx(1 / 6))
    assert _bands(inst) == [0.5, 0.25]
    llm, scripted = (line.get_ydata()[0] for line in plain.get_lines())
    assert (llm, scripted) == (pytest.approx(0.5), pytest.approx(0.25))
    assert _bands(plain) == [0.75, 0.5]


def test_the_plot_file_holds_the_models_above_the_tasks(models_file: Path, tmp_path: Path) -> None:
    figure = report_figure(load([models_file]))
    models, tasks = figure.subfigs
    assert [len(_bands(ax)) for ax in models.axes] == [2, 2]
    assert [len(_bands(ax)) for ax in tasks.axes] == [0, 0]
    labels = [line.get_label() for line in tasks.axes[0].get_lines()]
    assert [label for label in labels if not label.startswith("_")] == [
        f"{run} (full) · {task_id}" for run in "ab" for task_id in (H100, B200)
    ]
    plot = tmp_path / "models.png"
    report([models_file], plot=plot)
    assert plot.read_bytes().startswith(PNG_MAGIC)


def _timed(record: TurnRecord, mfu: float) -> TurnRecord:
    return replace(record, outcome={"speed_of_light": {"mfu": mfu, "achieved_tflops": 1.0}})


def test_the_per_model_table_gives_the_best_mfu_of_qualified_turns(tmp_path: Path) -> None:
    """Variant 0: qualified turns at 40 % and 70 % MFU, best 70 %; variant 1: its only timed
    turn is not qualified, so its best is undefined and the spread is variant 0's alone."""
    records = [
        _timed(turn(H100, 0, 0, 1, speedup=1.0, qualified=True), 0.40),
        _timed(turn(H100, 0, 0, 2, speedup=2.0, qualified=True), 0.70),
        _timed(turn(H100, 1, 0, 1, speedup=0.5, qualified=False), 0.90),
        turn(H100, 1, 0, 2),
    ]
    path = write(tmp_path / "mfu.jsonl", records)
    text = report([path])
    header = next(line for line in text.splitlines() if line.startswith("| agent |"))
    assert header.split(" | ")[-1] == "best MFU^Inst |"
    row = next(line for line in text.splitlines() if line.startswith("| test |"))
    assert row.endswith("| 70.0% |")
    (model,) = json.loads(report([path], fmt="json"))["models"]
    assert (model["best_mfu_inst"], model["best_mfu_inst_min"]) == (0.70, 0.70)
    # Records without a measurement (compile-only, or an unlisted GPU) get no column.
    plain = report([write(tmp_path / "plain.jsonl", [turn(H100, 0, 0, 1, speedup=1.0)])])
    assert "MFU" not in plain


def _protocol(record: TurnRecord, warmup: int, timed: int, trials: int = 3) -> TurnRecord:
    timing = {"workload": "w", "warmup_calls": warmup, "timed_calls": timed}
    timing["trial_medians_ms"] = [1.0] * trials
    return replace(record, outcome={"timings": [timing]})


def test_the_run_summary_says_which_protocol_timed_its_turns(tmp_path: Path) -> None:
    # Records from before the protocol was recorded (timed_calls absent) say nothing.
    assert "Timed with" not in report([write(tmp_path / "old.jsonl", RECORDS)])
    same = [_protocol(r, 10, 50) for r in RECORDS[:2]]
    text = report([write(tmp_path / "same.jsonl", same)])
    assert "Timed with 10 warm-up and 50 timed calls per trial, 3 trials per workload." in text
    mixed = [_protocol(RECORDS[0], 10, 50), _protocol(RECORDS[1], 2, 5, trials=1)]
    text = report([write(tmp_path / "mixed.jsonl", mixed)])
    assert (
        "Timed with different protocols (warm-up + timed calls × trials: 2+5 calls × 1 in "
        "1 turn; 10+50 calls × 3 in 1 turn): their speedups are not comparable."
    ) in text
