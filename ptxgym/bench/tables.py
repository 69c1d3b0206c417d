"""The rows of the report's per-model and per-problem tables, computed from recorded runs
(``ptxgym.bench.runs``); ``ptxgym.bench.report`` writes them as Markdown, CSV and JSON.

``model_rows(runs, ps)`` gives the per-model table: one row per agent, knowledge level and action
language, over every task and run of the records (PTXBench's table of models). ``rows(runs, ps)``
gives the per-problem table, which groups records by run (name, knowledge level and language),
with the rows of each task (one per metric and turn limit). A Triton run and a CUDA run are never
pooled. Each metric is computed per prompt variant over that variant's trajectories (pooled over
all tasks for a model), then given as the mean over variants with the min–max across them, both
for the target instructions and unrestricted. Each run also says what was measured whatever ran
(``measured``): how many turns were built, and which target instructions their SASS holds.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ptxgym.bench.runs import (
    NOTHING_RAN,
    RecordedModel,
    RecordedRun,
    Spread,
    by_model,
    label_of,
)
from ptxgym.outcome import Status
from ptxgym.records.metrics import (
    TURN_LIMITS,
    Summary,
    summarize,
)
from ptxgym.records.turns import TurnRecord, best_mfu
from ptxgym.tasks import get_task


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


def _family_names(task_id: str) -> dict[str, str]:
    """The task's target-instruction families by key (``compute`` → ``wgmma``); the bare keys
    for a task that is not registered here."""
    try:
        families = get_task(task_id).target.instruction_families
    except KeyError:
        return {}
    return {key: family.name for key, family in families.items()}


def counted(n: int, one: str, many: str | None = None) -> str:
    """``n`` with its noun, plural unless one: ``counted(2, "turn")`` is ``2 turns``."""
    return f"{n} {one if n == 1 else many or one + 's'}"


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
        f"Built: {len(built)} of {counted(len(records), 'turn')} "
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
            f"{counted(trials, 'trial')} per workload."
        )
    elif timed_with:
        each = "; ".join(
            f"{warmup}+{timed} calls × {trials} in {counted(n, 'turn')}"
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


def metric_columns(ps: Sequence[float], *, mfu: bool) -> list[tuple[str, float | None]]:
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
            for metric, p in metric_columns(ps, mfu=run.measured_mfu):
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
