"""The ``ptxgym`` command line: list tasks, show prompts, compile candidates, run the demo."""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from ptxgym import paths
from ptxgym.evaluator import CompileOnlyEvaluator
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

    compile_ = commands.add_parser(
        "compile", help="check and build a candidate for a task (no GPU needed)"
    )
    compile_.add_argument("task_id", metavar="ID")
    compile_.add_argument("file", metavar="FILE", type=Path, help="CUDA source or model reply")
    compile_.add_argument("--json", action="store_true", help="print the outcome as JSON")
    compile_.set_defaults(handler=_compile)

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
    task = get_task(args.task_id)
    if not args.file.is_file():
        raise FileNotFoundError(f"{args.file}: no such file")
    outcome = compile_file(task, args.file)
    if args.json:
        print(json.dumps(outcome.to_dict(), indent=2))
    else:
        print(render_feedback(outcome, task))
    return 0 if outcome.status is Status.COMPILED else 1


def compile_file(task: Task, path: Path) -> Outcome:
    """Extract, check and build the candidate in ``path`` without running it."""
    text = _read_action(path)
    extraction = extract_source(text) if text is not None else None
    if extraction is None or extraction.source is None:
        message = extraction.error if extraction else f"{path.name} is not UTF-8 text"
        return Outcome(task.id, Status.FORMAT_ERROR, message or "no source", evaluator="none")
    return CompileOnlyEvaluator().evaluate(task, extraction.source)


def gpu_available() -> bool:
    """An NVIDIA GPU answers ``nvidia-smi -L``."""
    if not shutil.which("nvidia-smi"):
        return False
    result = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, check=False)
    return result.returncode == 0 and "GPU" in result.stdout


def _demo(args: argparse.Namespace) -> int:
    manifest = paths.examples_dir() / "manifest.yaml"
    entries = yaml.safe_load(manifest.read_text(encoding="utf-8"))["examples"]
    has_gpu = gpu_available()
    print("ptxgym demo: the example kernels through the real pipeline")
    if has_gpu:
        print(
            "An NVIDIA GPU is present, but this version evaluates compile-only: correctness, "
            "timing and profiling on the GPU are not implemented yet."
        )
    else:
        print(
            "No NVIDIA GPU found: every kernel is checked, compiled and inspected; "
            "correctness, timing and the instruction profile need a GPU."
        )
    print()
    rows = []
    for entry in entries:
        source = paths.examples_dir() / entry["file"]
        for task_id in entry["tasks"]:
            task = get_task(task_id)
            outcome = compile_file(task, source)
            build = outcome.compile
            kernels = build.kernels if build else ()
            rows.append(
                (
                    task_id,
                    entry["file"],
                    outcome.status.value,
                    f"{build.seconds:.1f}s{' (cached)' if build.cached else ''}" if build else "-",
                    ", ".join(f"{k.registers} regs" for k in kernels) or "-",
                )
            )
    headers = ("task", "example", "status", "build", "kernels")
    widths = [max(len(str(r[i])) for r in [headers, *rows]) for i in range(len(headers))]
    for row in [headers, *rows]:
        print("  ".join(str(cell).ljust(width) for cell, width in zip(row, widths, strict=True)))
    failed = [r for r in rows if r[2] != Status.COMPILED.value]
    print(f"\n{len(rows) - len(failed)}/{len(rows)} example builds compiled.")
    return 1 if failed else 0
