"""``ptxgym demo``: every example kernel of ``examples/manifest.yaml`` through the real pipeline
(``ptxgym run`` with the scripted agent), then the report and the Fast_p plot. Without a GPU it
says so and does all that needs none: checks, builds and the SASS inspection."""

from __future__ import annotations

import argparse
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import yaml

from ptxgym import paths
from ptxgym.bench import report
from ptxgym.languages import DEFAULT_LANGUAGE
from ptxgym.outcome import Status
from ptxgym.records.turns import TurnRecord, read_records

DEMO_CONCURRENCY = 4
"""Examples the demo has under way at once: enough to overlap builds and checks with timings."""


def add_commands(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
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


def _demo(args: argparse.Namespace) -> int:
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
