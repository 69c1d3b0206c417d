"""Evaluators: take a task and a candidate source, return an :class:`Outcome`.

An evaluator is the trust boundary: it applies the static policy before anything compiles the
source (``ptxgym.evaluate.build_step``). ``compile-only`` builds and inspects without running;
``gpu`` also runs, checks and times the candidate on the local GPU. Evaluators are chosen by
name (``make_evaluator``) or passed as objects that follow :class:`Evaluator`.
"""

from __future__ import annotations

import warnings
from typing import Protocol, runtime_checkable

from ptxgym.evaluate.compile_only import CompileOnlyEvaluator
from ptxgym.outcome import Outcome
from ptxgym.tasks import Task


@runtime_checkable
class Evaluator(Protocol):
    """Turns a candidate source into an outcome. ``close`` frees workers and GPU state."""

    name: str

    def evaluate(self, task: Task, source: str) -> Outcome: ...

    def close(self) -> None: ...


EVALUATORS = ("auto", "gpu", "compile-only")


def make_evaluator(spec: str | Evaluator, task: Task) -> Evaluator:
    """An evaluator from its name, or ``spec`` itself when it already is one.

    ``gpu`` runs candidates on the local GPU (``ptxgym.evaluate.local_gpu``, imported only
    then: it brings the judge); ``auto`` is ``gpu`` when a GPU of the task's architecture is
    visible and ``compile-only`` otherwise, with a warning that says why. ``ray://HOST:PORT``
    (or ``ray://auto``), with an optional ``/POOL``, is a client of a pool served on a Ray
    cluster (``ptxgym.evaluate.ray_pool``, which imports Ray only then).
    """
    if isinstance(spec, Evaluator):
        return spec
    if spec.startswith("ray://"):
        from ptxgym.evaluate.ray_pool import RayEvaluator

        return RayEvaluator.from_spec(spec)
    if spec == "compile-only":
        return CompileOnlyEvaluator()
    if spec in ("auto", "gpu"):
        from ptxgym.evaluate import local_gpu

        if spec == "gpu":
            return local_gpu.LocalGPUEvaluator()
        reason = local_gpu.incompatibility(task)
        if reason is None:
            return local_gpu.LocalGPUEvaluator()
        warnings.warn(f"{reason}: evaluating compile-only", stacklevel=3)
        return CompileOnlyEvaluator()
    raise ValueError(
        f"unknown evaluator {spec!r}; choose one of {EVALUATORS}, ray://HOST:PORT[/POOL], or "
        "pass an object"
    )
