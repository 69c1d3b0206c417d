"""Evaluators: take a task and a candidate source, return an :class:`Outcome`.

An evaluator is the trust boundary: it applies the static policy before anything compiles the
source. ``compile-only`` builds and inspects without running (status ``COMPILED``): for CPU
machines, CI and data checks. Evaluators are chosen by name (``make_evaluator``) or passed as
objects that follow :class:`Evaluator`.
"""

from __future__ import annotations

import time
from typing import Protocol, runtime_checkable

from ptxgym.compiler import DEFAULT_TIMEOUT_S, compile_source
from ptxgym.outcome import Outcome, Status
from ptxgym.policy import check_policy
from ptxgym.tasks import Task


@runtime_checkable
class Evaluator(Protocol):
    """Turns a candidate source into an outcome. ``close`` frees workers and GPU state."""

    name: str

    def evaluate(self, task: Task, source: str) -> Outcome: ...

    def close(self) -> None: ...


class CompileOnlyEvaluator:
    """Policy check, nvcc build and static inspection; nothing runs. Needs no GPU."""

    name = "compile-only"

    def __init__(self, *, compile_timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        self.compile_timeout_s = compile_timeout_s

    def evaluate(self, task: Task, source: str) -> Outcome:
        started = time.perf_counter()
        policy = check_policy(source, task)
        if not policy.ok:
            return Outcome(
                task_id=task.id,
                status=Status.POLICY_VIOLATION,
                message="the source breaks the rules:\n"
                + "\n".join(f"- {violation}" for violation in policy.violations),
                evaluator=self.name,
                seconds=time.perf_counter() - started,
            )
        build = compile_source(source, task, timeout_s=self.compile_timeout_s)
        if not build.ok:
            message = "compile timed out" if build.timed_out else "compilation failed"
            status = Status.COMPILE_ERROR
        else:
            status = Status.COMPILED
            message = f"compiled for {task.target.arch}; not run (compile-only evaluator)"
        return Outcome(
            task_id=task.id,
            status=status,
            message=message,
            evaluator=self.name,
            compile=build,
            seconds=time.perf_counter() - started,
        )

    def close(self) -> None:
        """Nothing to release: builds live in the on-disk cache."""


EVALUATORS = ("auto", "compile-only")


def make_evaluator(spec: str | Evaluator) -> Evaluator:
    """An evaluator from its name, or ``spec`` itself when it already is one.

    ``auto`` picks the best evaluator this machine supports; no GPU evaluator ships in this
    version, so it is ``compile-only`` everywhere.
    """
    if isinstance(spec, Evaluator):
        return spec
    if spec in ("auto", "compile-only"):
        return CompileOnlyEvaluator()
    raise ValueError(f"unknown evaluator {spec!r}; choose one of {EVALUATORS} or pass an object")
