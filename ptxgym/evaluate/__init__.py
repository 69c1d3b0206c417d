"""Evaluation: a candidate source in, an :class:`~ptxgym.outcome.Outcome` out.

``evaluator`` holds the :class:`Evaluator` protocol and ``make_evaluator``, ``errors`` the
``EvaluatorError`` an evaluator raises for its own failures; ``build_step`` the
policy-and-build stage every evaluator starts with; ``compile_only`` and ``local_gpu`` are the
evaluators of one machine, and ``ray_pool`` spreads both over a Ray cluster (its actors in
``ray_actors``, its connection to the cluster in ``ray_connection``, pools started and found by
name in ``ray_served``). Behind ``local_gpu``: the ``judge`` (set by ``judge_settings``, in its own
process, ``judge_server``, taking requests and answering as ``judge_messages`` says, verdicts in
``verdict_json``) keeps each workload's ``workload_state``, runs the candidate in a confined
``worker`` (a process it starts and ends through ``worker_process``) and takes its messages in a
``conversation`` under the exact ``worker_protocol``, compares the outputs with the references
(``reference_checks``, by ``correctness``), with ``timing`` and ``baselines`` comes to a
``verdict``, and starts the tool runs (``tool_runs``: ``sanitizer``, and ``count`` or
``profile``, each a ``single_call`` of the candidate; ``count_audit`` checks a share of the
counts against a profile). A Triton candidate's kernels are compiled first, by a confined
``compile_run``.

The names below are imported on first use, so importing one module of this package never pulls
in the judge (and torch) by way of this file.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "Evaluator": "ptxgym.evaluate.evaluator",
    "EVALUATORS": "ptxgym.evaluate.evaluator",
    "EvaluatorError": "ptxgym.evaluate.errors",
    "make_evaluator": "ptxgym.evaluate.evaluator",
    "CompileOnlyEvaluator": "ptxgym.evaluate.compile_only",
    "build_candidate": "ptxgym.evaluate.build_step",
    "LocalGPUEvaluator": "ptxgym.evaluate.local_gpu",
    "incompatibility": "ptxgym.evaluate.local_gpu",
    "JudgeSettings": "ptxgym.evaluate.judge_settings",
    "RayEvaluator": "ptxgym.evaluate.ray_pool",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
