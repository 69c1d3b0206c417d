"""FlashInfer-Trace interop: ptxgym tasks, candidates and outcomes as FlashInfer-Bench records.

The models mirror ``flashinfer_bench/data/`` (``definition.py``, ``workload.py``, ``solution.py``,
``trace.py``) of flashinfer-ai/flashinfer-bench at commit 40e6ca78: the same field names, nesting,
defaults, enum values and validators, so a dump of ours parses with theirs and theirs with ours.
ptxgym does not depend on flashinfer-bench (it needs torch); these are written from its schema.

Dumps for files use ``exclude_unset=True``, as FlashInfer-Bench's ``save_json_file`` does, so a
document read from their format dumps back to the same dict. Two kinds of field always count as
set: the ``type`` tags of axes and workload inputs, and a Trace's ``solution``/``evaluation``
(FlashInfer-Bench writes workload records with explicit nulls).

Conversions (documented in ``docs/trace.md``): :func:`definition_from_task`,
:func:`workloads_from_task`, :func:`solution_from_source`, :func:`trace_from_outcome` and
:func:`write_trace_set`, which lays out a dataset the way their ``TraceSet`` reads it.
"""

from __future__ import annotations

import ast
import keyword
import math
import re
import uuid
from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

import numpy as np
import numpy.typing as npt
from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    field_validator,
    model_validator,
)

from ptxgym import tasks as _tasks
from ptxgym.languages.cuda.compiler import CANDIDATE_FILE
from ptxgym.outcome import Outcome, Status

__all__ = [
    "STATUS_MAP",
    "AxisConst",
    "AxisVar",
    "BuildSpec",
    "Correctness",
    "Definition",
    "Environment",
    "Evaluation",
    "EvaluationStatus",
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
    "trace_from_outcome",
    "workloads_from_task",
    "write_trace_set",
]

NonEmptyString = Annotated[str, Field(min_length=1)]
NonNegativeInt = Annotated[int, Field(ge=0)]

# Their DType enum, spelled as they spell it.
DType = Literal[
    "float32",
    "float16",
    "bfloat16",
    "float8_e4m3fn",
    "float8_e5m2",
    "float4_e2m1",
    "int64",
    "int32",
    "int16",
    "int8",
    "bool",
]
_FLOAT_DTYPES = frozenset(
    {"float32", "float16", "bfloat16", "float8_e4m3fn", "float8_e5m2", "float4_e2m1"}
)

# FlashInfer-Bench caps an embedded evaluation log at 5 MiB (bench/utils.py).
_MAX_LOG_BYTES = 5 * 1024 * 1024


class TraceExportError(ValueError):
    """A ptxgym object cannot be expressed as a FlashInfer-Trace record as asked."""


class _FibModel(BaseModel):
    # Unknown fields are rejected (theirs ignore them) so schema drift is noticed, not dropped.
    model_config = ConfigDict(extra="forbid", frozen=True)

    # Fields that count as set even when left at their default, so that exclude_unset dumps
    # keep them, as FlashInfer-Bench's own files do.
    _ALWAYS_DUMPED: ClassVar[tuple[str, ...]] = ()

    def model_post_init(self, context: Any, /) -> None:
        self.model_fields_set.update(self._ALWAYS_DUMPED)


def to_dict(model: BaseModel) -> dict[str, Any]:
    """The JSON-ready dict FlashInfer-Bench would write for ``model`` (unset fields left out)."""
    return model.model_dump(mode="json", exclude_unset=True)


def _to_json(model: BaseModel, *, indent: int | None = None) -> str:
    return model.model_dump_json(indent=indent, exclude_unset=True)


# --------------------------------------------------------------------------------------------
# Definition (flashinfer_bench/data/definition.py)


class AxisConst(_FibModel):
    """An axis with a value fixed by the definition."""

    _ALWAYS_DUMPED = ("type",)

    type: Literal["const"] = "const"
    value: NonNegativeInt
    description: str | None = None


class AxisVar(_FibModel):
    """An axis whose value each workload sets (bound from input shapes at run time)."""

    _ALWAYS_DUMPED = ("type",)

    type: Literal["var"] = "var"
    description: str | None = None


def _axis_tag(value: Any) -> str:
    # A missing tag is read the way their untagged union resolves it: a value means const.
    if isinstance(value, Mapping):
        tag = value.get("type")
        return str(tag) if tag is not None else ("const" if "value" in value else "var")
    return str(getattr(value, "type", ""))


AxisSpec = Annotated[
    Annotated[AxisConst, Tag("const")] | Annotated[AxisVar, Tag("var")],
    Discriminator(_axis_tag),
]


class TensorSpec(_FibModel):
    """An input or output: shape as axis names (``None`` for a scalar) and dtype."""

    shape: list[NonEmptyString] | None
    dtype: DType
    description: str | None = None


class Definition(_FibModel):
    """A kernel's interface and math: axes, inputs, outputs and a PyTorch reference."""

    name: NonEmptyString
    op_type: NonEmptyString
    axes: dict[NonEmptyString, AxisSpec]
    inputs: dict[NonEmptyString, TensorSpec]
    outputs: dict[NonEmptyString, TensorSpec]
    reference: NonEmptyString
    tags: list[NonEmptyString] = Field(default_factory=list)
    description: str | None = None
    constraints: list[NonEmptyString] = Field(default_factory=list)

    @model_validator(mode="after")
    def _validate(self) -> Definition:
        # The same checks as theirs: a parseable reference with a top-level run, disjoint
        # input/output names, parseable constraints, shapes over declared axes.
        try:
            module = ast.parse(self.reference, mode="exec")
        except SyntaxError as exc:
            raise ValueError(f"Reference must be valid Python code: {exc}") from exc
        if not any(isinstance(n, ast.FunctionDef) and n.name == "run" for n in module.body):
            raise ValueError("Reference must define a top-level function named 'run'")
        if set(self.inputs) & set(self.outputs):
            raise ValueError("Input and output names must not overlap")
        for constraint in self.constraints:
            try:
                ast.parse(constraint, mode="eval")
            except SyntaxError as exc:
                raise ValueError(f"Constraints must be valid Python expressions: {exc}") from exc
        for name, spec in {**self.inputs, **self.outputs}.items():
            for axis in spec.shape or []:
                if axis not in self.axes:
                    kind = "Input" if name in self.inputs else "Output"
                    raise ValueError(f'{kind} "{name}" references undefined axis "{axis}"')
        return self

    @property
    def var_axes(self) -> list[str]:
        return [n for n, a in self.axes.items() if isinstance(a, AxisVar)]

    @property
    def const_axes(self) -> dict[str, int]:
        return {n: a.value for n, a in self.axes.items() if isinstance(a, AxisConst)}


# --------------------------------------------------------------------------------------------
# Workload (flashinfer_bench/data/workload.py)


class RandomInput(_FibModel):
    """Drawn by the benchmark: ``randn`` for floats, ``randint(-1024, 1024)`` for ints."""

    _ALWAYS_DUMPED = ("type",)

    type: Literal["random"] = "random"


class ScalarInput(_FibModel):
    """A Python scalar passed as is."""

    _ALWAYS_DUMPED = ("type",)

    type: Literal["scalar"] = "scalar"
    value: int | float | bool


class SafetensorsInput(_FibModel):
    """A tensor loaded from a safetensors file; ``path`` is relative to the trace-set root."""

    _ALWAYS_DUMPED = ("type",)

    type: Literal["safetensors"] = "safetensors"
    path: NonEmptyString
    tensor_key: NonEmptyString


def _input_tag(value: Any) -> str:
    if isinstance(value, Mapping):
        tag = value.get("type")
        if tag is not None:
            return str(tag)
        return "safetensors" if "path" in value else "scalar" if "value" in value else "random"
    return str(getattr(value, "type", ""))


InputSpec = Annotated[
    Annotated[RandomInput, Tag("random")]
    | Annotated[SafetensorsInput, Tag("safetensors")]
    | Annotated[ScalarInput, Tag("scalar")],
    Discriminator(_input_tag),
]


class Workload(_FibModel):
    """Values for every var axis and a data source for every input."""

    axes: dict[str, NonNegativeInt]
    inputs: dict[str, InputSpec]
    uuid: NonEmptyString


# --------------------------------------------------------------------------------------------
# Solution (flashinfer_bench/data/solution.py)


class Language(StrEnum):
    PYTHON = "python"
    TRITON = "triton"
    CPP = "cpp"
    CUDA = "cuda"
    TILELANG = "tilelang"


class Binding(StrEnum):
    TVM_FFI = "tvm-ffi"
    TORCH = "torch"


class SourceFile(_FibModel):
    """One source file of a solution, at a relative path."""

    path: NonEmptyString
    content: NonEmptyString

    @model_validator(mode="after")
    def _relative_path(self) -> SourceFile:
        path = Path(self.path)
        if path.is_absolute():
            raise ValueError(f"Invalid source path (absolute path not allowed): {self.path}")
        if ".." in path.parts:
            raise ValueError(
                f"Invalid source path (parent directory traversal not allowed): {self.path}"
            )
        return self


class BuildSpec(_FibModel):
    """How to build and call a solution."""

    language: Language
    target_hardware: list[str] = Field(min_length=1)
    entry_point: NonEmptyString
    dependencies: list[NonEmptyString] = Field(default_factory=list)
    destination_passing_style: bool = True
    binding: Binding | None = None

    @model_validator(mode="after")
    def _entry_point_format(self) -> BuildSpec:
        if self.entry_point.count("::") != 1:
            raise ValueError(
                f"Invalid entry point format: {self.entry_point}. Expected "
                '"<file_path>::<function_name>".'
            )
        return self


class Solution(_FibModel):
    """A concrete implementation of a definition."""

    name: NonEmptyString
    definition: NonEmptyString
    author: NonEmptyString
    spec: BuildSpec
    sources: list[SourceFile] = Field(min_length=1)
    description: str | None = None

    @model_validator(mode="after")
    def _sources_hold_entry(self) -> Solution:
        seen: set[str] = set()
        for source in self.sources:
            if source.path in seen:
                raise ValueError(f"Duplicate source path '{source.path}'")
            seen.add(source.path)
        entry_file = self.spec.entry_point.split("::")[0]
        if entry_file not in seen:
            raise ValueError(f"Entry source file '{entry_file}' not found in sources")
        return self


# --------------------------------------------------------------------------------------------
# Trace (flashinfer_bench/data/trace.py)


class Correctness(_FibModel):
    """Error maxima against the reference; NaN means unknown or non-finite output."""

    model_config = ConfigDict(ser_json_inf_nan="strings")

    max_relative_error: float = 0.0
    max_absolute_error: float = 0.0
    extra: dict[str, Any] | None = None

    @field_validator("max_relative_error", "max_absolute_error")
    @classmethod
    def _non_negative_or_nan(cls, value: float) -> float:
        if not math.isnan(value) and value < 0:
            raise ValueError("must be non-negative or NaN")
        return value


class Performance(_FibModel):
    """Latencies in milliseconds; speedup_factor = reference_latency_ms / latency_ms."""

    latency_ms: float = Field(default=0.0, ge=0.0)
    reference_latency_ms: float = Field(default=0.0, ge=0.0)
    speedup_factor: float = Field(default=0.0, ge=0.0)


class Environment(_FibModel):
    """Where the evaluation ran: hardware name (e.g. ``NVIDIA_H100``) and library versions."""

    hardware: NonEmptyString
    libs: dict[str, str] = Field(default_factory=dict)


class EvaluationStatus(StrEnum):
    PASSED = "PASSED"
    INCORRECT_SHAPE = "INCORRECT_SHAPE"
    INCORRECT_NUMERICAL = "INCORRECT_NUMERICAL"
    INCORRECT_DTYPE = "INCORRECT_DTYPE"
    RUNTIME_ERROR = "RUNTIME_ERROR"
    COMPILE_ERROR = "COMPILE_ERROR"
    TIMEOUT = "TIMEOUT"


class Evaluation(_FibModel):
    """One solution's result on one workload."""

    status: EvaluationStatus
    environment: Environment
    timestamp: NonEmptyString
    log: str = ""
    correctness: Correctness | None = None
    performance: Performance | None = None

    @model_validator(mode="after")
    def _metrics_match_status(self) -> Evaluation:
        # Their table: PASSED needs both; INCORRECT_NUMERICAL needs correctness only; every
        # other status carries neither.
        needs_correctness = self.status in (
            EvaluationStatus.PASSED,
            EvaluationStatus.INCORRECT_NUMERICAL,
        )
        needs_performance = self.status is EvaluationStatus.PASSED
        if needs_correctness != (self.correctness is not None):
            verb = "must include" if needs_correctness else "must not include"
            raise ValueError(f"Evaluation {verb} correctness when status is {self.status}")
        if needs_performance != (self.performance is not None):
            verb = "must include" if needs_performance else "must not include"
            raise ValueError(f"Evaluation {verb} performance when status is {self.status}")
        return self


class Trace(_FibModel):
    """A workload of a definition, and optionally a solution's evaluation on it.

    With ``solution`` and ``evaluation`` null it is a workload record (``workloads/*.jsonl``).
    """

    _ALWAYS_DUMPED = ("solution", "evaluation")

    definition: NonEmptyString
    workload: Workload
    solution: str | None = None
    evaluation: Evaluation | None = None

    def is_workload_trace(self) -> bool:
        return self.solution is None and self.evaluation is None


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
# Reference source

_INLINED_PACKAGE = "kernels_ref"


class _Module:
    """A reference module's text, split into what is kept and what is inlined or dropped."""

    def __init__(self, module_name: str, *, is_main: bool) -> None:
        self.name = module_name
        self.path = _module_path(module_name)
        text = self.path.read_text(encoding="utf-8")
        tree = ast.parse(text, filename=str(self.path))
        lines = text.splitlines()
        replace: dict[int, tuple[int, list[str]]] = {}  # first line -> (last line, new lines)
        self.docstring: str | None = None
        self.future: list[str] = []
        self.dependencies: list[str] = []
        self.defined: set[str] = set()
        self.imported: set[str] = set()
        for index, node in enumerate(tree.body):
            span = (node.lineno, node.end_lineno or node.lineno)
            if index == 0 and (docstring := _string_constant(node)) is not None:
                self.docstring = docstring
                replace[span[0]] = (span[1], [])
            elif isinstance(node, ast.ImportFrom) and node.module == "__future__":
                self.future += [alias.name for alias in node.names]
                replace[span[0]] = (span[1], [])
            elif isinstance(node, ast.ImportFrom) and _is_inlined(node.module, node.level):
                assert node.module is not None
                self.dependencies.append(node.module)
                # The names become module-level definitions once the dependency is inlined;
                # only renamed imports need a line.
                aliases = [f"{a.asname} = {a.name}" for a in node.names if a.asname]
                self.imported.update(a.asname or a.name for a in node.names)
                replace[span[0]] = (span[1], aliases)
            elif isinstance(node, ast.ImportFrom | ast.Import) and _imports_package(node):
                raise TraceExportError(
                    f"{self.path}:{node.lineno}: only 'from {_INLINED_PACKAGE}.<module> import "
                    "<names>' can be inlined into a FlashInfer reference"
                )
            elif isinstance(node, ast.Import | ast.ImportFrom):
                self.imported.update((a.asname or a.name).split(".")[0] for a in node.names)
            elif not is_main and _assigns(node) == {"__all__"}:
                replace[span[0]] = (span[1], [])
            else:
                self.defined |= _assigns(node)
        kept: list[str] = []
        number = 1
        while number <= len(lines):
            if number in replace:
                last, new = replace[number]
                kept += new
                number = last + 1
            else:
                kept.append(lines[number - 1])
                number += 1
        self.body = "\n".join(kept).strip("\n")


def _string_constant(node: ast.stmt) -> str | None:
    if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
        value = node.value.value
        return value if isinstance(value, str) else None
    return None


def _module_path(module_name: str) -> Path:
    # Located, never imported: the reference modules need torch.
    try:
        return _tasks.locate_module(module_name)
    except ValueError as exc:
        raise TraceExportError(f"reference {exc}") from None


def _is_inlined(module: str | None, level: int) -> bool:
    return level == 0 and module is not None and module.startswith(f"{_INLINED_PACKAGE}.")


def _imports_package(node: ast.Import | ast.ImportFrom) -> bool:
    if isinstance(node, ast.ImportFrom):
        return node.level > 0 or node.module == _INLINED_PACKAGE
    return any(a.name.split(".")[0] == _INLINED_PACKAGE for a in node.names)


def _assigns(node: ast.stmt) -> set[str]:
    """Top-level names a statement defines (functions, classes, plain assignments)."""
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        return {node.name}
    targets: list[ast.expr] = []
    if isinstance(node, ast.Assign):
        targets = node.targets
    elif isinstance(node, ast.AnnAssign | ast.AugAssign):
        targets = [node.target]
    names: set[str] = set()
    for target in targets:
        names |= {n.id for n in ast.walk(target) if isinstance(n, ast.Name)}
    return names


def _python_literal(value: Any, where: str) -> str:
    text = repr(value)
    try:
        same = ast.literal_eval(text) == value
    except (ValueError, SyntaxError):
        same = False
    if not same:
        raise TraceExportError(f"{where}: {value!r} cannot be written as a Python literal")
    return text


def reference_source(task: _tasks.Task) -> str:
    """Self-contained Python source for the Definition's ``reference``.

    The reference module's text, with the ``kernels_ref`` modules it imports inlined ahead of it
    (so it runs without ptxgym installed), then a top-level ``run`` that takes the inputs
    positionally in definition order, calls the reference function with the task's
    ``callables.params`` and returns the outputs in definition order, cast to their dtypes
    (FlashInfer-Bench compares the solution's dtypes with the reference's).
    """
    module_name, function = task.callables.reference.split(":")
    main = _Module(module_name, is_main=True)
    ordered: list[_Module] = []
    seen: set[str] = {module_name}

    def visit(module: _Module) -> None:
        for dependency in module.dependencies:
            if dependency not in seen:
                seen.add(dependency)
                inner = _Module(dependency, is_main=False)
                visit(inner)
                ordered.append(inner)

    visit(main)
    everything = [*ordered, main]
    owners: dict[str, str] = {}
    for module in everything:
        for name in module.defined:
            if name in owners:
                raise TraceExportError(
                    f"cannot inline {module.name} after {owners[name]}: both define {name!r}"
                )
            owners[name] = module.name
    if any("run" in m.defined | m.imported for m in everything):
        raise TraceExportError(f"{module_name} defines 'run', which the reference must own")

    inputs = list(task.definition.inputs)
    for name in inputs:
        if not name.isidentifier() or keyword.iskeyword(name) or name in ("torch", function):
            raise TraceExportError(f"{task.id}: input {name!r} cannot be a parameter of run")
    params = ", ".join(
        f"{key}={_python_literal(value, f'{task.id}: callables.params.{key}')}"
        for key, value in task.callables.params.items()
    )
    call_args = "{" + ", ".join(f"{n!r}: {n}" for n in inputs) + "}"
    call = f"{function}({call_args}{', ' + params if params else ''})"
    results = [
        f"outputs[{name!r}].to(torch.{spec.dtype})"
        for name, spec in task.definition.outputs.items()
    ]
    run = [
        "import torch",
        "",
        "",
        f"def run({', '.join(inputs)}):",
        f'    """FlashInfer-Bench entry point for ptxgym task {task.id}: inputs in definition',
        "    order; returns the outputs in definition order and dtypes.",
        '    """',
        f"    outputs = {call}",
        f"    return {', '.join(results)}",
    ]

    header = main.docstring or f"Reference for {task.id}."
    future = sorted({name for module in everything for name in module.future})
    parts = ['"""' + header.replace('"""', r"\"\"\"").rstrip() + '\n"""']
    if future:
        parts.append(f"from __future__ import {', '.join(future)}")
    for module in ordered:
        parts.append(f"# ---- inlined from {module.name} ({module.path.name}) ----\n{module.body}")
    parts.append(f"# ---- {main.name} ({main.path.name}) ----\n{main.body}")
    parts.append("# ---- generated by ptxgym.interop.flashinfer_trace ----\n" + "\n".join(run))
    return "\n\n\n".join(parts) + "\n"


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
        definition_path.write_text(_to_json(definition, indent=2) + "\n", encoding="utf-8")
        workloads_path.parent.mkdir(parents=True, exist_ok=True)
        workloads_path.write_text(
            "".join(_to_json(record) + "\n" for record in records), encoding="utf-8"
        )
        written += [definition_path, workloads_path]
    return written


def read_definition(path: Path) -> Definition:
    """A Definition from a FlashInfer ``.json`` file."""
    return Definition.model_validate_json(path.read_text(encoding="utf-8"))


def read_jsonl(path: Path) -> list[Trace]:
    """Traces (workload records or evaluated) from a FlashInfer ``.jsonl`` file."""
    lines = path.read_text(encoding="utf-8").splitlines()
    return [Trace.model_validate_json(line) for line in lines if line.strip()]
