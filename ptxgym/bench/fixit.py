"""Fixit: failed turns of recorded runs → repairs by a teacher model, verified → SFT records.

``fixit(records, teacher, evaluator, out)`` takes every failed turn of the trajectory records
(``ptxgym run``): a kernel that did not compile, crashed, hung, broke memory, computed wrong
results, or was correct without executing the target instructions. For each it asks the teacher
(an agent whose session gets one user message: the task's prompt, the failed kernel and its
feedback) for a short rationale and a repaired kernel, and evaluates the repair with the same
evaluator as any step. Only a repair that reaches the evaluator's success (``PASSED`` and, for an
unqualified kernel, qualified; ``COMPILED`` on a machine without a GPU) is kept: an SFT record in
chat format, the prompt + failed kernel + feedback as the user's turn, the rationale + repaired
kernel as the assistant's. Records are deduplicated on (task, failed kernel, repaired kernel).

Every attempt, kept or not, is logged beside the output (``<out>.attempts.jsonl``): running the
same command again goes on with the failures not yet attempted, and the statistics (repair rate
per failure category) count them all.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections import Counter
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ptxgym.agents.base import Agent, Reply
from ptxgym.evaluate.evaluator import Evaluator, make_evaluator
from ptxgym.languages import DEFAULT_LANGUAGE, get_language
from ptxgym.outcome import Outcome, Status
from ptxgym.prompt import build_prompt
from ptxgym.records.turns import TurnRecord, append_line, read_lines, read_records
from ptxgym.tasks import get_task

CATEGORIES = {
    "compile": (Status.COMPILE_ERROR, Status.POLICY_VIOLATION),
    "runtime": (Status.RUNTIME_ERROR, Status.TIMEOUT),
    "memory": (Status.MEMORY_ERROR,),
    "incorrect": (Status.INCORRECT_NUMERICAL, Status.INCORRECT_SHAPE, Status.INCORRECT_DTYPE),
}
UNQUALIFIED = "unqualified"
"""Correct, but not executing the target instructions (measured on a GPU only)."""
REQUEST = (
    "{prompt}\n\n## A kernel that failed\n\n```{fence}\n{source}\n```\n\n## Its feedback\n\n"
    "{feedback}\n\n## Your answer\n\nFirst explain in at most three sentences what was wrong. "
    "Then give the complete repaired kernel in one ```{fence} block."
)


@dataclass(frozen=True)
class Failure:
    """A failed turn of a recorded run."""

    record: TurnRecord
    category: str

    @property
    def key(self) -> str:
        """Identifies it across runs of Fixit: the run, the turn, and the failed kernel (a
        CUDA turn's key is what it was before records named their language)."""
        r = self.record
        where = f"{r.run}|{r.task_id}|{r.prompt_variant}|{r.knowledge}|{r.trajectory}|{r.turn}"
        if r.language != DEFAULT_LANGUAGE:
            where += f"|{r.language}"
        return hashlib.sha256(f"{where}|{r.source}".encode()).hexdigest()[:32]


@dataclass(frozen=True)
class Attempt:
    """One failure's repair attempt, as the attempts log holds it."""

    key: str
    category: str
    task_id: str
    verified: bool
    status: str  # the repair's status ("FORMAT_ERROR" when the teacher gave no kernel)
    message: str


def failures(records: Iterable[TurnRecord]) -> list[Failure]:
    """The failed turns with a kernel to repair, in record order."""
    found = []
    for record in records:
        if record.source is None:
            continue  # no kernel (a reply without code): nothing to repair
        category = category_of(record)
        if category is not None:
            found.append(Failure(record, category))
    return found


def category_of(record: TurnRecord) -> str | None:
    """The failure category of a turn, or None for a turn Fixit leaves alone."""
    status = Status(record.status)
    for category, statuses in CATEGORIES.items():
        if status in statuses:
            return category
    if status is Status.PASSED and record.qualified is False:
        return UNQUALIFIED
    return None


def verified(outcome: Outcome, category: str) -> bool:
    """Whether a repair reached the evaluator's success: a correct kernel (qualified where the
    failure was not), or, from an evaluator that runs nothing, a build."""
    if outcome.status is Status.COMPILED:
        return category != UNQUALIFIED  # qualification is only measured on a GPU
    return outcome.status is Status.PASSED and (
        category != UNQUALIFIED or outcome.qualified is True
    )


def fixit(
    records: Sequence[Path],
    teacher: Agent,
    evaluator: str | Evaluator,
    out: Path,
    *,
    concurrency: int = 1,
    limit: int | None = None,
) -> dict[str, Any]:
    """Repair the failed turns of ``records`` with ``teacher``, verify each with ``evaluator``
    (an object, or a name resolved per task as ``ptxgym run`` does: ``auto`` is the GPU
    evaluator for the tasks of the local GPU's architecture, compile-only for the others),
    append the verified ones to ``out``; returns the statistics (``statistics``)."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    log = attempts_path(out)
    done = {attempt.key for attempt in read_attempts(log)}
    kept = {sample["meta"]["dedup"] for sample in _read_jsonl(out)}
    todo = [f for path in records for f in failures(read_records(path)) if f.key not in done]
    todo = todo[:limit] if limit is not None else todo
    writing = threading.Lock()
    # One per task and language: a Triton failure is repaired in Triton and judged as such.
    evaluators = {
        (task_id, language): make_evaluator(evaluator, get_task(task_id), language)
        for task_id, language in dict.fromkeys(
            (failure.record.task_id, failure.record.language) for failure in todo
        )
    }

    def repair(failure: Failure) -> None:
        record = failure.record
        task = get_task(record.task_id)
        language = get_language(record.language)
        prompt = build_prompt(
            task, variant=record.prompt_variant, knowledge=record.knowledge, language=language.name
        )
        request = REQUEST.format(
            prompt=prompt.text.strip(),
            fence=language.fence,
            source=(record.source or "").rstrip(),
            feedback=record.feedback.strip(),
        )
        session = teacher.session()
        reply = Reply.of(
            session.act(request, {"turn": 0, "messages": [{"role": "user", "content": request}]})
        )
        text, generation = reply.text, reply.generation
        extraction = language.extract(text)
        if extraction.source is None:
            attempt = Attempt(
                failure.key,
                failure.category,
                task.id,
                False,
                "FORMAT_ERROR",
                extraction.error or "no kernel",
            )
            sample = None
        else:
            outcome = evaluators[(task.id, language.name)].evaluate(task, extraction.source)
            ok = verified(outcome, failure.category)
            attempt = Attempt(
                failure.key, failure.category, task.id, ok, outcome.status.value, outcome.message
            )
            sample = (
                _sample(failure, request, text, extraction.source, outcome, generation)
                if ok
                else None
            )
        with writing:
            if sample is not None and sample["meta"]["dedup"] not in kept:
                kept.add(sample["meta"]["dedup"])
                _append(out, sample)
            _append(log, asdict(attempt))

    try:
        with ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="fixit") as pool:
            futures = [pool.submit(repair, failure) for failure in todo]
            errors = [error for future in futures if (error := future.exception()) is not None]
    finally:
        for built in {id(e): e for e in evaluators.values() if e is not evaluator}.values():
            built.close()  # built here from a name
    if errors:
        raise errors[0]
    return statistics(out)


def _sample(
    failure: Failure,
    request: str,
    reply: str,
    repaired: str,
    outcome: Outcome,
    generation: dict[str, Any],
) -> dict[str, Any]:
    """The SFT record of a verified repair."""
    record = failure.record
    dedup = hashlib.sha256(
        "\0".join([record.task_id, record.source or "", repaired]).encode()
    ).hexdigest()[:32]
    return {
        "messages": [
            {"role": "user", "content": request},
            {"role": "assistant", "content": reply},
        ],
        "meta": {
            "dedup": dedup,
            "failure": failure.key,
            "category": failure.category,
            "task_id": record.task_id,
            "language": record.language,
            "from": {
                "run": record.run,
                "prompt_variant": record.prompt_variant,
                "knowledge": record.knowledge,
                "trajectory": record.trajectory,
                "turn": record.turn,
                "status": record.status,
            },
            "repair": {
                "status": outcome.status.value,
                "qualified": outcome.qualified,
                "speedup": outcome.speedup,
                "evaluator": outcome.evaluator,
                "source": repaired,
            },
            "teacher": generation.get("model"),
        },
    }


def statistics(out: Path) -> dict[str, Any]:
    """Attempts, verified repairs and the repair rate per failure category, and records kept."""
    attempts = read_attempts(attempts_path(out))
    tried = Counter(a.category for a in attempts)
    repaired = Counter(a.category for a in attempts if a.verified)
    return {
        "attempts": len(attempts),
        "verified": sum(repaired.values()),
        "records": sum(1 for _ in _read_jsonl(out)),
        "per_category": {
            category: {
                "attempts": tried[category],
                "verified": repaired[category],
                "repair_rate": repaired[category] / tried[category],
            }
            for category in sorted(tried)
        },
    }


def attempts_path(out: Path) -> Path:
    return out.with_name(out.name + ".attempts.jsonl")


def read_attempts(path: Path) -> list[Attempt]:
    return [Attempt(**data) for data in _read_jsonl(path)]


def _read_jsonl(path: Path) -> list[Any]:
    return list(read_lines(path)) if path.exists() else []


def _append(path: Path, data: dict[str, Any]) -> None:
    append_line(path, json.dumps(data, sort_keys=True) + "\n")
