"""The ``ptxgym`` command line: list tasks, show prompts, compile and evaluate candidates, run
agents over many tasks, report runs, and the demo."""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from ptxgym import paths
from ptxgym.bench import report
from ptxgym.bench.records import TurnRecord, read_records
from ptxgym.bench.report import CSV_TABLES, FORMATS
from ptxgym.build.result import CompilerUnavailable
from ptxgym.evaluate.compile_only import CompileOnlyEvaluator
from ptxgym.evaluate.evaluator import EVALUATORS, Evaluator
from ptxgym.feedback import render_feedback
from ptxgym.languages import DEFAULT_LANGUAGE, LANGUAGES, get_language, read_action
from ptxgym.outcome import Outcome, Status
from ptxgym.prompt import PROMPT_VARIANTS, build_prompt
from ptxgym.tasks import CATEGORIES, Task, get_task, registry
from ptxgym.tasks.packs import KNOWLEDGE_LEVELS

if TYPE_CHECKING:
    from ptxgym.agents.base import Agent
    from ptxgym.evaluate.judge_settings import JudgeSettings


DEMO_CONCURRENCY = 4
"""Examples the demo has under way at once: enough to overlap builds and checks with timings."""

_EVALUATOR_HELP = (
    "auto (the local GPU when it matches the task, else compile-only), gpu, compile-only, or a "
    "pool served on a Ray cluster (ptxgym serve): ray://HOST:PORT[/POOL] through Ray Client, "
    "ray://auto[/POOL] from a node of the cluster"
)


class UnavailableError(Exception):
    """A command cannot do its work on this machine (no matching GPU, a missing tool)."""


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        code: int = args.handler(args)
    except (KeyError, ValueError, FileNotFoundError, CompilerUnavailable, UnavailableError) as exc:
        message = exc.args[0] if isinstance(exc, KeyError) and exc.args else str(exc)
        if isinstance(exc, CompilerUnavailable):
            message += _cuda_home_note()
        if getattr(args, "json", False):
            # A script that asked for JSON parses stdout: it gets the reason there too.
            _print_json({"error": message})
        print(f"ptxgym: error: {message}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        # The reader left (``ptxgym prompt ID | head``): not an error of ours. Output still
        # buffered must not fail again when Python flushes stdout at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + signal.SIGPIPE
    return code


def _print_json(value: object) -> None:
    print(json.dumps(value, indent=2))


def _cuda_home_note() -> str:
    """Why ``$CUDA_HOME`` did not help, when it is set to a folder without the tools."""
    home = os.environ.get("CUDA_HOME")
    if home is None or (Path(home) / "bin" / "nvcc").is_file():
        return ""
    return f" (CUDA_HOME={home} has no bin/nvcc: point it at the toolkit's folder)"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ptxgym", description="Gymnasium environments for fast GPU kernels with PTX."
    )
    commands = parser.add_subparsers(required=True, metavar="COMMAND")

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
    prompt.add_argument(
        "--language",
        choices=list(LANGUAGES),
        default=DEFAULT_LANGUAGE,
        help="the action language (docs/triton.md)",
    )
    prompt.set_defaults(handler=_prompt)

    for name, help_text, handler in (
        ("compile", "check and build a candidate for a task (no GPU needed)", _compile),
        ("eval", "check, build, run and time a candidate on the local GPU", _eval),
    ):
        command = commands.add_parser(name, help=help_text)
        command.add_argument("task_id", metavar="ID")
        command.add_argument("file", metavar="FILE", type=Path, help="kernel source or model reply")
        command.add_argument("--json", action="store_true", help="print the outcome as JSON")
        command.add_argument(
            "--language",
            choices=list(LANGUAGES),
            default=DEFAULT_LANGUAGE,
            help="the action language (docs/triton.md)",
        )
        command.set_defaults(handler=handler)
        if name == "eval":
            _add_judge_options(command)

    baseline = commands.add_parser(
        "baseline", help="the library baseline's latency per workload on the local GPU"
    )
    baseline.add_argument("task_id", metavar="ID")
    baseline.add_argument("--json", action="store_true", help="machine-readable output")
    baseline.set_defaults(handler=_baseline)

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
        type=_evaluator_spec,
        default="auto",
        metavar="EVALUATOR",
        help=_EVALUATOR_HELP,
    )
    runner.add_argument(
        "--language",
        choices=list(LANGUAGES),
        default=DEFAULT_LANGUAGE,
        help="the action language (docs/triton.md)",
    )
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
        type=_evaluator_spec,
        default="auto",
        metavar="EVALUATOR",
        help=_EVALUATOR_HELP,
    )
    fixing.add_argument("--concurrency", type=int, default=1, metavar="C")
    fixing.add_argument("--limit", type=int, metavar="N", help="at most N failures this time")
    fixing.add_argument("--out", required=True, type=Path, metavar="FIXIT.jsonl")
    fixing.set_defaults(handler=_fixit)

    serving = commands.add_parser(
        "serve",
        help="serve build and judge actors on a Ray cluster, for `run --evaluator ray://...` "
        "(needs ptxgym[ray])",
    )
    serving.add_argument(
        "--address",
        default="auto",
        help="the Ray cluster: auto (the one this machine is a node of; the default) or "
        "ray://HOST:PORT",
    )
    serving.add_argument(
        "--name", default=None, metavar="POOL", help="the pool's name (default: ptxgym)"
    )
    action = serving.add_mutually_exclusive_group()
    action.add_argument("--status", action="store_true", help="list the pool's actors")
    action.add_argument("--stop", action="store_true", help="end the pool")
    shape = serving.add_argument_group("the pool to start")
    shape.add_argument(
        "--judge",
        choices=("gpu", "compile-only"),
        default="gpu",
        help="gpu: one judge per GPU (the default); compile-only: no GPU, builds are inspected",
    )
    shape.add_argument("--gpus", type=int, metavar="N", help="GPU judges (default: every GPU)")
    shape.add_argument(
        "--arch",
        action="append",
        metavar="SM",
        help="compile-only: a judge serving this generation (sm_90, sm_100); repeat for more "
        "(default: one each)",
    )
    shape.add_argument("--builders", type=int, metavar="N", help="default: one per node")
    shape.add_argument(
        "--builds-per-builder", type=int, metavar="N", help="builds one builder runs at once"
    )
    shape.add_argument(
        "--max-in-flight", type=int, metavar="N", help="requests one judge holds at once"
    )
    _add_judge_options(serving.add_argument_group("what GPU judges run (as for eval)"))
    serving.set_defaults(handler=_serve)

    demo = commands.add_parser(
        "demo", help="run the example kernels through the real pipeline and report"
    )
    demo.add_argument(
        "--out",
        type=Path,
        default=Path("ptxgym-demo"),
        metavar="DIR",
        help="where the records, report and plot go (default: ptxgym-demo/)",
    )
    demo.add_argument(
        "--concurrency",
        type=int,
        default=DEMO_CONCURRENCY,
        metavar="N",
        help=f"examples under way at once (default: {DEMO_CONCURRENCY}); timings still take "
        "turns on the GPU, so the speedups do not depend on it",
    )
    demo.set_defaults(handler=_demo)
    return parser


def _add_judge_options(command: argparse._ActionsContainer) -> None:
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


def _judge_settings(args: argparse.Namespace) -> JudgeSettings:
    from ptxgym.evaluate.judge_settings import JudgeSettings

    return JudgeSettings(
        memcheck=not args.no_memcheck,
        racecheck=args.racecheck,
        profile=not args.no_profile,
        profile_details=args.profile_details,
        profile_method=args.profile_method,
        timing_method=args.timing,
    )


def _evaluator_spec(text: str) -> str:
    """An evaluator's name, or a served Ray pool (``ray://HOST:PORT[/POOL]``, ``ray://auto``)."""
    if text in EVALUATORS:
        return text
    from ptxgym.evaluate.ray_pool import parse_spec

    try:
        parse_spec(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{exc}; or one of {', '.join(EVALUATORS)}") from None
    return text


def _evaluator(spec: str) -> str | Evaluator:
    """A name as it is (each task resolves it), or the client of the served Ray pool it names,
    shared by every task of the run (the caller closes it)."""
    if spec in EVALUATORS:
        return spec
    from ptxgym.evaluate.local_gpu import EvaluatorError
    from ptxgym.evaluate.ray_pool import RayEvaluator

    try:
        return RayEvaluator.from_spec(spec)
    except (EvaluatorError, ImportError, ConnectionError) as exc:
        raise UnavailableError(f"{spec}: {exc}") from exc


def _sorted_tasks() -> list[Task]:
    """Every task, H100 first, then by family: the order of ``list`` and of ``run --tasks all``."""
    return sorted(registry().values(), key=lambda t: (t.gpu != "H100", t.family, t.id))


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
    tasks = [t for t in _sorted_tasks() if gpu is None or gpu in _task_gpu_names(t)]
    if args.category == "":
        return _list_categories(tasks, as_json=args.json)
    if args.category is not None:
        if args.category not in CATEGORIES:
            raise ValueError(f"--category {args.category}: one of {', '.join(CATEGORIES)}")
        tasks = [t for t in tasks if t.category == args.category]
    if args.json:
        _print_json([_task_summary(t) for t in tasks])
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
        _print_json(
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


def _compile(args: argparse.Namespace) -> int:
    evaluator = CompileOnlyEvaluator(language=args.language)
    return _report_candidate(args, evaluator, success=Status.COMPILED)


def evaluate_file(task: Task, path: Path, evaluator: Evaluator) -> Outcome:
    """Extract the candidate in ``path`` (in the evaluator's language) and evaluate it."""
    language = get_language(getattr(evaluator, "language", DEFAULT_LANGUAGE))
    extraction = language.extract(read_action(path))
    if extraction.source is None:
        message = extraction.error or "no source"
        return Outcome(task.id, Status.FORMAT_ERROR, message, evaluator="none")
    return evaluator.evaluate(task, extraction.source)


def compile_file(task: Task, path: Path) -> Outcome:
    """Extract, check and build the candidate in ``path`` without running it."""
    return evaluate_file(task, path, CompileOnlyEvaluator())


def _eval(args: argparse.Namespace) -> int:
    from ptxgym.evaluate.local_gpu import EvaluatorError, LocalGPUEvaluator

    evaluator = LocalGPUEvaluator(settings=_judge_settings(args), language=args.language)
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
        _print_json(outcome.to_dict())
    else:
        print(render_feedback(outcome, task))
    return 0 if outcome.status is success else 1


def _baseline(args: argparse.Namespace) -> int:
    from ptxgym.evaluate.local_gpu import EvaluatorError, LocalGPUEvaluator

    task = get_task(args.task_id)
    evaluator = LocalGPUEvaluator()
    try:
        latencies = evaluator.baseline(task)
        info = evaluator.device_info()
    except EvaluatorError as exc:
        raise UnavailableError(str(exc)) from exc
    if args.json:
        report = {
            "task": task.id,
            "baseline": task.callables.baseline,
            "device": info,
            "latency_ms": latencies,
        }
        _print_json(report)
        return 0
    print(
        f"{task.id}: {task.callables.baseline} on {info['name']} ({info['timing_method']} timing)"
    )
    for workload, latency in latencies.items():
        print(f"  {workload}: {latency:.4f} ms")
    return 0


def _run(args: argparse.Namespace) -> int:
    from ptxgym.agents.base import AgentError
    from ptxgym.bench.runner import RunPlan, run

    if args.tasks.strip() == "all":
        tasks = tuple(task.id for task in _sorted_tasks())
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
    evaluator = _evaluator(args.evaluator)
    plans = [
        RunPlan(
            name=args.name or args.out.stem,
            tasks=tasks,
            variants=variants,
            trajectories=args.trajectories,
            turns=args.turns,
            knowledge=level,
            evaluator=evaluator,
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
        if not isinstance(evaluator, str):
            evaluator.close()
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
    evaluator = _evaluator(args.evaluator)
    try:
        stats = fixit(
            args.runs,
            teacher,
            evaluator,
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
        if not isinstance(evaluator, str):
            evaluator.close()
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


def _serve(args: argparse.Namespace) -> int:
    """Start (or list, or end) a named pool on a Ray cluster, and say how to reach it."""
    from ptxgym.evaluate import ray_pool
    from ptxgym.evaluate.local_gpu import EvaluatorError
    from ptxgym.evaluate.ray_actors import PoolError

    name = args.name or ray_pool.DEFAULT_POOL
    try:
        with ray_pool.connected(args.address) as ray:
            if args.stop:
                count = ray_pool.stop_pool(name)
                print(f"Pool {name!r} ended ({count} actors).")
                return 0
            if args.status:
                members = ray_pool.pool_members(name)
            else:
                spec = ray_pool.plan_pool(
                    judge=args.judge,
                    arches=args.arch,
                    gpus=args.gpus,
                    builders=args.builders,
                    builds_per_builder=args.builds_per_builder,
                    max_in_flight=args.max_in_flight,
                    settings=_judge_settings(args) if args.judge == "gpu" else None,
                )
                members = ray_pool.serve_pool(name, spec)
            client = _client_address(args.address, ray)
    except (EvaluatorError, PoolError, ImportError, ConnectionError) as exc:
        raise UnavailableError(str(exc)) from exc
    print(f"Pool {name!r} on the Ray cluster ({len(members)} actors):")
    for member in members:
        print(f"  {member.describe()}")
    pool = "" if name == ray_pool.DEFAULT_POOL else f"/{name}"
    print(
        f"It runs until `ptxgym serve --stop{'' if not pool else ' --name ' + name}` or the "
        "cluster ends. Reach it:\n"
        f"  ptxgym run --evaluator {client}{pool} ...\n"
        f"  RayEvaluator(address={client!r}, pool={name!r})   # ptxgym.evaluate.ray_pool\n"
        f"  gym.make(ID, evaluator={client + pool!r})\n"
        f"From a node of the cluster, ray://auto{pool} reaches it without Ray Client."
    )
    return 0


def _client_address(address: str, ray: Any) -> str:
    """How a client off the cluster reaches it: Ray Client on the head node (port 10001 unless
    `ray start --ray-client-server-port` said otherwise)."""
    if address.startswith("ray://"):
        return address
    head = str(ray.get_runtime_context().gcs_address).rpartition(":")[0]
    return f"ray://{head}:10001"


def _report(args: argparse.Namespace) -> int:
    text = report.report(
        args.runs, fmt=args.format, ps=args.p, plot=args.plot, csv_table=args.csv_table
    )
    print(text, end="")
    if args.plot is not None:
        print(f"Plot: {args.plot}", file=sys.stderr)
    return 0


def _demo(args: argparse.Namespace) -> int:
    import warnings
    from concurrent.futures import ThreadPoolExecutor

    from ptxgym.agents.scripted import ScriptedAgent
    from ptxgym.bench.runner import RunPlan, run
    from ptxgym.device.gpus import visible_gpus

    if args.concurrency < 1:
        raise ValueError(f"--concurrency must be at least 1, not {args.concurrency}")
    manifest = paths.examples_dir() / "manifest.yaml"
    entries = yaml.safe_load(manifest.read_text(encoding="utf-8"))["examples"]
    print("ptxgym demo: the example kernels through the real pipeline (ptxgym run)")
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
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    records = out / "demo.jsonl"
    # The demo evaluates afresh each time (builds are cached): a resumed demo would show nothing.
    records.unlink(missing_ok=True)

    def play(entry: dict[str, Any]) -> list[TurnRecord]:
        """One run per example, named by its file (two examples for the same task must not
        resume each other); its records, in its tasks' order."""
        plan = RunPlan(
            name=entry["file"],
            tasks=tuple(entry["tasks"]),
            variants=(0,),
            trajectories=1,
            turns=1,
            language=entry.get("language", DEFAULT_LANGUAGE),  # examples/manifest.yaml
        )
        run(plan, ScriptedAgent([paths.examples_dir() / entry["file"]]), records, progress=False)
        mine = {r.task_id: r for r in read_records(records) if r.run == entry["file"]}
        return [mine[task_id] for task_id in entry["tasks"]]

    rows: list[TurnRecord] = []
    # Columns as wide as the longest example file and task id, so the status lines align.
    file_width = max(len(entry["file"]) for entry in entries)
    task_width = max(len(task_id) for entry in entries for task_id in entry["tasks"])
    # The examples run at once (every run's evaluator is the process's one judge of the GPU,
    # which gives each timing the GPU alone); their lines print in the manifest's order.
    with (
        warnings.catch_warnings(),
        ThreadPoolExecutor(max_workers=args.concurrency, thread_name_prefix="demo") as pool,
    ):
        # "auto" warns for each task it cannot run on this GPU; the header already said so.
        warnings.simplefilter("ignore")
        for new in pool.map(play, entries):
            for record in new:
                build = record.outcome.get("compile") or {}
                speed = (
                    f", {record.speedup:.3f}x the baseline" if record.speedup is not None else ""
                )
                print(
                    f"{record.run:<{file_width}} {record.task_id:<{task_width}} "
                    f"{record.evaluator:<13} {record.status:<20} "
                    f"build {build.get('seconds', 0):.1f} s{speed}",
                    flush=True,
                )
            rows += new
    table = report.report([records], plot=out / "fastp.png")
    (out / "report.md").write_text(table, encoding="utf-8")
    print()
    print(table, end="")
    print(f"Files: {records}, {out / 'report.md'}, {out / 'fastp.png'}")
    failures = [r for r in rows if r.status not in (Status.COMPILED.value, Status.PASSED.value)]
    print(f"{len(rows) - len(failures)}/{len(rows)} example runs succeeded.")
    return 1 if failures else 0
