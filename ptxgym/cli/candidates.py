"""``ptxgym compile``, ``ptxgym eval`` and ``ptxgym baseline``: one candidate file checked and
built, or run and timed on the local GPU, and the library's latency it is timed against."""

from __future__ import annotations

import argparse
from pathlib import Path

from ptxgym.cli.common import (
    UnavailableError,
    add_judge_options,
    add_language_option,
    judge_settings,
    print_json,
)
from ptxgym.evaluate.compile_only import CompileOnlyEvaluator
from ptxgym.evaluate.evaluator import Evaluator
from ptxgym.feedback import render_feedback
from ptxgym.languages import DEFAULT_LANGUAGE, get_language, read_action
from ptxgym.outcome import Outcome, Status
from ptxgym.tasks import Task, get_task


def add_commands(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    for name, help_text, handler in (
        ("compile", "check and build a candidate for a task (no GPU needed)", _compile),
        ("eval", "check, build, run and time a candidate on the local GPU", _eval),
    ):
        command = commands.add_parser(name, help=help_text)
        command.add_argument("task_id", metavar="ID")
        command.add_argument("file", metavar="FILE", type=Path, help="kernel source or model reply")
        command.add_argument("--json", action="store_true", help="print the outcome as JSON")
        add_language_option(command)
        command.set_defaults(handler=handler)
        if name == "eval":
            add_judge_options(command)

    baseline = commands.add_parser(
        "baseline", help="the library baseline's latency per workload on the local GPU"
    )
    baseline.add_argument("task_id", metavar="ID")
    baseline.add_argument("--json", action="store_true", help="machine-readable output")
    baseline.set_defaults(handler=_baseline)


def evaluate_file(task: Task, path: Path, evaluator: Evaluator) -> Outcome:
    """Extract the candidate in ``path`` (in the evaluator's language) and evaluate it."""
    language = get_language(getattr(evaluator, "language", DEFAULT_LANGUAGE))
    extraction = language.extract(read_action(path))
    if extraction.source is None:
        message = extraction.error or "no source"
        return Outcome(task.id, Status.FORMAT_ERROR, message, evaluator="none")
    return evaluator.evaluate(task, extraction.source)


def _compile(args: argparse.Namespace) -> int:
    evaluator = CompileOnlyEvaluator(language=args.language)
    return _report_candidate(args, evaluator, success=Status.COMPILED)


def _eval(args: argparse.Namespace) -> int:
    from ptxgym.evaluate.errors import EvaluatorError
    from ptxgym.evaluate.local_gpu import LocalGPUEvaluator

    evaluator = LocalGPUEvaluator(settings=judge_settings(args), language=args.language)
    try:
        return _report_candidate(args, evaluator, success=Status.PASSED)
    except EvaluatorError as exc:
        raise UnavailableError(str(exc)) from exc


def _report_candidate(args: argparse.Namespace, evaluator: Evaluator, success: Status) -> int:
    """Evaluate FILE for ID and print the feedback (or JSON); exit 0 on ``success``."""
    task = get_task(args.task_id)
    if not args.file.is_file():
        raise FileNotFoundError(f"{args.file}: no such file")
    outcome = evaluate_file(task, args.file, evaluator)
    if args.json:
        print_json(outcome.to_dict())
    else:
        print(render_feedback(outcome, task))
    return 0 if outcome.status is success else 1


def _baseline(args: argparse.Namespace) -> int:
    from ptxgym.evaluate.errors import EvaluatorError
    from ptxgym.evaluate.local_gpu import LocalGPUEvaluator

    task = get_task(args.task_id)
    evaluator = LocalGPUEvaluator()
    try:
        latencies = evaluator.baseline(task)
        info = evaluator.device_info()
    except EvaluatorError as exc:
        raise UnavailableError(str(exc)) from exc
    if args.json:
        print_json(
            {
                "task": task.id,
                "baseline": task.callables.baseline,
                "device": info,
                "latency_ms": latencies,
            }
        )
        return 0
    print(
        f"{task.id}: {task.callables.baseline} on {info['name']} ({info['timing_method']} timing)"
    )
    for workload, latency in latencies.items():
        print(f"  {workload}: {latency:.4f} ms")
    return 0
