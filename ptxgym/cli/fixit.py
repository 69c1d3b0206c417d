"""``ptxgym fixit``: a teacher model repairs the failed turns of recorded runs; each repair is
evaluated, and the verified ones become chat-format SFT records."""

from __future__ import annotations

import argparse
from pathlib import Path

from ptxgym.cli.common import EVALUATOR_HELP, UnavailableError, evaluator, evaluator_spec
from ptxgym.records.turns import read_records


def add_commands(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    fixing = commands.add_parser(
        "fixit",
        help="repair failed turns of recorded runs with a teacher model, verify each repair, "
        "write the verified ones as chat-format SFT records (resumable)",
    )
    fixing.add_argument("runs", nargs="+", type=Path, metavar="RUN.jsonl")
    fixing.add_argument("--teacher-model", required=True, help="the teacher's name at the endpoint")
    fixing.add_argument("--base-url", help="e.g. http://localhost:8000/v1 (default: OpenAI's)")
    fixing.add_argument("--api-key-env", default="OPENAI_API_KEY", metavar="VAR")
    fixing.add_argument("--temperature", type=float)
    fixing.add_argument("--max-tokens", type=int)
    fixing.add_argument("--reasoning-effort")
    fixing.add_argument("--timeout", type=float, default=600.0, metavar="S")
    fixing.add_argument("--max-retries", type=int, default=5)
    fixing.add_argument(
        "--evaluator",
        type=evaluator_spec,
        default="auto",
        metavar="EVALUATOR",
        help=EVALUATOR_HELP,
    )
    fixing.add_argument("--concurrency", type=int, default=1, metavar="C")
    fixing.add_argument("--limit", type=int, metavar="N", help="at most N failures this time")
    fixing.add_argument("--out", required=True, type=Path, metavar="FIXIT.jsonl")
    fixing.set_defaults(handler=_fixit)


def _fixit(args: argparse.Namespace) -> int:
    from ptxgym.agents.base import AgentError
    from ptxgym.agents.openai_chat import ChatSettings, OpenAIAgent
    from ptxgym.bench.fixit import failures, fixit

    found = [failure for path in args.runs for failure in failures(read_records(path))]
    if not found:
        print("No failed turn with a kernel in these records: nothing to repair.")
        return 0
    settings = ChatSettings(
        model=args.teacher_model,
        base_url=args.base_url,
        api_key_env=args.api_key_env,
        temperature=args.temperature,
        max_tokens=args.max_tokens,
        reasoning_effort=args.reasoning_effort,
        timeout_s=args.timeout,
        max_retries=args.max_retries,
    )
    try:
        teacher = OpenAIAgent(settings)
    except AgentError as exc:
        raise UnavailableError(str(exc)) from exc
    chosen = evaluator(args.evaluator)
    try:
        stats = fixit(
            args.runs,
            teacher,
            chosen,
            args.out,
            concurrency=args.concurrency,
            limit=args.limit,
        )
    except AgentError as exc:
        raise UnavailableError(
            f"the teacher stopped: {str(exc).rstrip('.')}. Every finished attempt is logged: run "
            "the same command again to go on"
        ) from exc
    finally:
        teacher.close()
        if not isinstance(chosen, str):
            chosen.close()
    print(
        f"Fixit: {stats['attempts']} attempts, {stats['verified']} verified repairs, "
        f"{stats['records']} records in {args.out}"
    )
    for category, numbers in stats["per_category"].items():
        print(
            f"  {category}: {numbers['verified']}/{numbers['attempts']} repaired "
            f"({numbers['repair_rate']:.0%})"
        )
    return 0
