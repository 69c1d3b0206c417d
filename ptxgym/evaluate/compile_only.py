"""The evaluator for machines without a GPU: policy check, build and static inspection; nothing
runs (status ``COMPILED``). For CPU machines, CI and data checks."""

from __future__ import annotations

import time
from dataclasses import replace

from ptxgym.build.result import DEFAULT_COMPILE_TIMEOUT_S
from ptxgym.evaluate.build_step import build_candidate
from ptxgym.languages import DEFAULT_LANGUAGE, get_language
from ptxgym.languages.base import ENTRY_C_ABI
from ptxgym.outcome import Outcome, Status
from ptxgym.tasks import Task


class CompileOnlyEvaluator:
    """Policy check, build and static inspection; nothing runs. Needs no GPU. ``language``: the
    action language of the sources it is given (``ptxgym.languages``)."""

    name = "compile-only"

    def __init__(
        self,
        *,
        compile_timeout_s: float = DEFAULT_COMPILE_TIMEOUT_S,
        language: str = DEFAULT_LANGUAGE,
    ) -> None:
        self.compile_timeout_s = compile_timeout_s
        self.language = language
        get_language(language)  # an unknown language fails here, not at the first step

    def evaluate(self, task: Task, source: str) -> Outcome:
        started = time.perf_counter()
        stopped, build = build_candidate(
            task, source, self.compile_timeout_s, get_language(self.language)
        )
        if stopped is not None:
            return replace(stopped, evaluator=self.name)
        return Outcome(
            task_id=task.id,
            status=Status.COMPILED,
            message=(
                f"compiled for {task.target.arch}; not run (compile-only evaluator)"
                if get_language(self.language).entry == ENTRY_C_ABI
                else "checked and byte-compiled; its kernels are compiled for "
                f"{task.target.arch} only on a GPU host; not run (compile-only evaluator)"
            ),
            evaluator=self.name,
            compile=build,
            seconds=time.perf_counter() - started,
        )

    def close(self) -> None:
        """Nothing to release: builds live in the on-disk cache."""
