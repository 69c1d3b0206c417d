"""Evaluators: take a task and a candidate source, return an :class:`Outcome`.

An evaluator is the trust boundary: it applies the static policy before anything compiles the
source. ``compile-only`` builds and inspects without running (status ``COMPILED``): for CPU
machines, CI and data checks. ``gpu`` also runs, checks and times the candidate on the local GPU.
Evaluators are chosen by name (``make_evaluator``) or passed as objects that follow
:class:`Evaluator`.
"""

from __future__ import annotations

import time
import warnings
from dataclasses import replace
from typing import Protocol, runtime_checkable

from ptxgym.compiler import DEFAULT_TIMEOUT_S, CompileResult, compile_source
from ptxgym.outcome import Outcome, Status
from ptxgym.policy import check_policy
from ptxgym.tasks import Task


@runtime_checkable
class Evaluator(Protocol):
    """Turns a candidate source into an outcome. ``close`` frees workers and GPU state."""

    name: str

    def evaluate(self, task: Task, source: str) -> Outcome: ...

    def close(self) -> None: ...


def build_candidate(
    task: Task, source: str, compile_timeout_s: float
) -> tuple[Outcome | None, CompileResult | None]:
    """Policy check and build, shared by every evaluator.

    Returns a final outcome when the candidate stops here, else the successful build.
    """
    started = time.perf_counter()
    policy = check_policy(source, task)
    if not policy.ok:
        outcome = Outcome(
            task_id=task.id,
            status=Status.POLICY_VIOLATION,
            message="the source breaks the rules:\n"
            + "\n".join(f"- {violation}" for violation in policy.violations),
            evaluator="policy",
            seconds=time.perf_counter() - started,
        )
        return outcome, None
    build = compile_source(source, task, timeout_s=compile_timeout_s)
    if build.policy_violation is not None:
        outcome = Outcome(
            task_id=task.id,
            status=Status.POLICY_VIOLATION,
            message=f"the build breaks the rules: {build.policy_violation}",
            evaluator="policy",
            compile=build,
            seconds=time.perf_counter() - started,
        )
        return outcome, build
    if not build.ok:
        message = "compile timed out" if build.timed_out else "compilation failed"
        outcome = Outcome(
            task_id=task.id,
            status=Status.COMPILE_ERROR,
            message=message,
            evaluator="compiler",
            compile=build,
            seconds=time.perf_counter() - started,
        )
        return outcome, build
    return None, build


class CompileOnlyEvaluator:
    """Policy check, nvcc build and static inspection; nothing runs. Needs no GPU."""

    name = "compile-only"

    def __init__(self, *, compile_timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
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


EVALUATORS = ("auto", "gpu", "compile-only")


def make_evaluator(spec: str | Evaluator, task: Task) -> Evaluator:
    """An evaluator from its name, or ``spec`` itself when it already is one.

    ``gpu`` runs candidates on the local GPU (``ptxgym.gpu_evaluator``); ``auto`` is ``gpu`` when
    a GPU of the task's architecture is visible and ``compile-only`` otherwise, with a warning
    that says why.
    """
    if isinstance(spec, Evaluator):
        return spec
    if spec == "compile-only":
        return CompileOnlyEvaluator()
    if spec in ("auto", "gpu"):
        from ptxgym import gpu_evaluator

        if spec == "gpu":
            return gpu_evaluator.LocalGPUEvaluator()
        reason = gpu_evaluator.incompatibility(task)
        if reason is None:
            return gpu_evaluator.LocalGPUEvaluator()
        warnings.warn(f"{reason}: evaluating compile-only", stacklevel=3)
        return CompileOnlyEvaluator()
    raise ValueError(f"unknown evaluator {spec!r}; choose one of {EVALUATORS} or pass an object")
