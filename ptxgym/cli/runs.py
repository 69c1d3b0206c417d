"""``ptxgym run`` and ``ptxgym report``: an agent over tasks × prompt variants × trajectories with
every turn recorded, and the tables and Fast_p plot of recorded runs."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from ptxgym.bench import report
from ptxgym.bench.report import CSV_TABLES, FORMATS
from ptxgym.cli.common import (
    EVALUATOR_HELP,
    UnavailableError,
    add_language_option,
    evaluator,
    evaluator_spec,
    sorted_tasks,
)
from ptxgym.prompt import PROMPT_VARIANTS
from ptxgym.records.turns import read_records
from ptxgym.tasks.packs import KNOWLEDGE_LEVELS

if TYPE_CHECKING:
    from ptxgym.agents.base import Agent


def add_commands(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    runner = commands.add_parser(
        "run",
        help="run an agent over tasks × prompt variants × trajectories, recording every turn "
        "(resumable)",
    )
    runner.add_argument(
        "--tasks", required=True, metavar="ID[,ID...]|all", help="task ids, or all of them"
    )
    runner.add_argument(
        "--variants",
        default=",".join(map(str, PROMPT_VARIANTS)),
        metavar="N[,N...]",
        help="prompt variants (default: all)",
    )
    runner.add_argument("--trajectories", type=int, default=1, metavar="N", help="per variant")
    runner.add_argument("--turns", type=int, default=8, metavar="T", help="steps per trajectory")
    runner.add_argument(
        "--knowledge",
        default="full",
        metavar="LEVEL[,LEVEL...]",
        help=f"knowledge pack levels ({', '.join(KNOWLEDGE_LEVELS)}); several run the ablation "
        "grid, one plan per level",
    )
    runner.add_argument(
        "--evaluator",
        type=evaluator_spec,
        default="auto",
        metavar="EVALUATOR",
        help=EVALUATOR_HELP,
    )
    add_language_option(runner)
    runner.add_argument("--agent", choices=["scripted", "openai"], default="scripted")
    runner.add_argument(
        "--concurrency",
        type=int,
        default=1,
        metavar="C",
        help="episodes under way at once (a model's replies overlap other episodes' evaluation)",
    )
    runner.add_argument(
        "--files",
        nargs="+",
        type=Path,
        metavar="FILE",
        help="scripted agent: the file to submit at each turn (the last one repeats)",
    )
    chat = runner.add_argument_group("openai agent (any OpenAI-compatible chat endpoint)")
    chat.add_argument("--model", help="the model's name at the endpoint")
    chat.add_argument("--base-url", help="e.g. http://localhost:8000/v1 (default: OpenAI's)")
    chat.add_argument(
        "--api-key-env",
        default="OPENAI_API_KEY",
        metavar="VAR",
        help="the environment variable holding the key (default OPENAI_API_KEY)",
    )
    chat.add_argument("--system", help="a system message before the prompt")
    chat.add_argument("--temperature", type=float)
    chat.add_argument("--top-p", type=float)
    chat.add_argument("--max-tokens", type=int, help="per reply (max_completion_tokens)")
    chat.add_argument("--seed", type=int)
    chat.add_argument("--reasoning-effort", help="passed through (e.g. low, medium, high)")
    chat.add_argument(
        "--context-tokens",
        type=int,
        help="the model's context window: older replies, then older feedback, are cut to fit",
    )
    chat.add_argument("--timeout", type=float, default=600.0, metavar="S", help="per request")
    chat.add_argument(
        "--max-retries",
        type=int,
        default=5,
        help="retries with backoff on rate limits, server errors, timeouts (default 5)",
    )
    chat.add_argument(
        "--extra-body", type=json.loads, default={}, metavar="JSON", help="extra request fields"
    )
    chat.add_argument(
        "--prices",
        type=_prices,
        metavar="IN,OUT",
        help="USD per million prompt and completion tokens, for the run's cost in the summary",
    )
    runner.add_argument(
        "--out", required=True, type=Path, metavar="RUN.jsonl", help="records (appended)"
    )
    runner.add_argument(
        "--name",
        help="the run's name in the records (default: the file's stem); the same name resumes",
    )
    runner.add_argument("--no-progress", action="store_true", help="no progress bar")
    runner.set_defaults(handler=_run)

    reporting = commands.add_parser(
        "report",
        help="the per-model and per-task metrics tables of recorded runs, and the Fast_p plot",
    )
    reporting.add_argument("runs", nargs="+", type=Path, metavar="RUN.jsonl")
    reporting.add_argument("--plot", type=Path, metavar="FILE.png", help="save the Fast_p plot")
    reporting.add_argument("--format", choices=FORMATS, default="md")
    reporting.add_argument(
        "--csv-table",
        choices=CSV_TABLES,
        default="tasks",
        help="the table that --format csv prints, one per CSV (default: tasks)",
    )
    reporting.add_argument(
        "--p",
        type=float,
        nargs="+",
        default=[1.0],
        metavar="P",
        help="speedup thresholds for Fast_p (default: 1.0)",
    )
    reporting.set_defaults(handler=_report)


def _run(args: argparse.Namespace) -> int:
    from ptxgym.agents.base import AgentError
    from ptxgym.bench.runner import RunPlan, run

    if args.tasks.strip() == "all":
        tasks = tuple(task.id for task in sorted_tasks())
    else:
        tasks = tuple(part.strip() for part in args.tasks.split(",") if part.strip())
    try:
        variants = tuple(int(part) for part in args.variants.split(","))
    except ValueError:
        raise ValueError(f"--variants takes numbers such as 0,1,2, not {args.variants!r}") from None
    levels = tuple(part.strip() for part in args.knowledge.split(",") if part.strip())
    try:
        agent = _agent(args)
    except AgentError as exc:
        raise UnavailableError(str(exc)) from exc
    chosen = evaluator(args.evaluator)
    plans = [
        RunPlan(
            name=args.name or args.out.stem,
            tasks=tasks,
            variants=variants,
            trajectories=args.trajectories,
            turns=args.turns,
            knowledge=level,
            evaluator=chosen,
            language=args.language,
        )
        for level in levels
    ]
    try:
        for plan in plans:
            run(plan, agent, args.out, progress=not args.no_progress, concurrency=args.concurrency)
    except KeyboardInterrupt:
        print(
            f"\nptxgym: interrupted; every finished turn is in {args.out}: run the same command "
            "again to resume",
            file=sys.stderr,
        )
        return 130
    except AgentError as exc:
        raise UnavailableError(
            f"the agent stopped: {str(exc).rstrip('.')}. Every finished turn is in {args.out}: "
            "run the same command again to resume"
        ) from exc
    finally:
        close = getattr(agent, "close", None)
        if close is not None:
            close()
        if not isinstance(chosen, str):
            chosen.close()
    print(report.report([args.out]), end="")
    print(f"Records: {args.out} (run {plans[0].name!r}).")
    if summary := _token_summary(args.out, plans[0].name, args.prices):
        print(summary)
    return 0


def _agent(args: argparse.Namespace) -> Agent:
    """The agent the arguments name, checked before anything runs."""
    from ptxgym.agents.openai_chat import ChatSettings, OpenAIAgent
    from ptxgym.agents.scripted import ScriptedAgent

    if args.agent == "scripted":
        if not args.files:
            raise ValueError("the scripted agent needs --files")
        return ScriptedAgent(args.files)
    if not args.model:
        raise ValueError("the openai agent needs --model")
    settings = ChatSettings(
        model=args.model,
        base_url=args.base_url,
        api_key_env=args.api_key_env,
        system=args.system,
        temperature=args.temperature,
        top_p=args.top_p,
        max_tokens=args.max_tokens,
        seed=args.seed,
        reasoning_effort=args.reasoning_effort,
        context_tokens=args.context_tokens,
        timeout_s=args.timeout,
        max_retries=args.max_retries,
        extra_body=args.extra_body,
    )
    return OpenAIAgent(settings)


def _prices(text: str) -> tuple[float, float]:
    """``IN,OUT``: USD per million prompt and completion tokens."""
    try:
        prompt, completion = (float(part) for part in text.split(","))
    except ValueError:
        message = f"--prices takes IN,OUT such as 1.25,10, not {text!r}"
        raise argparse.ArgumentTypeError(message) from None
    return prompt, completion


def _token_summary(out: Path, name: str, prices: tuple[float, float] | None = None) -> str:
    """The model's use over the run's records: requests, tokens, seconds, and the cost at
    ``prices`` (USD per million prompt and completion tokens); "" for agents without a
    model."""
    generated = [r.generation for r in read_records(out) if r.run == name and r.generation]
    if not generated:
        return ""
    prompt = sum(g.get("prompt_tokens") or 0 for g in generated)
    completion = sum(g.get("completion_tokens") or 0 for g in generated)
    seconds = sum(g.get("seconds") or 0.0 for g in generated)
    cost = (
        f", ${(prompt * prices[0] + completion * prices[1]) / 1e6:,.2f} at the prices given"
        if prices is not None
        else ""
    )
    return (
        f"Model use: {len(generated)} replies, {prompt:,} prompt and {completion:,} completion "
        f"tokens, {seconds:.1f} s waiting for replies{cost}."
    )


def _report(args: argparse.Namespace) -> int:
    text = report.report(
        args.runs, fmt=args.format, ps=args.p, plot=args.plot, csv_table=args.csv_table
    )
    print(text, end="")
    if args.plot is not None:
        print(f"Plot: {args.plot}", file=sys.stderr)
    return 0
