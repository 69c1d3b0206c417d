"""The ``ptxgym`` command line: list tasks, show prompts, compile candidates, run the demo."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from ptxgym import paths
from ptxgym.evaluator import CompileOnlyEvaluator, Evaluator
from ptxgym.extract import extract_source
from ptxgym.feedback import render_feedback
from ptxgym.outcome import Outcome, Status
from ptxgym.packs import KNOWLEDGE_LEVELS
from ptxgym.prompt import PROMPT_VARIANTS, build_prompt
from ptxgym.tasks import Task, get_task, registry


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        code: int = args.handler(args)
    except (KeyError, ValueError, FileNotFoundError) as exc:
        message = exc.args[0] if isinstance(exc, KeyError) and exc.args else str(exc)
        print(f"ptxgym: error: {message}", file=sys.stderr)
        return 2
    return code


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ptxgym", description="Gymnasium environments for fast GPU kernels with PTX."
    )
    commands = parser.add_subparsers(required=True, metavar="COMMAND")

    listing = commands.add_parser("list", help="list the registered tasks")
    listing.add_argument("--gpu", choices=["H100", "B200"], help="only tasks for this GPU")
    listing.add_argument("--json", action="store_true", help="machine-readable output")
    listing.set_defaults(handler=_list)

    prompt = commands.add_parser("prompt", help="print a task's first observation")
    prompt.add_argument("task_id", metavar="ID")
    prompt.add_argument("--variant", type=int, choices=PROMPT_VARIANTS, default=0)
    prompt.add_argument("--knowledge", choices=KNOWLEDGE_LEVELS, default="full")
    prompt.set_defaults(handler=_prompt)

    for name, help_text, handler in (
        ("compile", "check and build a candidate for a task (no GPU needed)", _compile),
        ("eval", "check, build, run and time a candidate on the local GPU", _eval),
    ):
        command = commands.add_parser(name, help=help_text)
        command.add_argument("task_id", metavar="ID")
        command.add_argument("file", metavar="FILE", type=Path, help="CUDA source or model reply")
        command.add_argument("--json", action="store_true", help="print the outcome as JSON")
        command.set_defaults(handler=handler)

    baseline = commands.add_parser(
        "baseline", help="the library baseline's latency per workload on the local GPU"
    )
    baseline.add_argument("task_id", metavar="ID")
    baseline.add_argument("--json", action="store_true", help="machine-readable output")
    baseline.set_defaults(handler=_baseline)

    demo = commands.add_parser(
        "demo", help="run the example kernels through the real pipeline and report"
    )
    demo.set_defaults(handler=_demo)
    return parser


def _list(args: argparse.Namespace) -> int:
    tasks = [t for t in registry().values() if args.gpu in (None, t.gpu)]
    tasks.sort(key=lambda t: (t.gpu != "H100", t.family, t.id))
    if args.json:
        print(json.dumps([_task_summary(t) for t in tasks], indent=2))
        return 0
    width = max(len(t.id) for t in tasks)
    print(f"{'id':<{width}}  {'arch':<8} {'workloads':>9}  baseline")
    for task in tasks:
        print(
            f"{task.id:<{width}}  {task.arch:<8} {len(task.workloads):>9}  "
            f"{task.callables.baseline}"
        )
    print(f"\n{len(tasks)} tasks")
    return 0


def _task_summary(task: Task) -> dict[str, Any]:
    return {
        "id": task.id,
        "op": task.op,
        "gpu": task.gpu,
        "arch": task.arch,
        "workloads": [w.name for w in task.workloads],
        "entry_point": task.entry_point.signature,
        "baseline": task.callables.baseline,
        "instruction_families": {
            key: family.name for key, family in task.target.instruction_families.items()
        },
        "turns": task.turns,
    }


def _prompt(args: argparse.Namespace) -> int:
    prompt = build_prompt(get_task(args.task_id), variant=args.variant, knowledge=args.knowledge)
    print(prompt.text, end="")
    tokens = prompt.tokens()
    summary = ", ".join(f"{name} {count:,}" for name, count in tokens.items())
    print(f"\n[ptxgym] ≈{sum(tokens.values()):,} tokens (characters/4): {summary}", file=sys.stderr)
    return 0


def _read_action(path: Path) -> str | None:
    """The file as text, or None when it is not UTF-8 (reported as a format error)."""
    try:
        return path.read_bytes().decode("utf-8")
    except UnicodeDecodeError:
        return None


def _compile(args: argparse.Namespace) -> int:
    return _report_candidate(args, CompileOnlyEvaluator(), success=Status.COMPILED)


def evaluate_file(task: Task, path: Path, evaluator: Evaluator) -> Outcome:
    """Extract the candidate in ``path`` and evaluate it."""
    text = _read_action(path)
    extraction = extract_source(text) if text is not None else None
    if extraction is None or extraction.source is None:
        message = extraction.error if extraction else f"{path.name} is not UTF-8 text"
        return Outcome(task.id, Status.FORMAT_ERROR, message or "no source", evaluator="none")
    return evaluator.evaluate(task, extraction.source)


def compile_file(task: Task, path: Path) -> Outcome:
    """Extract, check and build the candidate in ``path`` without running it."""
    return evaluate_file(task, path, CompileOnlyEvaluator())


def _eval(args: argparse.Namespace) -> int:
    from ptxgym.gpu_evaluator import EvaluatorError, LocalGPUEvaluator

    try:
        return _report_candidate(args, LocalGPUEvaluator(), success=Status.PASSED)
    except EvaluatorError as exc:
        print(f"ptxgym: error: {exc}", file=sys.stderr)
        return 2


def _report_candidate(args: argparse.Namespace, evaluator: Evaluator, success: Status) -> int:
    """Evaluate FILE for ID and print the feedback (or JSON); exit 0 on ``success``."""
    task = get_task(args.task_id)
    if not args.file.is_file():
        raise FileNotFoundError(f"{args.file}: no such file")
    outcome = evaluate_file(task, args.file, evaluator)
    if args.json:
        print(json.dumps(outcome.to_dict(), indent=2))
    else:
        print(render_feedback(outcome, task))
    return 0 if outcome.status is success else 1


def _baseline(args: argparse.Namespace) -> int:
    from ptxgym.gpu_evaluator import EvaluatorError, LocalGPUEvaluator

    task = get_task(args.task_id)
    evaluator = LocalGPUEvaluator()
    try:
        latencies = evaluator.baseline(task)
        info = evaluator.device_info()
    except EvaluatorError as exc:
        print(f"ptxgym: error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        report = {
            "task": task.id,
            "baseline": task.callables.baseline,
            "device": info,
            "latency_ms": latencies,
        }
        print(json.dumps(report, indent=2))
        return 0
    print(
        f"{task.id}: {task.callables.baseline} on {info['name']} ({info['timing_method']} timing)"
    )
    for workload, latency in latencies.items():
        print(f"  {workload}: {latency:.4f} ms")
    return 0


def _demo(args: argparse.Namespace) -> int:
    import warnings

    import gymnasium as gym

    manifest = paths.examples_dir() / "manifest.yaml"
    entries = yaml.safe_load(manifest.read_text(encoding="utf-8"))["examples"]
    from ptxgym.gpu_evaluator import visible_gpus

    print("ptxgym demo: the example kernels through the real pipeline (env.step)")
    if visible_gpus():
        print(
            "An NVIDIA GPU is present: tasks of its architecture are checked, built, run, "
            "verified and timed against the library; other tasks are built and inspected."
        )
    else:
        print(
            "No NVIDIA GPU found: every kernel is checked, compiled and inspected; "
            "correctness, timing and the instruction profile need a GPU."
        )
    print()
    rows = []
    for entry in entries:
        source = (paths.examples_dir() / entry["file"]).read_text(encoding="utf-8")
        for task_id in entry["tasks"]:
            env = gym.make(task_id)
            env.reset(seed=0)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                info = env.step(source)[4]
            env.close()
            outcome = info["outcome"]
            speed = (
                f"{outcome['latency_ms']:.3f} / {outcome['baseline_latency_ms']:.3f} ms, "
                f"{outcome['speedup']:.3f}x"
                if outcome["speedup"] is not None
                else "-"
            )
            build = outcome["compile"] or {}
            rows.append(
                (
                    task_id,
                    entry["file"],
                    outcome["evaluator"],
                    info["status"],
                    f"{build.get('seconds', 0):.1f}s",
                    speed,
                )
            )
    headers = ("task", "example", "evaluator", "status", "build", "latency / baseline, speedup")
    widths = [max(len(str(r[i])) for r in [headers, *rows]) for i in range(len(headers))]
    for row in [headers, *rows]:
        print("  ".join(str(cell).ljust(width) for cell, width in zip(row, widths, strict=True)))
    good = {Status.COMPILED.value, Status.PASSED.value}
    failed = [r for r in rows if r[3] not in good]
    print(f"\n{len(rows) - len(failed)}/{len(rows)} example runs succeeded.")
    return 1 if failed else 0
