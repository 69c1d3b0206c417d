"""What several commands share: how a command says it cannot work on this machine, JSON output,
the task order, and the options that choose the action language, the evaluator and what the GPU
judge runs."""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING

from ptxgym.evaluate.evaluator import EVALUATORS, Evaluator
from ptxgym.languages import DEFAULT_LANGUAGE, LANGUAGES
from ptxgym.tasks import Task, registry

if TYPE_CHECKING:
    from ptxgym.evaluate.judge_settings import JudgeSettings

EVALUATOR_HELP = (
    "auto (the local GPU when it matches the task, else compile-only), gpu, compile-only, or a "
    "pool served on a Ray cluster (ptxgym serve): ray://HOST:PORT[/POOL] through Ray Client, "
    "ray://auto[/POOL] from a node of the cluster"
)


class UnavailableError(Exception):
    """A command cannot do its work on this machine (no matching GPU, a missing tool)."""


def print_json(value: object) -> None:
    print(json.dumps(value, indent=2))


def sorted_tasks() -> list[Task]:
    """Every task, H100 first, then by family: the order of ``list`` and of ``run --tasks all``."""
    return sorted(registry().values(), key=lambda t: (t.gpu != "H100", t.family, t.id))


def evaluator_spec(text: str) -> str:
    """An evaluator's name, or a served Ray pool (``ray://HOST:PORT[/POOL]``, ``ray://auto``)."""
    if text in EVALUATORS:
        return text
    from ptxgym.evaluate.ray_served import parse_spec

    try:
        parse_spec(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{exc}; or one of {', '.join(EVALUATORS)}") from None
    return text


def evaluator(spec: str) -> str | Evaluator:
    """A name as it is (each task resolves it), or the client of the served Ray pool it names,
    shared by every task of the run (the caller closes it)."""
    if spec in EVALUATORS:
        return spec
    from ptxgym.evaluate.errors import EvaluatorError
    from ptxgym.evaluate.ray_pool import RayEvaluator

    try:
        return RayEvaluator.from_spec(spec)
    except (EvaluatorError, ImportError, ConnectionError) as exc:
        raise UnavailableError(f"{spec}: {exc}") from exc


def add_language_option(command: argparse.ArgumentParser) -> None:
    """``--language``: the action language a candidate is written in (``prompt``, ``compile``,
    ``eval``, ``run``)."""
    command.add_argument(
        "--language",
        choices=list(LANGUAGES),
        default=DEFAULT_LANGUAGE,
        help="the action language (docs/triton.md)",
    )


def add_judge_options(command: argparse._ActionsContainer) -> None:
    """What the GPU judge runs beyond correctness and timing, and how (``eval``, ``serve``)."""
    command.add_argument(
        "--no-memcheck", action="store_true", help="skip compute-sanitizer memcheck"
    )
    command.add_argument(
        "--racecheck",
        action="store_true",
        help="also run compute-sanitizer racecheck (shared-memory races)",
    )
    command.add_argument("--no-profile", action="store_true", help="skip the instruction profile")
    command.add_argument(
        "--profile-details",
        action="store_true",
        help="the profile also measures throughput and occupancy (slower; ncu only)",
    )
    command.add_argument(
        "--timing",
        choices=("cupti", "host-sync"),
        default="cupti",
        help="device time through CUPTI (the default; refused where CUPTI is missing), "
        "or the host's wall clock to a device synchronisation",
    )
    command.add_argument(
        "--profile-method",
        choices=("ncu", "cupti"),
        default="cupti",  # JudgeSettings.profile_method (the judge is imported only when used)
        help="count executed instructions with Nsight Compute or CUPTI's SASS metrics",
    )


def judge_settings(args: argparse.Namespace) -> JudgeSettings:
    """The settings ``add_judge_options`` asked for."""
    from ptxgym.evaluate.judge_settings import JudgeSettings

    return JudgeSettings(
        memcheck=not args.no_memcheck,
        racecheck=args.racecheck,
        profile=not args.no_profile,
        profile_details=args.profile_details,
        profile_method=args.profile_method,
        timing_method=args.timing,
    )
