"""Trajectory records → the per-model and per-problem tables (Markdown, CSV, JSON) and the Fast_p
plot (``ptxgym.bench.plots``).

``report(paths)`` reads the JSONL files that ``ptxgym run`` writes (``ptxgym.bench.runs.load``).
The per-model table has one row per agent, knowledge level and action language, over every task
and run of the records (PTXBench's table of models); the per-problem table groups records by run
(name, knowledge level and language), with one row per task. A Triton run and a CUDA run are
never pooled; where one agent played a task in both languages, ``ptxgym.bench.languages`` sets
them side by side. Each metric is computed per prompt variant over that variant's trajectories
(pooled over all tasks for a model), then shown as the mean over variants with the min–max
across them; in the per-problem table the target-instruction value comes first and the
unrestricted value follows in parentheses. Each run also says what was measured whatever ran: how
many turns were built, and which target instructions their SASS holds; when no turn reached a GPU,
the table and the plot say that their zeros were not measured. Each run's tasks are then grouped by
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
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Literal

from ptxgym.bench.categories import CategoryRow, category_rows
from ptxgym.bench.languages import LanguageRow, language_rows
from ptxgym.bench.plots import plot_fast_p
from ptxgym.bench.runs import (
    NOTHING_RAN,
    RecordedModel,
    RecordedRun,
    Spread,
    by_model,
    label_of,
    load,
)
from ptxgym.languages import DEFAULT_LANGUAGE
from ptxgym.outcome import Status
from ptxgym.records.metrics import (
    TURN_LIMITS,
    Summary,
    summarize,
)
from ptxgym.records.transitions import EVENTS
from ptxgym.records.turns import TurnRecord, best_mfu
from ptxgym.tasks import get_task

Format = Literal["md", "csv", "json"]
FORMATS: tuple[Format, ...] = ("md", "csv", "json")
CsvTable = Literal["tasks", "models", "categories", "languages"]
CSV_TABLES: tuple[CsvTable, ...] = ("tasks", "models", "categories", "languages")
UNDEFINED = "–"


@dataclass(frozen=True)
class Row:
    """One task × metric × turn limit of one run; ``p`` only for Fast_p."""

    run: str
    knowledge: str
    language: str
    task_id: str
    metric: str
    p: float | None
    limit: int
    variants: int
    inst: Spread
    unrestricted: Spread

    def flat(self) -> dict[str, Any]:
        """The row as one flat mapping (CSV and JSON share it)."""
        data: dict[str, Any] = {
            "run": self.run,
            "knowledge": self.knowledge,
            "language": self.language,
            "task_id": self.task_id,
            "metric": self.metric,
            "p": self.p,
            "limit": self.limit,
            "variants": self.variants,
        }
        for side, spread in (("inst", self.inst), ("unrestricted", self.unrestricted)):
            data |= {
                f"{side}_mean": spread.mean,
                f"{side}_min": spread.low,
                f"{side}_max": spread.high,
                f"{side}_n": spread.n,
            }
        return data


def _amount(generation: dict[str, Any], key: str) -> float | None:
    value = generation.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return value


@dataclass(frozen=True)
class Generation:
    """What an agent's model spent, from the records' ``generation`` (empty for scripted agents):
    ``turns`` is how many records have one; the rest is ``None`` where no record gives it."""

    turns: int
    models: tuple[str, ...]
    prompt_tokens: int | None
    completion_tokens: int | None
    seconds_per_turn: float | None

    @classmethod
    def of(cls, records: Sequence[TurnRecord]) -> Generation:
        generations = [record.generation for record in records if record.generation]

        def total(key: str) -> int | None:
            values = [_amount(g, key) for g in generations]
            defined = [int(value) for value in values if value is not None]
            return sum(defined) if defined else None

        seconds = [s for s in (_amount(g, "seconds") for g in generations) if s is not None]
        return cls(
            turns=len(generations),
            models=tuple(sorted({str(g["model"]) for g in generations if g.get("model")})),
            prompt_tokens=total("prompt_tokens"),
            completion_tokens=total("completion_tokens"),
            seconds_per_turn=sum(seconds) / len(seconds) if seconds else None,
        )


@dataclass(frozen=True)
class ModelColumn:
    """A metric column of the per-model table: its key in CSV and JSON, its Markdown header, and
    the per-problem metric whose number format it shares."""

    key: str
    header: str
    metric: str


def model_limits(runs: Sequence[RecordedRun]) -> list[int]:
    """The paper's ≤1/≤4/≤8 limits that the longest trajectory of the records reaches."""
    longest = max(run.longest for run in runs)
    return [k for k in TURN_LIMITS if k <= longest]


def _fast_key(p: float, k: int) -> str:
    return f"fast_inst_p{p:g}_k{k}"


def model_columns(ps: Sequence[float], limits: Sequence[int]) -> list[ModelColumn]:
    return [
        ModelColumn("correct", "correct", "turn_correctness"),
        ModelColumn("correct_inst", "correct^Inst", "turn_correctness"),
        ModelColumn("best_speedup", "best speedup", "best_speedup"),
        ModelColumn("best_speedup_inst", "best speedup^Inst", "best_speedup"),
        *(
            ModelColumn(_fast_key(p, k), f"Fast_{p:g}^Inst ≤{k}", "fast_p")
            for p in ps
            for k in limits
        ),
    ]


def _model_values(
    summary: Summary, longest: int, ps: Sequence[float], limits: Sequence[int]
) -> dict[str, float | None]:
    """One variant's value of each per-model column. Correctness and best speedup are over every
    turn; Fast_p^Inst ≤k is undefined for a model whose trajectories are shorter than k."""
    correct_inst, correct = summary.turn_correctness[longest]
    best_inst, best = summary.best_speedup[longest]
    values = {
        "correct": correct,
        "correct_inst": correct_inst,
        "best_speedup": best,
        "best_speedup_inst": best_inst,
    }
    for p in ps:
        for k in limits:
            values[_fast_key(p, k)] = summary.fast[p][k][0] if k <= longest else None
    return values


@dataclass(frozen=True)
class ModelRow:
    """One agent at one knowledge level in one action language over all tasks: each metric
    column across variants."""

    agent: str
    knowledge: str
    language: str
    tasks: int
    variants: int
    trajectories: int
    turns: int
    metrics: dict[str, Spread]  # by ModelColumn.key
    generation: Generation
    reached_gpu: bool  # whether any of its turns ran on a GPU (else its zeros are not results)
    # Best MFU among the correct turns with the target instructions, across variants; None when
    # no record has a speed-of-light measurement (nothing was timed on a listed GPU).
    best_mfu_inst: Spread | None = None

    @property
    def label(self) -> str:
        return label_of(self.agent, self.knowledge, self.language)

    def flat(self) -> dict[str, Any]:
        """The row as one flat mapping (CSV and JSON share it)."""
        data: dict[str, Any] = {
            "agent": self.agent,
            "knowledge": self.knowledge,
            "language": self.language,
            "model": ", ".join(self.generation.models) or None,
            "tasks": self.tasks,
            "variants": self.variants,
            "trajectories": self.trajectories,
            "turns": self.turns,
            "reached_gpu": self.reached_gpu,
        }
        for key, spread in self.metrics.items():
            data |= spread.columns(key) | {f"{key}_n": spread.n}
        return data | {
            "best_mfu_inst": None if self.best_mfu_inst is None else self.best_mfu_inst.mean,
            "best_mfu_inst_min": None if self.best_mfu_inst is None else self.best_mfu_inst.low,
            "best_mfu_inst_max": None if self.best_mfu_inst is None else self.best_mfu_inst.high,
            "generated_turns": self.generation.turns,
            "prompt_tokens": self.generation.prompt_tokens,
            "completion_tokens": self.generation.completion_tokens,
            "model_seconds_per_turn": self.generation.seconds_per_turn,
        }


def model_rows(runs: Sequence[RecordedRun], ps: Sequence[float]) -> list[ModelRow]:
    """One row per agent and knowledge level, each metric aggregated over prompt variants, each
    variant pooling its trajectories over every task."""
    limits = model_limits(runs)
    columns = model_columns(ps, limits)
    table = []
    for model in by_model(runs):
        longest = model.longest
        values = [
            _model_values(
                summarize(model.trajectories(variant), limits=[*limits, longest], ps=ps),
                longest,
                ps,
                limits,
            )
            for variant in sorted(model.variants)
        ]
        records = model.records()
        table.append(
            ModelRow(
                agent=model.agent,
                knowledge=model.knowledge,
                language=model.language,
                tasks=len({task_id for _, task_id, _ in _keys(model)}),
                variants=len(model.variants),
                trajectories=len(_keys(model)),
                turns=len(records),
                metrics={
                    column.key: Spread.of([value[column.key] for value in values])
                    for column in columns
                },
                generation=Generation.of(records),
                reached_gpu=any(record.reached_gpu for record in records),
                best_mfu_inst=_best_mfu(model) if any(r.mfu is not None for r in records) else None,
            )
        )
    return table


def _best_mfu(model: RecordedModel) -> Spread:
    """Per prompt variant, the best MFU of a correct turn that executed the target
    instructions; across variants."""
    return Spread.of(
        [
            best_mfu(
                (record for turns in trajectories.values() for record in turns.values()),
                inst=True,
            )
            for trajectories in model.variants.values()
        ]
    )


def _keys(model: RecordedModel) -> list[tuple[str, str, int]]:
    return [key for trajectories in model.variants.values() for key in trajectories]


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


def _family_names(task_id: str) -> dict[str, str]:
    """The task's target-instruction families by key (``compute`` → ``wgmma``); the bare keys
    for a task that is not registered here."""
    try:
        families = get_task(task_id).target.instruction_families
    except KeyError:
        return {}
    return {key: family.name for key, family in families.items()}


def measured(run: RecordedRun) -> list[str]:
    """What a run measured without running anything: builds, and target instructions in SASS."""
    records = run.records()
    built = [record for record in records if Status(record.status).compiled]
    present: Counter[str] = Counter()
    inspected: Counter[str] = Counter()
    for record in built:
        sass = (record.outcome.get("compile") or {}).get("sass") or {}
        if sass.get("error") is not None:
            continue
        names = _family_names(record.task_id)
        for key, found in (sass.get("families_present") or {}).items():
            name = names.get(key, key)
            inspected[name] += 1
            present[name] += bool(found)
    lines = [
        f"Built: {len(built)} of {_count(len(records), 'turn')} "
        f"({len(built) / len(records):.0%})."
        + (
            " Target instructions in the SASS of built turns (static): "
            + ", ".join(f"{name} in {present[name]} of {n}" for name, n in inspected.items())
            + "."
            if inspected
            else ""
        )
    ]
    if not run.reached_gpu:
        lines.append(
            f"{NOTHING_RAN} (compile-only evaluation), so correctness, speed and the target "
            "instructions' execution were not measured: the zeros below are not results."
        )
    timed_with = protocols(records)
    if len(timed_with) == 1:
        ((warmup, timed, trials),) = timed_with
        lines.append(
            f"Timed with {warmup} warm-up and {timed} timed calls per trial, "
            f"{_count(trials, 'trial')} per workload."
        )
    elif timed_with:
        each = "; ".join(
            f"{warmup}+{timed} calls × {trials} in {_count(n, 'turn')}"
            for (warmup, timed, trials), n in sorted(timed_with.items())
        )
        lines.append(
            f"Timed with different protocols (warm-up + timed calls × trials: {each}): "
            "their speedups are not comparable."
        )
    return lines


def protocols(records: Sequence[TurnRecord]) -> Counter[tuple[int, int, int]]:
    """The timing protocols (warm-up calls and timed calls per trial, trials) of the timed turns
    among ``records``, with how many turns each timed; turns recorded before the outcome said
    which protocol timed it are left out."""
    found: Counter[tuple[int, int, int]] = Counter()
    for record in records:
        for timing in record.outcome.get("timings") or []:
            if timing.get("timed_calls"):
                trials = len(timing.get("trial_medians_ms") or [])
                found[(int(timing.get("warmup_calls", 0)), int(timing["timed_calls"]), trials)] += 1
                break
    return found


def turn_limits(longest: int) -> list[int]:
    """The paper's ≤1/≤4/≤8 limits, cut to the run's length (a 2-turn run shows ≤1 and ≤2)."""
    return sorted({k for k in TURN_LIMITS if k <= longest} | {min(longest, max(TURN_LIMITS))})


def _columns(ps: Sequence[float], *, mfu: bool) -> list[tuple[str, float | None]]:
    """The per-problem metrics; best MFU only for a run that measured one (a column of dashes
    would say nothing)."""
    return [
        ("turn_correctness", None),
        ("best_speedup", None),
        *([("best_mfu", None)] if mfu else []),
        *(("fast_p", p) for p in ps),
    ]


def _pair(
    summary: Summary, records: Sequence[Sequence[TurnRecord]], metric: str, p: float | None, k: int
) -> tuple[float | None, float | None]:
    """One variant's (target-instruction, unrestricted) value of a metric over the first ``k``
    turns: from its summary, or for best MFU (which the summary does not know) from its
    trajectories' records."""
    if metric == "turn_correctness":
        return summary.turn_correctness[k]
    if metric == "best_speedup":
        return summary.best_speedup[k]
    if metric == "best_mfu":
        first = [record for trajectory in records for record in trajectory[:k]]
        return best_mfu(first, inst=True), best_mfu(first, inst=False)
    assert p is not None
    return summary.fast[p][k]


def rows(runs: Sequence[RecordedRun], ps: Sequence[float]) -> list[Row]:
    """Every task × metric × limit of every run, aggregated over prompt variants."""
    table: list[Row] = []
    for run in runs:
        limits = turn_limits(run.longest)
        for task_id, variants in run.tasks.items():
            summaries = [
                summarize(run.trajectories(task_id, variant), limits=limits, ps=ps)
                for variant in sorted(variants)
            ]
            records = [run.turn_records(task_id, variant) for variant in sorted(variants)]
            for metric, p in _columns(ps, mfu=run.measured_mfu):
                for k in limits:
                    pairs = [
                        _pair(summary, trajectories, metric, p, k)
                        for summary, trajectories in zip(summaries, records, strict=True)
                    ]
                    table.append(
                        Row(
                            run=run.name,
                            knowledge=run.knowledge,
                            language=run.language,
                            task_id=task_id,
                            metric=metric,
                            p=p,
                            limit=k,
                            variants=len(pairs),
                            inst=Spread.of([inst for inst, _ in pairs]),
                            unrestricted=Spread.of([plain for _, plain in pairs]),
                        )
                    )
    return table


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


def _count(n: int, one: str, many: str | None = None) -> str:
    return f"{n} {one if n == 1 else many or one + 's'}"


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
            f"{_count(len(run.tasks), 'task')} × "
            f"{_count(len(variants), 'prompt variant')} ({', '.join(map(str, variants))}), "
            f"{_count(len(trajectories), 'trajectory', 'trajectories')} of up to "
            f"{_count(run.longest, 'turn')}. Statuses: "
            + ", ".join(f"{status} {n}" for status, n in statuses.most_common())
            + ".",
            "",
            *(line for fact in measured(run) for line in (fact, "")),
        ]
        columns = [
            (metric, p, k) for metric, p in _columns(ps, mfu=run.measured_mfu) for k in limits
        ]
        lines.append("| task | " + " | ".join(_header(*column) for column in columns) + " |")
        lines.append("|---" * (len(columns) + 1) + "|")
        for task_id in run.tasks:
            row_cells = []
            for metric, p, k in columns:
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
