"""What one evaluation is made of: each workload's state (its check stages' seeds and references,
the library's latency, the tool runs' inputs), the timed loop's plan, and what the worker is told
of them (never a reference, a baseline, or which timed calls are checked)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ptxgym.evaluate.judge_settings import JudgeSettings
from ptxgym.sandbox import channel
from ptxgym.tasks import Task, WorkloadSpec
from ptxgym.tasks.schema import TensorSpec


@dataclass
class CheckStage:
    """One check of a workload's correctness stage: the inputs' seed (``outliers``: with
    outlying values, ``ptxgym.evaluate.worker.make_inputs``) and the references the judge
    computed from them."""

    name: str
    seed: int
    outliers: bool
    references: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class TimingPlan:
    """One workload's timed loop in one evaluation: call ``i`` runs on inputs made from
    ``seed + i`` (fresh each call, so no output can be cached by pointer or content), and the
    outputs of the timed calls in ``checked`` go to the judge. Only the seed goes to the
    worker: it learns that a call is checked once the call is over."""

    seed: int
    checked: frozenset[int]


@dataclass
class WorkloadState:
    """What the judge keeps of one (task, workload) across evaluations: its check stages, and
    the library's latency timed with the judge's protocol (and by which method)."""

    spec: WorkloadSpec
    stages: list[CheckStage]
    baseline_ms: float
    baseline_method: str
    # The first stage's inputs in host memory, for the tool runs (ptxgym.evaluate.single_call);
    # empty when no tool is on, and for every workload but the task's first.
    tool_inputs: dict[str, Any] = field(default_factory=dict)

    @property
    def nbytes(self) -> int:
        """Memory held by the reference outputs and the tool runs' inputs (the seeds and the
        baseline are small)."""
        held = [tensor for stage in self.stages for tensor in stage.references.values()]
        held += list(self.tool_inputs.values())
        return sum(int(item.nbytes) for item in held if hasattr(item, "nbytes"))


def worker_job(
    task: Task,
    library: str,
    states: list[WorkloadState],
    plans: dict[str, TimingPlan],
    settings: JudgeSettings,
) -> dict[str, Any]:
    """What a worker is told: the task, the library, the timing protocol, and each workload's
    axes and seeds; never a reference, a baseline, or which timed calls are checked."""
    return {
        "task": task.model_dump(mode="json"),
        "library": library,
        "warmup": settings.warmup,
        "iters": settings.iters,
        "trials": settings.trials,
        "workloads": [
            {
                "name": s.spec.name,
                "axes": s.spec.axes,
                "sequences": s.spec.sequences,
                "checks": [
                    {"name": st.name, "seed": st.seed, "outliers": st.outliers} for st in s.stages
                ],
                "timing": {"seed": plans[s.spec.name].seed},
            }
            for s in states
        ],
    }


def output_bytes(task: Task, workload: WorkloadSpec) -> int:
    """Bytes of the task's outputs for ``workload``, as laid out in an arena."""
    return tensor_bytes(task, workload, task.definition.outputs)


def tensor_bytes(task: Task, workload: WorkloadSpec, specs: Mapping[str, TensorSpec]) -> int:
    """Bytes of the tensors ``specs`` for ``workload``, each at an arena's alignment."""
    import torch

    axes = task.axis_values(workload)
    return channel.arena_bytes(
        [
            math.prod(axes[axis] for axis in spec.shape) * getattr(torch, spec.dtype).itemsize
            for spec in specs.values()
        ]
    )
