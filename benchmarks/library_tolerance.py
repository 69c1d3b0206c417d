"""How close the library comes to each task's own tolerances: the measurement behind a tolerance.

Run on a GPU host: ``python benchmarks/library_tolerance.py --out DIR [--only TEXT] [--seeds N]``.
For every chosen task (``--only``: a substring of the id), every workload, both correctness
stages (normal inputs, then the outlier stage's) and N seeds, the library baseline's outputs are
checked against the reference by the judge's own check (``check_outputs``, with the tolerance the
stage uses). Prints markdown for docs/benchmarks.md: per task, stage and output, the worst
element's distance as a multiple of its tolerance (max over workloads and seeds; > 1 fails) and
the most mismatched elements in one call; writes every check to OUT/library_tolerance.json.

A tolerance the library itself cannot meet asks more than the task's own yardstick does: this
is the number a task file's ``tolerance`` or ``outlier_tolerance`` is set from, with a margin,
because the judge draws a fresh seed for every evaluation's outlier stage.
"""

from __future__ import annotations

import argparse
import datetime
import json
from pathlib import Path
from typing import Any

from ptxgym.device.gpus import visible_gpus
from ptxgym.evaluate.correctness import check_outputs
from ptxgym.evaluate.local_gpu import incompatibility
from ptxgym.evaluate.worker import make_inputs, resolve_callable
from ptxgym.tasks import Task, registry


def measure(task: Task, seeds: int) -> list[dict[str, Any]]:
    """One row per (workload, stage, seed, output): the library's worst ratio and mismatches."""
    import torch

    rows: list[dict[str, Any]] = []
    baseline = resolve_callable(task.callables.baseline)
    reference = resolve_callable(task.callables.reference)
    for workload in task.workloads:
        payload = {"axes": dict(workload.axes), "sequences": dict(workload.sequences)}
        for outliers in (False, True):
            for seed in range(1, seeds + 1):
                inputs = make_inputs(task, payload, seed, outliers)
                references = reference(inputs, **task.callables.params)
                outputs = baseline(inputs, **task.callables.params)()
                tolerances = {
                    name: task.tolerance_for(name, outliers=outliers).model_dump()
                    for name in task.definition.outputs
                }
                report = check_outputs(
                    task,
                    "outliers" if outliers else "normal",
                    workload.name,
                    task.axis_values(workload),
                    dict(outputs),
                    references,
                    outliers=outliers,
                )
                for check in report.outputs:
                    rows.append(
                        {
                            "task": task.id,
                            "workload": workload.name,
                            "stage": report.stage,
                            "seed": seed,
                            "output": check.name,
                            "ok": check.ok,
                            "worst_ratio": check.worst_ratio,
                            "mismatched": check.mismatched,
                            "tolerance": tolerances[check.name],
                        }
                    )
                del inputs, references, outputs
                torch.cuda.empty_cache()
    return rows


def summary(rows: list[dict[str, Any]]) -> list[str]:
    """Markdown: the worst over workloads and seeds of each (task, stage, output)."""
    lines = [
        "| task | stage | output | tolerance (atol, rtol) | worst ratio | most mismatched "
        "| failed calls |",
        "|---|---|---|---|---|---|---|",
    ]
    keys = dict.fromkeys((row["task"], row["stage"], row["output"]) for row in rows)
    for task_id, stage, output in keys:
        group = [
            row
            for row in rows
            if (row["task"], row["stage"], row["output"]) == (task_id, stage, output)
        ]
        tolerance = group[0]["tolerance"]
        failed = sum(not row["ok"] for row in group)
        lines.append(
            f"| {task_id} | {stage} | {output} | {tolerance['atol']:g}, {tolerance['rtol']:g} "
            f"| {max(row['worst_ratio'] for row in group):.3f} "
            f"| {max(row['mismatched'] for row in group)} | {failed}/{len(group)} |"
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("benchmarks/out"))
    parser.add_argument("--only", help="a substring of the task ids to measure")
    parser.add_argument("--seeds", type=int, default=4, help="input seeds per workload and stage")
    args = parser.parse_args()
    if args.seeds < 1:
        parser.error("--seeds must be at least 1")
    gpus = visible_gpus()
    if not gpus:
        raise SystemExit("library_tolerance.py runs the libraries: it needs a CUDA GPU")
    tasks = [
        task
        for task in sorted(registry().values(), key=lambda task: task.id)
        if (args.only is None or args.only in task.id) and incompatibility(task) is None
    ]
    if not tasks:
        raise SystemExit(f"no task here matches --only {args.only!r}")
    rows = [row for task in tasks for row in measure(task, args.seeds)]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "library_tolerance.json").write_text(json.dumps(rows, indent=1))
    print(f"{datetime.date.today()}, {gpus[0].name}, {args.seeds} seeds per workload and stage")
    print("\n".join(summary(rows)))


if __name__ == "__main__":
    main()
