"""``ptxgym list`` and ``ptxgym prompt``: the registered tasks, and a task's first observation."""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Sequence
from typing import Any

from ptxgym.cli.common import add_language_option, print_json, sorted_tasks
from ptxgym.prompt import PROMPT_VARIANTS, build_prompt
from ptxgym.tasks import CATEGORIES, Task, get_task, registry
from ptxgym.tasks.packs import KNOWLEDGE_LEVELS


def add_commands(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    listing = commands.add_parser("list", help="list the registered tasks")
    listing.add_argument(
        "--gpu",
        metavar="NAME",
        help="only tasks that run on this GPU, in any case (an H200 runs the H100 tasks)",
    )
    listing.add_argument(
        "--category",
        nargs="?",
        const="",
        metavar="NAME",
        help="only tasks of this category; without NAME, the categories and their task counts",
    )
    listing.add_argument("--json", action="store_true", help="machine-readable output")
    listing.set_defaults(handler=_list)

    prompt = commands.add_parser("prompt", help="print a task's first observation")
    prompt.add_argument("task_id", metavar="ID")
    prompt.add_argument("--variant", type=int, choices=PROMPT_VARIANTS, default=0)
    prompt.add_argument("--knowledge", choices=KNOWLEDGE_LEVELS, default="full")
    add_language_option(prompt)
    prompt.set_defaults(handler=_prompt)


def _task_gpu_names(task: Task) -> set[str]:
    """The GPUs that run ``task``: its own, and those its target's ``devices`` text names
    (an H200 runs the H100 tasks)."""
    return {task.gpu, *re.findall(r"\b[A-Z]+\d+[A-Z]*\b", task.target.devices)}


def _gpu_names() -> list[str]:
    return sorted({name for task in registry().values() for name in _task_gpu_names(task)})


def _list(args: argparse.Namespace) -> int:
    gpu = None if args.gpu is None else args.gpu.strip().upper()
    if gpu is not None and gpu not in _gpu_names():
        raise ValueError(f"--gpu {args.gpu}: not a known GPU; one of {', '.join(_gpu_names())}")
    tasks = [t for t in sorted_tasks() if gpu is None or gpu in _task_gpu_names(t)]
    if args.category == "":
        return _list_categories(tasks, as_json=args.json)
    if args.category is not None:
        if args.category not in CATEGORIES:
            raise ValueError(f"--category {args.category}: one of {', '.join(CATEGORIES)}")
        tasks = [t for t in tasks if t.category == args.category]
    if args.json:
        print_json([_task_summary(t) for t in tasks])
        return 0
    width = max((len(t.id) for t in tasks), default=2)
    print(f"{'id':<{width}}  {'arch':<8} {'category':<14} {'workloads':>9}  baseline")
    for task in tasks:
        print(
            f"{task.id:<{width}}  {task.arch:<8} {task.category:<14} {len(task.workloads):>9}  "
            f"{task.callables.baseline}"
        )
    print(f"\n{len(tasks)} tasks")
    return 0


def _list_categories(tasks: Sequence[Task], *, as_json: bool) -> int:
    """Each category (in the documented order) with its tasks and performance tasks counted."""
    counts = {
        name: [t for t in tasks if t.category == name]
        for name in CATEGORIES
        if any(t.category == name for t in tasks)
    }
    if as_json:
        print_json(
            {
                name: {
                    "tasks": len(members),
                    "performance": sum(not t.instructions_required for t in members),
                }
                for name, members in counts.items()
            }
        )
        return 0
    print(f"{'category':<14} {'tasks':>5} {'performance':>11}")
    for name, members in counts.items():
        performance = sum(not t.instructions_required for t in members)
        print(f"{name:<14} {len(members):>5} {performance:>11}")
    print(f"\n{len(counts)} categories, {len(tasks)} tasks")
    return 0


def _task_summary(task: Task) -> dict[str, Any]:
    return {
        "id": task.id,
        "op": task.op,
        "category": task.category,
        "kind": task.kind,
        "gpu": task.gpu,
        "arch": task.arch,
        "workloads": [w.name for w in task.workloads],
        "entry_point": task.entry_point.signature,
        "baseline": task.callables.baseline,
        "baseline_kind": task.callables.baseline_kind,
        "baseline_name": task.callables.baseline_name,
        # A performance task requires none: listing its target's would mislead.
        "instruction_families": {
            key: family.name for key, family in task.target.instruction_families.items()
        }
        if task.instructions_required
        else {},
        "turns": task.turns,
    }


def _prompt(args: argparse.Namespace) -> int:
    prompt = build_prompt(
        get_task(args.task_id),
        variant=args.variant,
        knowledge=args.knowledge,
        language=args.language,
    )
    print(prompt.text, end="")
    tokens = prompt.tokens()
    summary = ", ".join(f"{name} {count:,}" for name, count in tokens.items())
    print(f"\n[ptxgym] ≈{sum(tokens.values()):,} tokens (characters/4): {summary}", file=sys.stderr)
    return 0
