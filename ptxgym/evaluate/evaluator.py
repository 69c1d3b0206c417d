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
from ptxgym.languages import DEFAULT_LANGUAGE
from ptxgym.outcome import Outcome
from ptxgym.tasks import Task


@runtime_checkable
class Evaluator(Protocol):
    """Turns a candidate source into an outcome. ``close`` frees workers and GPU state."""

    name: str

    def evaluate(self, task: Task, source: str) -> Outcome: ...

    def close(self) -> None: ...


EVALUATORS = ("auto", "gpu", "compile-only")


def make_evaluator(
    spec: str | Evaluator, task: Task, language: str = DEFAULT_LANGUAGE
) -> Evaluator:
    """An evaluator of sources in action ``language`` from its name, or ``spec`` itself when it
    already is one (it must evaluate that language: its ``language`` attribute, CUDA when it has
    none).

    ``gpu`` runs candidates on the local GPU (``ptxgym.evaluate.local_gpu``, imported only
    then: it brings the judge); ``auto`` is ``gpu`` when a GPU of the task's architecture is
    visible and ``compile-only`` otherwise, with a warning that says why. ``ray://HOST:PORT``
    (or ``ray://auto``), with an optional ``/POOL``, is a client of a pool served on a Ray
    cluster (``ptxgym.evaluate.ray_pool``, which imports Ray only then).
    """
    if isinstance(spec, Evaluator):
        return _speaking(spec, language)
    if spec.startswith("ray://"):
        from ptxgym.evaluate.ray_pool import RayEvaluator

        pool = RayEvaluator.from_spec(spec)
        try:
            return _speaking(pool, language)
        except ValueError:
            pool.close()
            raise
    if spec == "compile-only":
        return CompileOnlyEvaluator(language=language)
    if spec in ("auto", "gpu"):
        from ptxgym.evaluate import local_gpu

        if spec == "gpu":
            return local_gpu.LocalGPUEvaluator(language=language)
        reason = local_gpu.incompatibility(task)
        if reason is None:
            return local_gpu.LocalGPUEvaluator(language=language)
        warnings.warn(f"{reason}: evaluating compile-only", stacklevel=3)
        return CompileOnlyEvaluator(language=language)
    raise ValueError(
        f"unknown evaluator {spec!r}; choose one of {EVALUATORS}, ray://HOST:PORT[/POOL], or "
        "pass an object"
    )


def _speaking(evaluator: Evaluator, language: str) -> Evaluator:
    """``evaluator``, checked to evaluate sources in ``language``."""
    spoken = getattr(evaluator, "language", DEFAULT_LANGUAGE)
    if spoken != language:
        raise ValueError(
            f"the evaluator {evaluator.name!r} evaluates {spoken} sources, not {language}: give "
            f"one made for it (e.g. LocalGPUEvaluator(language={language!r}))"
        )
    return evaluator
