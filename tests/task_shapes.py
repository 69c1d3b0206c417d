"""Small workloads of every task, and the check of a baseline's outputs against a reference,
shared by the CPU collection test and its GPU twin (tests/gpu/test_task_collection.py)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ptxgym.evaluate.correctness import check_outputs
from ptxgym.evaluate.worker import resolve_callable
from ptxgym.outcome import CheckReport
from ptxgym.tasks import Task, WorkloadSpec, workload_for

if TYPE_CHECKING:
    import torch

# Small values of every var axis name the task files use, chosen to satisfy their constraints
# (multiples of the quantisation block and of the GroupNorm groups, even pooling sizes, a whole
# top-k) while keeping every reference under a second on CPU.
SMALL_AXES: dict[str, int] = {
    "M": 6,
    "N": 256,
    "K": 40,
    "B": 2,
    "S": 24,
    "H": 16,
    "C": 64,
    "P": 20,
    "T": 37,
    "V": 300,
    "D": 48,
    "R": 50,
    "Ho": 8,
    "Wo": 8,
    "W": 16,
    "L": 5,
    "G": 2,
    "F": 32,
}
# Per-sequence lengths for the pooled attention tasks (query lengths never above key lengths).
SMALL_SEQUENCES: dict[str, list[int]] = {"kv_lens": [5, 17, 40], "q_lens": [3, 17, 9]}


def small_workload(task: Task) -> WorkloadSpec:
    """A small workload of ``task``: every axis it sets from ``SMALL_AXES``, its sequences from
    ``SMALL_SEQUENCES``, derived axes computed and constraints checked as the loader does."""
    axes = {
        axis: SMALL_AXES[axis]
        for axis in task.definition.var_axes
        if axis not in task.derived_axes and axis in task.workloads[0].axes
    }
    sequences = {name: SMALL_SEQUENCES[name] for name in task.workloads[0].sequences}
    return workload_for(task, "small", axes, sequences)


def make_inputs(
    task: Task, workload: WorkloadSpec, *, seed: int, outliers: bool, device: str
) -> dict[str, Any]:
    """The task's inputs for ``workload``, as the judge makes them but on ``device``."""
    generate = resolve_callable(task.callables.inputs)
    inputs: dict[str, Any] = generate(
        task.axis_values(workload),
        seed=seed,
        device=device,
        outliers=outliers,
        **task.callables.params,
        **workload.sequences,
    )
    return inputs


def baseline_check(
    task: Task,
    workload: WorkloadSpec,
    inputs: Mapping[str, torch.Tensor],
    outputs: Mapping[str, torch.Tensor],
    references: Mapping[str, torch.Tensor],
    *,
    outliers: bool = False,
) -> CheckReport:
    """The task's own check of a baseline's outputs against the reference (``outliers``: the
    outlier stage's inputs, checked with its tolerance). ``torch.topk``
    orders equal values as it likes, where the contract puts the smaller index first: its
    indices are checked to point at its values instead, and its values as usual."""
    outputs = dict(outputs)
    if task.callables.params.get("op") == "topk":
        picked = inputs["x"].gather(1, outputs["indices"].long())
        assert bool((picked == outputs["values"]).all()), "topk: indices do not hold the values"
        outputs["indices"] = references["indices"].to(outputs["indices"].dtype)
    axes = task.axis_values(workload)
    return check_outputs(
        task, "baseline", workload.name, axes, outputs, references, outliers=outliers
    )
