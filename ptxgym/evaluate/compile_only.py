"""The evaluator for machines without a GPU: policy check, build and static inspection; nothing
runs (status ``COMPILED``). For CPU machines, CI and data checks."""

from __future__ import annotations

import time
from dataclasses import replace

from ptxgym.build.result import DEFAULT_COMPILE_TIMEOUT_S
from ptxgym.evaluate.build_step import build_candidate
from ptxgym.outcome import Outcome, Status
from ptxgym.tasks import Task


class CompileOnlyEvaluator:
    """Policy check, build and static inspection; nothing runs. Needs no GPU."""

    name = "compile-only"

    def __init__(self, *, compile_timeout_s: float = DEFAULT_COMPILE_TIMEOUT_S) -> None:
        self.compile_timeout_s = compile_timeout_s

    def evaluate(self, task: Task, source: str) -> Outcome:
        started = time.perf_counter()
        stopped, build = build_candidate(task, source, self.compile_timeout_s)
        if stopped is not None:
            return replace(stopped, evaluator=self.name)
        return Outcome(
            task_id=task.id,
            status=Status.COMPILED,
            message=f"compiled for {task.target.arch}; not run (compile-only evaluator)",
            evaluator=self.name,
            compile=build,
            seconds=time.perf_counter() - started,
        )

    def close(self) -> None:
        """Nothing to release: builds live in the on-disk cache."""
