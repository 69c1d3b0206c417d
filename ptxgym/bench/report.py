"""Trajectory records → the per-model and per-problem tables (Markdown, CSV, JSON) and the Fast_p
plot (``ptxgym.bench.plots``).

``report(paths)`` reads the JSONL files that ``ptxgym run`` writes (``ptxgym.bench.runs.load``)
and writes the tables whose rows ``ptxgym.bench.tables`` computes: per model, and per problem.
Where one agent played a task in both languages, ``ptxgym.bench.languages`` sets them side by
side. Each metric is shown as the mean over prompt variants with the min–max across them; in the
per-problem table the target-instruction value comes first and the unrestricted value follows in
parentheses. Each run also says what was measured whatever ran; when no turn reached a GPU, the
table and the plot say that their zeros were not measured. Each run's tasks are then grouped by
category (docs/tasks.md; the rows are ``ptxgym.bench.categories``'s): per category, the metrics
pooled over its tasks (target-instruction values only over the tasks that require the
instructions), the transitions between consecutive turns (fixed, regressed, faster, slower) and the
code-quality means of the submitted sources.
"""

from __future__ import annotations

import csv
import io
import json
from collections import Counter
from collections.abc import Sequence
from dataclasses import fields
from pathlib import Path
from typing import Any, Literal

from ptxgym.bench.categories import CategoryRow, category_rows
from ptxgym.bench.languages import LanguageRow, language_rows
from ptxgym.bench.plots import plot_fast_p
from ptxgym.bench.runs import NOTHING_RAN, RecordedRun, Spread, load
from ptxgym.bench.tables import (
    ModelRow,
    Row,
    counted,
    measured,
    metric_columns,
    model_columns,
    model_limits,
    model_rows,
    rows,
    turn_limits,
)
from ptxgym.languages import DEFAULT_LANGUAGE
from ptxgym.records.transitions import EVENTS

Format = Literal["md", "csv", "json"]
FORMATS: tuple[Format, ...] = ("md", "csv", "json")
CsvTable = Literal["tasks", "models", "categories", "languages"]
CSV_TABLES: tuple[CsvTable, ...] = ("tasks", "models", "categories", "languages")
UNDEFINED = "–"


def report(
    paths: Sequence[Path],
    *,
    fmt: Format = "md",
    ps: Sequence[float] = (1.0,),
    plot: Path | None = None,
    csv_table: CsvTable = "tasks",
) -> str:
    """The per-model and per-problem tables of the runs recorded in ``paths``, and the tasks that
    an agent played in more than one language side by side; also saves the plot to ``plot``. CSV
    holds one table: ``csv_table`` says which."""
    if fmt not in FORMATS:
        raise ValueError(f"format must be one of {FORMATS}, not {fmt!r}")
    if csv_table not in CSV_TABLES:
        raise ValueError(f"the CSV table must be one of {CSV_TABLES}, not {csv_table!r}")
    if csv_table != "tasks" and fmt != "csv":
        raise ValueError(f"a CSV table ({csv_table!r}) is chosen only with the csv format")
    if not ps or any(p < 0 for p in ps):
        raise ValueError(f"speedup thresholds p must be given and be ≥ 0, not {list(ps)}")
    ps = tuple(dict.fromkeys(ps))  # a threshold given twice is one group of columns
    runs = load(paths)
    table = rows(runs, ps)
    models = model_rows(runs, ps)
    categories = category_rows(runs, ps)
    languages = language_rows(record for run in runs for record in run.records())
    if plot is not None:
        plot_fast_p(runs, plot)
    if fmt == "csv":
        chosen: dict[CsvTable, Sequence[ModelRow | Row | CategoryRow | LanguageRow]] = {
            "models": models,
            "tasks": table,
            "categories": categories,
            "languages": languages,
        }
        flat = [row.flat() for row in chosen[csv_table]]
        # Only the languages table can be empty (no agent played a task in two languages); its
        # header still names the columns.
        header = list(flat[0]) if flat else [column.name for column in fields(LanguageRow)]
        return _csv(header, flat)
    if fmt == "json":
        document = {
            "models": [row.flat() for row in models],
            "tasks": [row.flat() for row in table],
            "categories": [row.flat() for row in categories],
            "languages": [row.flat() for row in languages],
        }
        return json.dumps(document, indent=2) + "\n"
    return _markdown(runs, table, ps, models, categories, languages)


def _category_markdown(rows: Sequence[CategoryRow], ps: Sequence[float]) -> list[str]:
    """A run's two category tables: metrics, then transitions and code quality."""
    if not rows:
        return []
    metrics = [
        ("correct", "correct", "turn_correctness"),
        ("correct_inst", "correct^Inst", "turn_correctness"),
        ("best_speedup", "best speedup", "best_speedup"),
        *(
            (key, f"Fast_{p:g}" + suffix, "fast_p")
            for p in ps
            for key, suffix in ((f"fast_p{p:g}", ""), (f"fast_p{p:g}_inst", "^Inst"))
        ),
    ]
    header = ["category", "tasks", "performance", "turns", *(title for _, title, _ in metrics)]
    lines = ["### By category", "", "| " + " | ".join(header) + " |", "|---" * len(header) + "|"]
    for row in rows:
        cells = [row.category, str(row.tasks), str(row.performance_tasks), str(row.turns)]
        cells += [_spread(row.metrics[key], metric) for key, _, metric in metrics]
        lines.append("| " + " | ".join(cells) + " |")
    header = ["category", "transitions", *EVENTS, "measured turns", "lines", "CC max", "MI"]
    lines += ["", "| " + " | ".join(header) + " |", "|---" * len(header) + "|"]
    for row in rows:
        quality = row.quality
        cells = [row.category, str(row.transitions["total"])]
        cells += [str(row.transitions[event]) for event in EVENTS]
        cells += [
            str(quality.turns),
            *(
                UNDEFINED if value is None else f"{value:.1f}"
                for value in (quality.lines, quality.cyclomatic_max, quality.maintainability)
            ),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    lines += [
        "",
        "Per category, over all turns of its tasks (the longest turn limit), each metric "
        "computed per prompt variant and shown as the mean with [min–max] across variants. "
        "performance: tasks that require no target instructions; the ^Inst values are over the "
        f"other tasks only ({UNDEFINED} where there are none). transitions: consecutive pairs "
        "of turns; fixed: wrong → correct; regressed: correct → wrong; faster/slower: both "
        "correct and the speedup moved by more than 5%. lines, CC max (the most complex "
        "function's cyclomatic complexity) and MI (maintainability index, 0–100): means over "
        "the turns whose records measured their source (docs/metrics.md).",
        "",
    ]
    return lines


def _csv(header: Sequence[str], table: Sequence[dict[str, Any]]) -> str:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=header, lineterminator="\n")
    writer.writeheader()
    for row in table:
        writer.writerow({key: "" if value is None else value for key, value in row.items()})
    return buffer.getvalue()


def _number(value: float | None, metric: str) -> str:
    if value is None:
        return UNDEFINED
    if metric == "best_speedup" and value < 0.1:
        return f"{value:.2g}"  # naive kernels run at ~0.01x: two decimals would show 0.00
    if metric == "best_mfu":
        return f"{value:.1%}"
    return f"{value:.2f}"


def _spread(spread: Spread, metric: str) -> str:
    text = _number(spread.mean, metric)
    low, high = _number(spread.low, metric), _number(spread.high, metric)
    return text if low == high else f"{text} [{low}–{high}]"


def _header(metric: str, p: float | None, k: int) -> str:
    name = {
        "turn_correctness": "correct",
        "best_speedup": "best speedup",
        "best_mfu": "best MFU",
    }.get(metric)
    return f"{name or f'Fast_{p:g}'} ≤{k}"


def _model_markdown(
    runs: Sequence[RecordedRun], models: Sequence[ModelRow], ps: Sequence[float]
) -> list[str]:
    """The per-model table, and what its cells mean."""
    columns = model_columns(ps, model_limits(runs))
    generation = any(row.generation.turns for row in models)
    mfu = any(row.best_mfu_inst is not None for row in models)
    header = ["agent", "knowledge", "language", "tasks", "variants", "trajectories", "turns"]
    header += [column.header for column in columns]
    if mfu:
        header.append("best MFU^Inst")
    if generation:
        header += ["model", "prompt tokens", "completion tokens", "model s/turn"]
    lines = ["## Per model", "", "| " + " | ".join(header) + " |", "|---" * len(header) + "|"]
    for row in models:
        cells = [row.agent, row.knowledge, row.language]
        cells += map(str, (row.tasks, row.variants, row.trajectories, row.turns))
        cells += [_spread(row.metrics[column.key], column.metric) for column in columns]
        if mfu:
            cells.append(_spread(row.best_mfu_inst or Spread.of([]), "best_mfu"))
        if generation:
            spent = row.generation
            cells += [
                ", ".join(spent.models) or UNDEFINED,
                *(
                    UNDEFINED if tokens is None else f"{tokens:,}"
                    for tokens in (spent.prompt_tokens, spent.completion_tokens)
                ),
                _number(spent.seconds_per_turn, "seconds"),
            ]
        lines.append("| " + " | ".join(cells) + " |")
    for row in models:
        if not row.reached_gpu:
            lines += [
                "",
                f"{NOTHING_RAN} for {row.label} (compile-only evaluation): "
                "its zeros are not results.",
            ]
    lines += [
        "",
        "One row per agent, knowledge level and action language, over every task and run of "
        "the records (a language's runs are never pooled with another's). Each "
        "metric is computed per prompt variant, pooling that variant's trajectories over all "
        "tasks, then shown as the mean over variants with [min–max] across variants where they "
        "differ. correct: fraction of all turns that are correct. correct^Inst: fraction of all "
        "turns that are correct and executed the target instructions (a turn not profiled never "
        "counts). best speedup: the largest speedup over the library baseline of a correct turn; "
        "best speedup^Inst: of a correct turn that executed the target instructions. "
        "Fast_p^Inst ≤k: fraction of the first k turns of every trajectory that are correct, "
        "executed the target instructions and are faster than p × the baseline "
        f"({UNDEFINED} for a model whose trajectories are shorter than k)."
        + (
            " best MFU^Inst: the largest share of the GPU's dense bf16 peak that a correct turn "
            "executing the target instructions achieved (docs/evaluation.md, speed of light)."
            if mfu
            else ""
        )
        + (
            " prompt tokens, completion tokens: totals over the turns whose records give them; "
            "model s/turn: the mean seconds the model took per turn that records it."
            if generation
            else ""
        ),
        "",
    ]
    return lines


def _language_markdown(rows: Sequence[LanguageRow]) -> list[str]:
    """The languages side by side, where an agent played a task in more than one; nothing
    otherwise."""
    if not rows:
        return []
    mfu = any(row.best_mfu_inst is not None for row in rows)
    header = ["agent", "knowledge", "task", "language", "trajectories", "turns", "correct"]
    header += ["correct^Inst", "best speedup", "best speedup^Inst"]
    header += ["best MFU^Inst"] if mfu else []
    lines = ["## Triton against CUDA", "", "| " + " | ".join(header) + " |"]
    lines.append("|---" * len(header) + "|")
    for row in rows:
        values = [
            (row.correct, "turn_correctness"),
            (row.correct_inst, "turn_correctness"),
            (row.best_speedup, "best_speedup"),
            (row.best_speedup_inst, "best_speedup"),
            *([(row.best_mfu_inst, "best_mfu")] if mfu else []),
        ]
        cells = [row.agent, row.knowledge, row.task_id, row.language]
        cells += [str(row.trajectories), str(row.turns)]
        cells += [_number(value, metric) for value, metric in values]
        lines.append("| " + " | ".join(cells) + " |")
    for row in rows:
        if not row.reached_gpu:
            lines += [
                "",
                f"{NOTHING_RAN} for {row.agent} ({row.knowledge}) on {row.task_id} in "
                f"{row.language} (compile-only evaluation): its zeros are not results.",
            ]
    lines += [
        "",
        "For every agent, knowledge level and task recorded in more than one action language, "
        "one row per language, over every turn of that language's trajectories (prompt variants "
        "and runs pooled). correct: fraction of the turns that are correct; correct^Inst: that "
        "are correct and executed the target instructions. best speedup: the largest speedup "
        "over the library baseline of a correct turn; best speedup^Inst: of a correct turn that "
        "executed the target instructions."
        + (
            " best MFU^Inst: the largest share of the GPU's dense bf16 peak that such a turn "
            f"achieved ({UNDEFINED} where none was measured)."
            if mfu
            else ""
        )
        + f" {UNDEFINED}: undefined (no turn counts).",
        "",
    ]
    return lines


def _markdown(
    runs: Sequence[RecordedRun],
    table: Sequence[Row],
    ps: Sequence[float],
    models: Sequence[ModelRow],
    categories: Sequence[CategoryRow],
    languages: Sequence[LanguageRow],
) -> str:
    cells = {
        (row.run, row.knowledge, row.language, row.task_id, row.metric, row.p, row.limit): row
        for row in table
    }
    lines = ["# ptxgym report", "", *_model_markdown(runs, models, ps)]
    lines += _language_markdown(languages)
    for run in runs:
        limits = turn_limits(run.longest)
        variants = sorted({v for task in run.tasks.values() for v in task})
        trajectories = [t for task in run.tasks.values() for v in task.values() for t in v.values()]
        statuses = Counter(record.status for t in trajectories for record in t.values())
        # A CUDA run keeps its plain name: the language is said where it is not the default.
        heading = run.name if run.language == DEFAULT_LANGUAGE else f"{run.name} ({run.language})"
        lines += [
            f"## {heading}",
            "",
            f"Agent {', '.join(sorted(run.agents))}, knowledge {run.knowledge}, "
            f"language {run.language}: "
            f"{counted(len(run.tasks), 'task')} × "
            f"{counted(len(variants), 'prompt variant')} ({', '.join(map(str, variants))}), "
            f"{counted(len(trajectories), 'trajectory', 'trajectories')} of up to "
            f"{counted(run.longest, 'turn')}. Statuses: "
            + ", ".join(f"{status} {n}" for status, n in statuses.most_common())
            + ".",
            "",
            *(line for fact in measured(run) for line in (fact, "")),
        ]
        task_columns = [
            (metric, p, k) for metric, p in metric_columns(ps, mfu=run.measured_mfu) for k in limits
        ]
        lines.append("| task | " + " | ".join(_header(*column) for column in task_columns) + " |")
        lines.append("|---" * (len(task_columns) + 1) + "|")
        for task_id in run.tasks:
            row_cells = []
            for metric, p, k in task_columns:
                row = cells[(run.name, run.knowledge, run.language, task_id, metric, p, k)]
                row_cells.append(
                    f"{_spread(row.inst, metric)} ({_spread(row.unrestricted, metric)})"
                )
            lines.append(f"| {task_id} | " + " | ".join(row_cells) + " |")
        lines.append("")
        run_key = (run.name, run.knowledge, run.language)
        lines += _category_markdown(
            [row for row in categories if (row.run, row.knowledge, row.language) == run_key], ps
        )
    lines += [
        "Each cell: the target-instruction value, then the unrestricted value in parentheses; "
        "each is the mean over prompt variants, with [min–max] across variants where they "
        "differ. ≤k: the first k turns of every trajectory. correct: fraction of turns that are "
        "correct. best speedup: the largest speedup over the library baseline of a correct turn. "
        + (
            "best MFU (for a run whose turns were timed on a GPU with known peaks): the largest "
            "share of the GPU's dense bf16 peak that a correct turn achieved. "
            if any(run.measured_mfu for run in runs)
            else ""
        )
        + "Fast_p: fraction of turns that are correct and faster than p × the baseline. The "
        "target-instruction value also requires that the turn executed the target instructions "
        f"(a turn not profiled never counts). {UNDEFINED}: undefined (no turn counts).",
        "",
    ]
    return "\n".join(lines)
