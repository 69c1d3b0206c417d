"""Every registered task on CPU with small shapes: its inputs, its reference, its FLOP and byte
models, its prompt, and (for eager baselines) its baseline against its reference.

The task files keep their real workloads; this test shrinks them (``small_workload``), resolving
derived axes and checking constraints as the loader does. The GPU side (every baseline timed and
checked against its reference on the real workloads) is tests/gpu/test_task_collection.py.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import pytest
import yaml
from task_shapes import baseline_check, make_inputs, small_workload

from ptxgym import paths
from ptxgym.evaluate.compile_only import CompileOnlyEvaluator
from ptxgym.evaluate.worker import resolve_callable
from ptxgym.outcome import Status
from ptxgym.prompt import PROMPT_VARIANTS, build_prompt
from ptxgym.tasks import CATEGORIES, DTYPE_BYTES, Task, WorkloadSpec, registry

if TYPE_CHECKING:
    import torch
else:
    torch = pytest.importorskip("torch")

TASKS = sorted(registry().values(), key=lambda task: task.id)
IDS = [task.id for task in TASKS]
# The B200 tasks share their H100 twins' callables and workloads: once per operator is enough
# for the CPU runs.
OPERATORS = [task for task in TASKS if task.gpu == "H100"]


def _inputs(task: Task, workload: WorkloadSpec, seed: int, outliers: bool) -> dict[str, Any]:
    return make_inputs(task, workload, seed=seed, outliers=outliers, device="cpu")


def test_categories_and_kinds_cover_the_suite() -> None:
    used = {task.category for task in TASKS}
    assert used <= set(CATEGORIES)
    assert len(used) >= 12
    for task in TASKS:
        assert task.kind in ("instruction", "performance")
        assert task.instructions_required == (task.kind == "instruction")
        assert (task.min_coverage > 0) == task.instructions_required
        assert task.callables.baseline_kind in ("library", "torch.compile", "eager")
        assert task.callables.baseline_name


def test_every_operator_exists_for_both_gpus() -> None:
    for task in OPERATORS:
        twin = task.id.replace("PTX-H100-", "PTX-B200-")
        assert twin in registry(), f"{task.id} has no B200 task"


@pytest.mark.parametrize("task", OPERATORS, ids=[task.id for task in OPERATORS])
def test_inputs_and_reference_on_small_shapes(task: Task) -> None:
    workload = small_workload(task)
    axes = task.axis_values(workload)
    inputs = _inputs(task, workload, seed=3, outliers=False)
    again = _inputs(task, workload, seed=3, outliers=False)
    outliers = _inputs(task, workload, seed=3, outliers=True)
    assert list(inputs) == list(task.definition.inputs), "inputs in definition order"
    for name, spec in task.definition.inputs.items():
        tensor = inputs[name]
        assert tuple(tensor.shape) == tuple(axes[a] for a in spec.shape), name
        assert tensor.dtype == getattr(torch, spec.dtype), name
        assert torch.equal(tensor.view(torch.uint8), again[name].view(torch.uint8)), name
        assert outliers[name].shape == tensor.shape
    for draw in (inputs, outliers):
        snapshot = {name: t.clone() for name, t in draw.items()}
        references = resolve_callable(task.callables.reference)(draw, **task.callables.params)
        for name, tensor in draw.items():  # the reference must not modify its inputs
            assert torch.equal(tensor.view(torch.uint8), snapshot[name].view(torch.uint8)), name
        assert set(references) == set(task.definition.outputs)
        for name, spec in task.definition.outputs.items():
            ref = references[name]
            assert tuple(ref.shape) == tuple(axes[a] for a in spec.shape), name
            assert bool(torch.isfinite(ref.float()).all()), f"{name}: non-finite reference"


@pytest.mark.parametrize("task", OPERATORS, ids=[task.id for task in OPERATORS])
def test_flop_and_byte_models(task: Task) -> None:
    small = small_workload(task)
    for workload in [*task.workloads, small]:
        flops = task.flops_of(workload.axes, workload.sequences)
        moved = task.bytes_of(workload.axes, workload.sequences)
        assert flops > 0 and moved > 0
    # The byte model counts at least the outputs, each written once.
    axes = task.axis_values(small)
    written = sum(
        math.prod(axes[a] for a in spec.shape) * DTYPE_BYTES[spec.dtype]
        for spec in task.definition.outputs.values()
    )
    assert task.bytes_of(small.axes, small.sequences) >= written


@pytest.mark.parametrize("task", TASKS, ids=IDS)
def test_prompt_is_built(task: Task) -> None:
    for variant in PROMPT_VARIANTS:
        text = build_prompt(task, variant=variant, knowledge="none").text
        assert task.id in text and task.entry_point.signature in text
        if task.instructions_required:
            assert "qualifies only if" in text
        else:
            assert "performance task" in text


EAGER = [
    task
    for task in OPERATORS
    if task.callables.baseline_kind == "eager" and task.category not in ("gemm", "attention")
]


@pytest.mark.parametrize("task", EAGER, ids=[task.id for task in EAGER])
def test_eager_baseline_agrees_with_the_reference_on_cpu(task: Task) -> None:
    """The eager baselines are plain torch: on CPU they must already pass the task's own
    check against the reference (the GPU test repeats this with the real workloads)."""
    workload = small_workload(task)
    for outliers in (False, True):
        inputs = _inputs(task, workload, seed=5, outliers=outliers)
        references = resolve_callable(task.callables.reference)(inputs, **task.callables.params)
        run = resolve_callable(task.callables.baseline)(inputs, **task.callables.params)
        report = baseline_check(task, workload, inputs, run(), references)
        assert report.ok, [(o.name, o.detail, o.worst) for o in report.outputs if not o.ok]


def _manifest() -> list[dict[str, Any]]:
    entries: list[dict[str, Any]] = yaml.safe_load(
        (paths.examples_dir() / "manifest.yaml").read_text(encoding="utf-8")
    )["examples"]
    return entries


def test_every_category_has_a_naive_example() -> None:
    covered = {
        registry()[task_id].category
        for entry in _manifest()
        if entry["kind"] == "naive"
        for task_id in entry["tasks"]
    }
    assert covered == {task.category for task in TASKS}


COLLECTION_EXAMPLES = [
    (entry["file"], task_id)
    for entry in _manifest()
    if entry["kind"] == "naive"
    for task_id in entry["tasks"]
    if registry()[task_id].family not in ("GEMM", "MHAFwd", "MHABwd", "GQA")
]


@pytest.mark.nvcc
@pytest.mark.parametrize(("file", "task_id"), COLLECTION_EXAMPLES)
def test_category_examples_compile_for_their_tasks(file: str, task_id: str) -> None:
    source = (paths.examples_dir() / file).read_text(encoding="utf-8")
    outcome = CompileOnlyEvaluator().evaluate(registry()[task_id], source)
    assert outcome.status is Status.COMPILED, outcome.message
    assert outcome.compile is not None and outcome.compile.kernels


def test_the_sliding_window_reference_sees_the_last_window_keys_only() -> None:
    from kernels_ref import mha

    axes = {"B": 1, "S": 9, "H": 2, "D": 16}
    inputs = mha.make_fwd_inputs(axes, seed=1, device="cpu")
    window = 3
    out = mha.fwd_reference(inputs, causal=True, window=window)
    q, k, v = (inputs[name].double().transpose(1, 2) for name in ("Q", "K", "V"))
    scores = q @ k.transpose(-1, -2) / 4.0  # scale 1/sqrt(16)
    i = torch.arange(9).unsqueeze(1)
    j = torch.arange(9).unsqueeze(0)
    scores = scores.masked_fill((j > i) | (j <= i - window), float("-inf"))
    expected = torch.softmax(scores, dim=-1) @ v
    assert torch.allclose(out["O"].double(), expected.transpose(1, 2), atol=1e-5)
    assert torch.allclose(out["LSE"].double(), torch.logsumexp(scores, dim=-1), atol=1e-5)
