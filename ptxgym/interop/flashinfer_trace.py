"""FlashInfer-Trace interop: ptxgym tasks, candidates and outcomes as FlashInfer-Bench records.

The records are the models of ``ptxgym.interop.flashinfer_schema`` (FlashInfer-Bench's schema at
commit 40e6ca78), handed on here with the conversions, so this module is the one to import.
Conversions (documented in ``docs/trace.md``): :func:`definition_from_task` (its reference made
self-contained by ``ptxgym.interop.reference_source``), :func:`workloads_from_task`,
:func:`solution_from_source`, :func:`trace_from_outcome` and :func:`write_trace_set`, which lays
out a dataset the way their ``TraceSet`` reads it.
"""

from __future__ import annotations

import ast
import math
import re
import uuid
from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from ptxgym import tasks as _tasks
from ptxgym.interop.flashinfer_schema import (
    AxisConst,
    AxisVar,
    Binding,
    BuildSpec,
    Correctness,
    Definition,
    Environment,
    Evaluation,
    EvaluationStatus,
    Language,
    Performance,
    RandomInput,
    SafetensorsInput,
    ScalarInput,
    Solution,
    SourceFile,
    TensorSpec,
    Trace,
    TraceExportError,
    Workload,
    read_definition,
    read_jsonl,
    to_dict,
    to_json,
)
from ptxgym.interop.reference_source import reference_source
from ptxgym.languages.cuda.compiler import CANDIDATE_FILE
from ptxgym.outcome import Outcome, Status

__all__ = [
    "STATUS_MAP",
    "AxisConst",
    "AxisVar",
    "Binding",
    "BuildSpec",
    "Correctness",
    "Definition",
    "Environment",
    "Evaluation",
    "EvaluationStatus",
    "Language",
    "Performance",
    "RandomInput",
    "SafetensorsInput",
    "ScalarInput",
    "Solution",
    "SourceFile",
    "TensorSpec",
    "Trace",
    "TraceExportError",
    "Workload",
    "definition_from_task",
    "definition_name",
    "export_problem",
    "index_tensors",
    "op_type",
    "read_definition",
    "read_jsonl",
    "reference_source",
    "solution_from_source",
    "to_dict",
    "to_json",
    "trace_from_outcome",
    "workloads_from_task",
    "write_trace_set",
]


_FLOAT_DTYPES = frozenset(
    {"float32", "float16", "bfloat16", "float8_e4m3fn", "float8_e5m2", "float4_e2m1"}
)

# FlashInfer-Bench caps an embedded evaluation log at 5 MiB (bench/utils.py).
_MAX_LOG_BYTES = 5 * 1024 * 1024
# --------------------------------------------------------------------------------------------
# Names


# Tasks whose FlashInfer op_type is not the snake-cased family: GQA decode reads a paged KV
# cache and prefill ragged (packed) sequences, which FlashInfer-Bench files under different
# op_types; the variant says what the name should add.
_OP_TYPES: dict[str, tuple[str, str]] = {
    "GQADecode": ("gqa_paged", "decode"),
    "GQAPrefill": ("gqa_ragged", "prefill_causal"),
}
_STAGE_TAGS: dict[str, str] = {"GQADecode": "stage:decode", "GQAPrefill": "stage:prefill"}
# FlashInfer-Bench's abbreviations in names such as gqa_paged_decode_h32_kv8_d128_ps1.
_AXIS_ABBREVIATIONS: dict[str, str] = {
    "num_qo_heads": "h",
    "num_kv_heads": "kv",
    "head_dim": "d",
    "page_size": "ps",
}


def _snake(name: str) -> str:
    """``MHAFwdCausal`` -> ``mha_fwd_causal``, ``GEMM`` -> ``gemm``."""
    spaced = re.sub(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])", "_", name)
    return spaced.lower()


def _op_type_and_variant(task: _tasks.Task) -> tuple[str, str]:
    if task.op in _OP_TYPES:
        return _OP_TYPES[task.op]
    kind = _snake(task.family)
    return kind, _snake(task.op).removeprefix(kind).strip("_")


def op_type(task: _tasks.Task) -> str:
    """FlashInfer op_type: ``gemm``, ``gqa_paged``, ``gqa_ragged``, ``mha_fwd``, ``mha_bwd``."""
    return _op_type_and_variant(task)[0]


def definition_name(task: _tasks.Task) -> str:
    """``{op_type}[_{variant}]{_<axis><value> per const axis}_{arch}``.

    E.g. ``gqa_paged_decode_h32_kv8_d128_ps16_sm90a``, ``mha_fwd_causal_d64_sm100a``,
    ``gemm_sm90a``. The architecture is part of the name because ptxgym's H100 and B200 tasks
    are different tasks (different targets, different qualifying instructions).
    """
    kind, variant = _op_type_and_variant(task)
    consts = [
        f"{_AXIS_ABBREVIATIONS.get(axis, _snake(axis))}{value}"
        for axis, value in task.definition.const_axes.items()
    ]
    parts = [kind, variant, *consts, task.arch.replace("_", "")]
    return "_".join(p for p in parts if p)


_UUID_NAMESPACE = uuid.uuid5(uuid.NAMESPACE_URL, "ptxgym:flashinfer-trace")


def _workload_uuid(task: _tasks.Task, workload: _tasks.WorkloadSpec) -> str:
    """Deterministic: uuid5 of ``<task id>/<workload name>`` in a fixed ptxgym namespace."""
    return str(uuid.uuid5(_UUID_NAMESPACE, f"{task.id}/{workload.name}"))


# --------------------------------------------------------------------------------------------
# Definition from a task


def _bound_var_axes(task: _tasks.Task) -> list[str]:
    """Var axes that some input's shape binds.

    FlashInfer-Bench reads every var axis off the input shapes and fails on one it cannot find,
    so an axis no input uses (prefill's batch_size, which is len_indptr - 1) is left out.
    """
    used = {axis for spec in task.definition.inputs.values() for axis in spec.shape}
    return [a for a in task.definition.var_axes if a in used]


def _tensor_description(spec: _tasks.TensorSpec) -> str:
    # FlashInfer's TensorSpec has no layout field; ours matters (K-major, NHD pages ...).
    layout = f"layout: {spec.layout}"
    return f"{spec.description} ({layout})" if spec.description else layout


def _names_in(expression: str) -> set[str]:
    return {n.id for n in ast.walk(ast.parse(expression, mode="eval")) if isinstance(n, ast.Name)}


def export_problem(task: _tasks.Task) -> str | None:
    """Why ``task`` cannot be written as FlashInfer-Trace, or None when it can.

    FlashInfer-Bench binds every var axis from the input shapes, so an output whose shape
    needs a var axis no input has (a pooling's output size, a block quantiser's block count)
    cannot be declared; and a workload's integer inputs must follow from its axes and sequences
    by a rule of ``_INDEX_BUILDERS`` (indices drawn at random, as token ids are, have none).
    """
    bound = set(_bound_var_axes(task))
    unbound = sorted(
        {
            axis
            for spec in task.definition.outputs.values()
            for axis in spec.shape
            if axis in task.definition.var_axes and axis not in bound
        }
    )
    if unbound:
        return f"{task.id}: its outputs' var axes {unbound} are bound by no input"
    integers = [n for n, s in task.definition.inputs.items() if s.dtype not in _FLOAT_DTYPES]
    if integers and op_type(task) not in _INDEX_BUILDERS:
        return f"{task.id}: no rule derives the integer inputs {integers} from a workload"
    return None


def definition_from_task(task: _tasks.Task) -> Definition:
    """The task's operator as a FlashInfer Definition (see :func:`definition_name`); a
    :class:`TraceExportError` for a task that cannot be one (:func:`export_problem`)."""
    problem = export_problem(task)
    if problem is not None:
        raise TraceExportError(problem)
    kept_vars = set(_bound_var_axes(task))
    axes: dict[str, dict[str, Any]] = {}
    for name, axis in task.definition.axes.items():
        if axis.type == "var" and name not in kept_vars:
            continue
        entry: dict[str, Any] = {"type": axis.type}
        if axis.value is not None:
            entry["value"] = axis.value
        if axis.description:
            entry["description"] = axis.description
        axes[name] = entry

    def tensors(specs: Mapping[str, _tasks.TensorSpec]) -> dict[str, dict[str, Any]]:
        return {
            name: {
                "shape": list(spec.shape),
                "dtype": spec.dtype,
                "description": _tensor_description(spec),
            }
            for name, spec in specs.items()
        }

    # Only constraints over exported axes: ours may also name sequence lists (q_lens) and
    # helper functions that FlashInfer-Bench does not know.
    constraints = [c for c in task.definition.constraints if _names_in(c) <= set(axes)]
    description = " ".join(task.description.split())
    dropped = [a for a in task.definition.var_axes if a not in kept_vars]
    if dropped:
        which = f"axis {dropped[0]} is" if len(dropped) == 1 else f"axes {', '.join(dropped)} are"
        description += f" (ptxgym's var {which} left out: FlashInfer binds var axes from inputs.)"
    tags = [f"ptxgym:{task.id}", f"gpu:{task.gpu}", f"arch:{task.arch}", f"family:{task.family}"]
    if task.op in _STAGE_TAGS:
        tags.append(_STAGE_TAGS[task.op])
    return Definition.model_validate(
        {
            "name": definition_name(task),
            "op_type": op_type(task),
            "description": description,
            "tags": tags,
            "axes": axes,
            "inputs": tensors(task.definition.inputs),
            "outputs": tensors(task.definition.outputs),
            "reference": reference_source(task),
            "constraints": constraints,
        }
    )


# --------------------------------------------------------------------------------------------
# Workloads


IndexTensors = dict[str, npt.NDArray[np.int32]]


def _prefix_sums(lengths: npt.NDArray[np.int64]) -> npt.NDArray[np.int32]:
    offsets = np.concatenate([np.zeros(1, dtype=np.int64), np.cumsum(lengths)])
    if offsets[-1] > np.iinfo(np.int32).max:
        raise TraceExportError(f"offsets up to {offsets[-1]} do not fit int32")
    return offsets.astype(np.int32)


def _sequence(workload: _tasks.WorkloadSpec, key: str, task: _tasks.Task) -> npt.NDArray[np.int64]:
    if key not in workload.sequences:
        raise TraceExportError(f"{task.id}: workload {workload.name} has no sequence {key!r}")
    return np.asarray(workload.sequences[key], dtype=np.int64)


def _paged_indices(task: _tasks.Task, workload: _tasks.WorkloadSpec, key: str) -> IndexTensors:
    """Page table of a paged decode batch, as ``envs/ops/gqa.yaml`` describes it.

    ``kv_indptr`` and ``kv_last_page_len`` follow from ``kv_lens``. Which cache page holds which
    sequence's pages is drawn at run time by ptxgym (a random permutation per seed); here it is a
    fixed permutation drawn from the workload uuid, so the pages are scattered as in ptxgym.
    """
    page_size = task.definition.const_axes["page_size"]
    kv_lens = _sequence(workload, "kv_lens", task)
    pages = -(-kv_lens // page_size)
    num_pages = workload.axes["num_pages"]
    rng = np.random.default_rng(uuid.UUID(key).int)
    return {
        "kv_indptr": _prefix_sums(pages),
        "kv_indices": rng.permutation(num_pages)[: int(pages.sum())].astype(np.int32),
        "kv_last_page_len": (kv_lens - page_size * (pages - 1)).astype(np.int32),
    }


def _ragged_indices(task: _tasks.Task, workload: _tasks.WorkloadSpec, key: str) -> IndexTensors:
    """Row offsets of a ragged prefill batch: prefix sums of ``q_lens`` and ``kv_lens``."""
    return {
        "qo_indptr": _prefix_sums(_sequence(workload, "q_lens", task)),
        "kv_indptr": _prefix_sums(_sequence(workload, "kv_lens", task)),
    }


# op_type -> builder of its integer inputs from a workload's sequences.
_INDEX_BUILDERS: dict[str, Callable[[_tasks.Task, _tasks.WorkloadSpec, str], IndexTensors]] = {
    "gqa_paged": _paged_indices,
    "gqa_ragged": _ragged_indices,
}


def index_tensors(task: _tasks.Task, workload: _tasks.WorkloadSpec) -> IndexTensors:
    """The task's integer inputs for ``workload``, checked against their declared shapes."""
    wanted = [n for n, s in task.definition.inputs.items() if s.dtype not in _FLOAT_DTYPES]
    if not wanted:
        return {}
    builder = _INDEX_BUILDERS.get(op_type(task))
    if builder is None:
        raise TraceExportError(
            f"{task.id}: no rule derives the integer inputs {wanted} from a workload"
        )
    tensors = builder(task, workload, _workload_uuid(task, workload))
    if sorted(tensors) != sorted(wanted):
        raise TraceExportError(f"{task.id}: index rule gives {sorted(tensors)}, need {wanted}")
    values = task.axis_values(workload)
    for name, array in tensors.items():
        shape = tuple(values[a] for a in task.definition.inputs[name].shape)
        if array.shape != shape:
            raise TraceExportError(
                f"{task.id}/{workload.name}: {name} has shape {array.shape}, expected {shape}"
            )
    return tensors


def _blob_path(task: _tasks.Task, workload_uuid: str) -> str:
    # FlashInfer-Bench's TraceSet.add_workload_blob_tensor layout, relative to the root.
    name = definition_name(task)
    return f"blob/workloads/{op_type(task)}/{name}/{name}_{workload_uuid}.safetensors"


def _workload_record(
    task: _tasks.Task, workload: _tasks.WorkloadSpec, blob_dir: Path | None
) -> Workload:
    workload_uuid = _workload_uuid(task, workload)
    indices = index_tensors(task, workload)
    relative = _blob_path(task, workload_uuid)
    if indices:
        if blob_dir is None:
            raise TraceExportError(
                f"{task.id}: inputs {sorted(indices)} are index tensors fixed by each workload's "
                "sequences; pass blob_dir (the trace-set root) to write them as safetensors"
            )
        _save_safetensors(
            blob_dir / relative,
            indices,
            # One key: safetensors writes the metadata map in hash order, and the bytes of a
            # blob should not change from one export to the next.
            {"ptxgym": f"{task.id}/{workload.name}"},
        )
    inputs: dict[str, dict[str, Any]] = {}
    for name in task.definition.inputs:
        if name in indices:
            inputs[name] = {"type": "safetensors", "path": relative, "tensor_key": name}
        else:
            inputs[name] = {"type": "random"}
    axes = {a: workload.axes[a] for a in _bound_var_axes(task)}
    return Workload.model_validate({"uuid": workload_uuid, "axes": axes, "inputs": inputs})


def _save_safetensors(path: Path, tensors: IndexTensors, metadata: dict[str, str]) -> None:
    try:
        from safetensors.numpy import save_file
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise TraceExportError(
            "writing workload blobs needs the safetensors package: pip install safetensors"
        ) from exc
    path.parent.mkdir(parents=True, exist_ok=True)
    # Contiguous copies: safetensors writes raw buffers.
    save_file({k: np.ascontiguousarray(v) for k, v in tensors.items()}, path, metadata=metadata)


def workloads_from_task(task: _tasks.Task, blob_dir: Path | None = None) -> list[Trace]:
    """The task's workloads as FlashInfer workload records (Traces with no solution).

    Float inputs are ``{type: random}``. Integer index tensors (GQA's indptr, page table) are
    fixed by each workload's sequences: they are written to safetensors files under
    ``blob_dir/blob/workloads/...`` and referenced by paths relative to ``blob_dir``, which is
    therefore the trace-set root. Without ``blob_dir`` such tasks raise TraceExportError.
    """
    name = definition_name(task)
    return [
        Trace.model_validate({"definition": name, "workload": _workload_record(task, w, blob_dir)})
        for w in task.workloads
    ]


# --------------------------------------------------------------------------------------------
# Solutions and traces


def _hardware(task: _tasks.Task) -> str:
    return f"NVIDIA_{task.gpu}"


def solution_from_source(
    task: _tasks.Task, source: str, *, name: str, author: str = "ptxgym"
) -> Solution:
    """A candidate ``.cu`` as a FlashInfer Solution.

    The entry point keeps ptxgym's raw C ABI (pointers, then the entry axes, then the stream),
    stated in the description; FlashInfer-Bench's default tvm-ffi binding cannot call it as is.
    """
    signature = " ".join(task.entry_point.signature.split())
    return Solution.model_validate(
        {
            "name": name,
            "definition": definition_name(task),
            "author": author,
            "description": f"ptxgym candidate for {task.id} ({task.arch}). C ABI: {signature}",
            "spec": {
                "language": "cuda",
                "target_hardware": [_hardware(task)],
                "entry_point": f"{CANDIDATE_FILE}::{task.entry_point.symbol}",
                "dependencies": [],
                "destination_passing_style": True,
            },
            "sources": [{"path": CANDIDATE_FILE, "content": source}],
        }
    )


# Ours -> theirs. Theirs has no status for a response without code, a policy refusal, a build
# that was never run, or a memory fault; each maps to the nearest failure and the log's first
# line (and correctness.extra where there is one) keeps ours.
STATUS_MAP: Mapping[Status, EvaluationStatus] = {
    Status.FORMAT_ERROR: EvaluationStatus.COMPILE_ERROR,
    Status.POLICY_VIOLATION: EvaluationStatus.COMPILE_ERROR,
    Status.COMPILE_ERROR: EvaluationStatus.COMPILE_ERROR,
    Status.COMPILED: EvaluationStatus.RUNTIME_ERROR,
    Status.RUNTIME_ERROR: EvaluationStatus.RUNTIME_ERROR,
    Status.TIMEOUT: EvaluationStatus.TIMEOUT,
    Status.MEMORY_ERROR: EvaluationStatus.RUNTIME_ERROR,
    Status.INCORRECT_SHAPE: EvaluationStatus.INCORRECT_SHAPE,
    Status.INCORRECT_DTYPE: EvaluationStatus.INCORRECT_DTYPE,
    Status.INCORRECT_NUMERICAL: EvaluationStatus.INCORRECT_NUMERICAL,
    Status.PASSED: EvaluationStatus.PASSED,
}

_STATUS_NOTES: Mapping[Status, str] = {
    Status.FORMAT_ERROR: "no CUDA source could be extracted from the response",
    Status.POLICY_VIOLATION: "the static policy refused the source before the build",
    Status.COMPILED: "built but never run (no GPU evaluator); FlashInfer has no such status",
    Status.MEMORY_ERROR: "a memory fault (illegal address or out of memory) at run time",
}


def _log(task: _tasks.Task, outcome: Outcome, performance: Performance | None) -> str:
    qualified = {True: "true", False: "false", None: "unknown"}[outcome.qualified]
    note = _STATUS_NOTES.get(outcome.status)
    lines = [
        f"ptxgym_status: {outcome.status.value}" + (f" ({note})" if note else ""),
        f"ptxgym_task: {task.id}",
        f"ptxgym_evaluator: {outcome.evaluator}",
        f"ptxgym_qualified: {qualified}",
    ]
    if outcome.latency_ms is not None or outcome.baseline_latency_ms is not None:
        lines.append(
            f"ptxgym_latency_ms: {outcome.latency_ms}; "
            f"ptxgym_baseline_latency_ms: {outcome.baseline_latency_ms} "
            "(the library baseline, which performance.reference_latency_ms holds)"
        )
    if performance is not None and (
        outcome.latency_ms is None or outcome.baseline_latency_ms is None
    ):
        lines.append("ptxgym: latency not measured; performance holds 0.0 for what is missing")
    if outcome.message:
        lines += ["", outcome.message]
    if outcome.compile is not None and outcome.compile.log:
        lines += ["", "--- compiler log ---", outcome.compile.log]
    text = "\n".join(lines)
    data = text.encode("utf-8")
    if len(data) > _MAX_LOG_BYTES:
        text = data[:_MAX_LOG_BYTES].decode("utf-8", errors="ignore") + "\n\n[log truncated]\n"
    return text


def trace_from_outcome(
    task: _tasks.Task,
    workload: Workload | _tasks.WorkloadSpec,
    solution_name: str,
    outcome: Outcome,
    *,
    environment: Environment,
    correctness: Correctness | None = None,
    timestamp: str | None = None,
) -> Trace:
    """One evaluated step as a FlashInfer Trace.

    ``workload`` is a record from :func:`workloads_from_task` (needed for tasks with blobs) or a
    task workload. ``correctness`` is the caller's measured error maxima; ptxgym's Outcome has
    none, so a status that FlashInfer requires correctness for gets NaN maxima (unknown) plus
    the tolerance in ``extra``. Performance is present only for PASSED (their rule);
    ``reference_latency_ms`` holds ptxgym's library baseline, not the PyTorch reference.
    """
    if outcome.task_id != task.id:
        raise TraceExportError(f"the outcome is for {outcome.task_id}, not {task.id}")
    if isinstance(workload, _tasks.WorkloadSpec):
        workload = _workload_record(task, workload, None)
    status = STATUS_MAP[outcome.status]

    correctness_record: Correctness | None = None
    if status in (EvaluationStatus.PASSED, EvaluationStatus.INCORRECT_NUMERICAL):
        # FlashInfer-Trace has one tolerance per trace: the loosest of the outputs' (the
        # outlier stage's included).
        tolerances = [
            task.tolerance_for(name, outliers=outliers)
            for name in task.definition.outputs
            for outliers in (False, True)
        ]
        extra: dict[str, Any] = {
            "ptxgym_status": outcome.status.value,
            "atol": max(t.atol for t in tolerances),
            "rtol": max(t.rtol for t in tolerances),
        }
        if correctness is None:
            correctness_record = Correctness(
                max_relative_error=math.nan, max_absolute_error=math.nan, extra=extra
            )
        else:
            correctness_record = correctness.model_copy(
                update={"extra": {**(correctness.extra or {}), **extra}}
            )

    performance: Performance | None = None
    if status is EvaluationStatus.PASSED:
        latency, baseline = outcome.latency_ms, outcome.baseline_latency_ms
        speedup = outcome.speedup
        if speedup is None and latency and baseline is not None:
            speedup = baseline / latency
        performance = Performance(
            latency_ms=latency or 0.0,
            reference_latency_ms=baseline or 0.0,
            speedup_factor=speedup or 0.0,
        )

    evaluation = Evaluation(
        status=status,
        environment=environment,
        timestamp=timestamp or datetime.now(UTC).isoformat(timespec="seconds"),
        log=_log(task, outcome, performance),
        correctness=correctness_record,
        performance=performance,
    )
    return Trace(
        definition=definition_name(task),
        workload=workload,
        solution=solution_name,
        evaluation=evaluation,
    )


# --------------------------------------------------------------------------------------------
# Dataset


def write_trace_set(root: Path, tasks: Iterable[_tasks.Task]) -> list[Path]:
    """Write definitions, workload records and blobs in FlashInfer-Bench's TraceSet layout.

    ``definitions/<op_type>/<name>.json``, ``workloads/<op_type>/<name>.jsonl`` and
    ``blob/workloads/<op_type>/<name>/<name>_<uuid>.safetensors``. Files are overwritten (the
    content is deterministic). Tasks that FlashInfer-Trace cannot describe
    (:func:`export_problem`) are left out. Returns the definition and workload files written.
    """
    written: list[Path] = []
    owners: dict[str, str] = {}
    for task in tasks:
        if export_problem(task) is not None:
            continue
        definition = definition_from_task(task)
        if definition.name in owners:
            raise TraceExportError(
                f"{task.id} and {owners[definition.name]} both map to {definition.name}"
            )
        owners[definition.name] = task.id
        definition_path = root / "definitions" / definition.op_type / f"{definition.name}.json"
        workloads_path = root / "workloads" / definition.op_type / f"{definition.name}.jsonl"
        records = workloads_from_task(task, root)
        definition_path.parent.mkdir(parents=True, exist_ok=True)
        definition_path.write_text(to_json(definition, indent=2) + "\n", encoding="utf-8")
        workloads_path.parent.mkdir(parents=True, exist_ok=True)
        workloads_path.write_text(
            "".join(to_json(record) + "\n" for record in records), encoding="utf-8"
        )
        written += [definition_path, workloads_path]
    return written
