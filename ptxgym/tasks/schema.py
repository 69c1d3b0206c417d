"""The task schema: typed, validated records of a task (operator definition, workloads, GPU
target, instruction families, entry point, tolerances) and the C signature it implies.

A task is data (``envs/``); :mod:`ptxgym.tasks.loader` reads the files into these records.
"""

from __future__ import annotations

import ast
import importlib.util
import math
import re
from collections.abc import Mapping
from functools import cache
from pathlib import Path
from typing import Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from ptxgym.tasks import expressions

GPU = Literal["H100", "B200"]
# Element types, named as torch names them (``getattr(torch, dtype)`` is the tensor's dtype).
DType = Literal["bfloat16", "float16", "float32", "int32", "int8", "float8_e4m3fn"]
FamilyKey = Literal["compute", "data_movement"]
# The closed set of task categories (docs/tasks.md, "Categories"): reports group by them and
# ``ptxgym list --category`` filters by them, so a new name is a documented change, not a typo.
Category = Literal[
    "gemm",
    "attention",
    "elementwise",
    "reduction",
    "normalization",
    "softmax",
    "loss",
    "scan",
    "sort-topk",
    "gather-scatter",
    "pooling",
    "convolution",
    "quantization",
    "fused",
    "sparse",
]
CATEGORIES: tuple[str, ...] = get_args(Category)
# ``instruction``: a correct kernel qualifies only by executing the target's instruction
# families (wgmma/TMA, tcgen05/TMA). ``performance``: no family is required (the operator has no
# matrix product for them to do); qualification does not apply and only Fast_p is reported.
TaskKind = Literal["instruction", "performance"]
# What the timed baseline is: a vendor library (cuBLAS, cuDNN, FlashInfer) reached through
# torch, code that torch.compile generated, or PyTorch's own eager kernels.
BaselineKind = Literal["library", "torch.compile", "eager"]

# The op part of an id starts with a letter and may hold digits (``GEMMFP8``); existing ids
# (letters only, an optional ``-d<head dim>``) match exactly as before.
TASK_ID_RE = re.compile(
    r"^PTX-(?P<gpu>H100|B200)-(?P<op>[A-Za-z][A-Za-z0-9]*)(?:-d(?P<head_dim>\d+))?$"
)
_C_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_CALLABLE_RE = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")
_C_TYPES: dict[str, str] = {
    "bfloat16": "__nv_bfloat16",
    "float16": "__half",
    "float32": "float",
    "int32": "int",
    "int8": "int8_t",
    "float8_e4m3fn": "__nv_fp8_e4m3",
}
# The header that declares each C type beyond the always-included bf16 and runtime ones: the
# build includes it ahead of the candidate, whose signature check names the type.
_C_TYPE_HEADERS: dict[str, str] = {
    "float16": "<cuda_fp16.h>",
    "int8": "<stdint.h>",
    "float8_e4m3fn": "<cuda_fp8.h>",
}
DTYPE_BYTES: dict[str, int] = {
    "bfloat16": 2,
    "float16": 2,
    "float32": 4,
    "int32": 4,
    "int8": 1,
    "float8_e4m3fn": 1,
}


class TaskFileError(ValueError):
    """A task file is invalid; the message names the file, the field and the problem."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Axis(_Model):
    """A named dimension: fixed by the definition (``const``) or set by each workload (``var``)."""

    type: Literal["const", "var"]
    value: int | None = None
    description: str = ""

    @model_validator(mode="after")
    def _value_matches_type(self) -> Axis:
        if self.type == "const" and (self.value is None or self.value <= 0):
            raise ValueError("a const axis needs a positive integer 'value'")
        if self.type == "var" and self.value is not None:
            raise ValueError("a var axis takes its value from each workload; remove 'value'")
        return self


class Tolerance(_Model):
    """An element passes when ``|out - ref| <= atol + rtol * |ref|``; both 0 is an exact match
    (integer outputs)."""

    atol: float = Field(ge=0)
    rtol: float = Field(ge=0)


# The tolerance of an output whose task names none, by its dtype (docs/tasks.md, "Tolerances").
# Floating types allow about one to two units in the last place of the output type against the
# float32 reference (the candidate rounds once to the output type; the reference does not);
# int32 outputs (indices, counts) must match exactly; an int8 output may differ by one step (a
# quantiser's round-half case decided the other way); a float8 e4m3 output by one e4m3 step.
DTYPE_TOLERANCES: dict[str, Tolerance] = {
    "bfloat16": Tolerance(atol=1e-2, rtol=1e-2),
    "float16": Tolerance(atol=2e-3, rtol=2e-3),
    "float32": Tolerance(atol=1e-4, rtol=1e-4),
    "int32": Tolerance(atol=0, rtol=0),
    "int8": Tolerance(atol=1, rtol=0),
    "float8_e4m3fn": Tolerance(atol=2**-6, rtol=0.125),
}


class TensorSpec(_Model):
    """One input or output tensor: shape as axis names, dtype, memory layout in words, and for
    an output the tolerance of its check when it is not its task's or its dtype's."""

    shape: list[str]
    dtype: DType
    layout: str = "row-major, contiguous"
    description: str = ""
    tolerance: Tolerance | None = None


class OpDefinition(_Model):
    """Axes, typed inputs and outputs, and constraints between axes."""

    axes: dict[str, Axis]
    inputs: dict[str, TensorSpec]
    outputs: dict[str, TensorSpec] = Field(min_length=1)
    constraints: list[str] = []

    @model_validator(mode="after")
    def _shapes_use_known_axes(self) -> OpDefinition:
        for kind, tensors in (("inputs", self.inputs), ("outputs", self.outputs)):
            for name, spec in tensors.items():
                unknown = [a for a in spec.shape if a not in self.axes]
                if unknown:
                    raise ValueError(f"{kind}.{name}.shape: unknown axes {unknown}")
        both = set(self.inputs) & set(self.outputs)
        if both:
            raise ValueError(f"names used for both an input and an output: {sorted(both)}")
        return self

    @property
    def const_axes(self) -> dict[str, int]:
        return {n: a.value for n, a in self.axes.items() if a.value is not None}

    @property
    def var_axes(self) -> list[str]:
        return [n for n, a in self.axes.items() if a.type == "var"]


class WorkloadSpec(_Model):
    """A concrete problem: every var axis resolved, plus any per-sequence lengths."""

    name: str
    description: str = ""
    axes: dict[str, int]
    sequences: dict[str, list[int]] = {}

    def payload(self) -> dict[str, Any]:
        """Its axes and sequences, as input generation and a single call's job take them."""
        return {"axes": self.axes, "sequences": self.sequences}


class Callables(_Model):
    """Trusted Python callables (``module:function``) that make inputs, the reference, the baseline.

    ``params`` are keyword arguments passed to all three (e.g. ``causal: true``).
    """

    inputs: str
    reference: str
    baseline: str
    # What the baseline is (library / torch.compile / eager) and, in words, which one: the
    # strongest available, named so that a speedup says against what.
    baseline_kind: BaselineKind
    baseline_name: str = Field(min_length=1)
    params: dict[str, Any] = {}

    @field_validator("inputs", "reference", "baseline")
    @classmethod
    def _resolvable(cls, value: str) -> str:
        check_callable_exists(value)
        return value


class InstructionFamily(_Model):
    """A family of target instructions, counted at SASS level.

    The family executed when, for every group in ``all_of``, at least one opcode pattern of the
    group (``fnmatch`` style, matched against the SASS opcode mnemonic) executed.
    """

    name: str
    description: str
    all_of: list[list[str]] = Field(min_length=1)


class Target(_Model):
    """A GPU target: architecture, build flags, what qualifies, and the knowledge pack."""

    gpu: GPU
    arch: str
    compute_capability: tuple[int, int]
    devices: str
    nvcc_flags: list[str]
    pack: str
    instruction_families: dict[FamilyKey, InstructionFamily]

    @field_validator("instruction_families")
    @classmethod
    def _both_families(
        cls, value: dict[FamilyKey, InstructionFamily]
    ) -> dict[FamilyKey, InstructionFamily]:
        missing = {"compute", "data_movement"} - set(value)
        if missing:
            raise ValueError(f"missing instruction families: {sorted(missing)}")
        return value


class EntryPoint(_Model):
    """The candidate's C-linkage entry: symbol, which axes it takes, and its exact signature."""

    symbol: str
    axes: list[str]
    signature: str

    @field_validator("symbol")
    @classmethod
    def _c_identifier(cls, value: str) -> str:
        if not _C_IDENTIFIER.match(value):
            raise ValueError(f"{value!r} is not a C identifier")
        return value


class Task(_Model):
    """One environment: an operator, a workload pool, a GPU target and the evaluation settings."""

    id: str
    family: str
    category: Category
    kind: TaskKind = "instruction"
    op: str
    gpu: GPU
    description: str
    definition: OpDefinition
    # Var axes computed from each workload's sequences (and axes): an expression per axis.
    derived_axes: dict[str, str] = {}
    workloads: list[WorkloadSpec] = Field(min_length=1)
    callables: Callables
    target: Target
    entry_point: EntryPoint
    # Every output's tolerance, unless the output names its own; None: each output's dtype's
    # (DTYPE_TOLERANCES). See ``tolerance_for``.
    tolerance: Tolerance | None = None
    # Every output's tolerance in the outlier stage only, for a task whose own library needs
    # more there than ``tolerance`` (the reason beside it in its file; docs/tasks.md,
    # "Tolerances"); None: the other stages' tolerances hold there too.
    outlier_tolerance: Tolerance | None = None
    turns: int = Field(ge=1)
    # The operator's floating-point work on a workload: an expression over its axes and
    # sequences (ptxgym.tasks.expressions), counting each multiply-add of its matrix products
    # as 2 and only the pairs a causal mask keeps; for an operator without matrix products, its
    # arithmetic (docs/tasks.md, "FLOP and byte models").
    flops: str
    # The bytes a workload must move at least, as an expression like ``flops``; None: every
    # input read once and every output written once (right where the operator touches all of
    # its tensors; a gather or a paged cache reads less, and says so here).
    bytes: str | None = None
    # The part of that work the target family of tensor-core instructions must do for the
    # compute family to qualify (ptxgym.outcome.InstructionProfile.qualified); 0 for a
    # performance task, which has no family to qualify with.
    min_coverage: float = Field(0.0, ge=0.0, le=1.0)
    source: str

    @model_validator(mode="after")
    def _consistent(self) -> Task:
        match = TASK_ID_RE.match(self.id)
        if not match:
            raise ValueError(f"id: {self.id!r} does not match PTX-{{H100|B200}}-{{Op}}[-d{{D}}]")
        if match["gpu"] != self.gpu or match["op"] != self.op:
            raise ValueError(f"id: {self.id!r} disagrees with gpu={self.gpu} / op={self.op}")
        if match["head_dim"] is not None:
            head_dims = {v for n, v in self.definition.const_axes.items() if n in ("D", "head_dim")}
            if head_dims != {int(match["head_dim"])}:
                raise ValueError(
                    f"id: {self.id!r} names head dim {match['head_dim']}, "
                    f"but the definition's head-dim axis is {sorted(head_dims) or 'missing'}"
                )
        if self.target.gpu != self.gpu:
            raise ValueError(f"target: is for {self.target.gpu}, the task for {self.gpu}")
        unknown = [a for a in self.entry_point.axes if a not in self.definition.axes]
        if unknown:
            raise ValueError(f"entry_point.axes: unknown axes {unknown}")
        parameters = [*self.definition.inputs, *self.definition.outputs, *self.entry_point.axes]
        repeated = sorted(
            {p for p in [*parameters, "stream"] if [*parameters, "stream"].count(p) > 1}
        )
        if repeated:
            raise ValueError(f"entry_point: parameter names used twice: {repeated}")
        expected = render_signature(self.definition, self.entry_point)
        if _normalise(self.entry_point.signature) != _normalise(expected):
            raise ValueError(
                "entry_point.signature: does not match the definition; "
                f"from the inputs, outputs and axes it must be: {expected}"
            )
        if self.kind == "instruction" and self.min_coverage == 0:
            raise ValueError("min_coverage: an instruction task needs a share of work > 0")
        if self.kind == "performance" and self.min_coverage != 0:
            raise ValueError("min_coverage: a performance task has no family to cover work")
        names = {w.name for w in self.workloads}
        if len(names) != len(self.workloads):
            raise ValueError("workloads: names must be unique")
        for workload in self.workloads:
            for field, model in (("flops", self.flops_of), ("bytes", self.bytes_of)):
                try:
                    amount = model(workload.axes, workload.sequences)
                except expressions.ExpressionError as exc:
                    raise ValueError(f"{field}: {exc}") from None
                if amount <= 0:
                    raise ValueError(
                        f"{field}: {amount} on workload {workload.name!r}; it must be > 0"
                    )
        return self

    def flops_of(self, axes: Mapping[str, int], sequences: Mapping[str, list[int]]) -> int:
        """The operator's floating-point work on a workload of these axes and sequences."""
        return self._integer(self.flops, axes, sequences)

    def bytes_of(self, axes: Mapping[str, int], sequences: Mapping[str, list[int]]) -> int:
        """The bytes a workload of these axes and sequences must move at least: the ``bytes``
        model, or each input read and each output written once."""
        if self.bytes is not None:
            return self._integer(self.bytes, axes, sequences)
        values = {**self.definition.const_axes, **axes}
        tensors = {**self.definition.inputs, **self.definition.outputs}
        return sum(
            math.prod(values[axis] for axis in spec.shape) * DTYPE_BYTES[spec.dtype]
            for spec in tensors.values()
        )

    def _integer(
        self, expression: str, axes: Mapping[str, int], sequences: Mapping[str, list[int]]
    ) -> int:
        names: dict[str, expressions.Value] = {**self.definition.const_axes, **axes}
        names.update({name: list(lengths) for name, lengths in sequences.items()})
        value = expressions.evaluate(expression, names)
        if type(value) is not int:
            raise expressions.ExpressionError(f"{expression!r} is not an integer")
        return value

    @property
    def instructions_required(self) -> bool:
        """Whether a correct kernel must execute a target instruction family to qualify."""
        return self.kind == "instruction"

    def tolerance_for(self, output: str, *, outliers: bool = False) -> Tolerance:
        """The tolerance of one output's check: in the outlier stage the task's
        ``outlier_tolerance`` where it has one; else the output's own, else the task's, else
        its dtype's."""
        if outliers and self.outlier_tolerance is not None:
            return self.outlier_tolerance
        spec = self.definition.outputs[output]
        return spec.tolerance or self.tolerance or DTYPE_TOLERANCES[spec.dtype]

    @property
    def arch(self) -> str:
        return self.target.arch

    @property
    def pooled(self) -> bool:
        """True for tasks evaluated on a pool of several workloads."""
        return len(self.workloads) > 1

    def axis_values(self, workload: WorkloadSpec) -> dict[str, int]:
        """Every axis of the definition with its value in ``workload``."""
        return {**self.definition.const_axes, **workload.axes}


def c_parameter_types(definition: OpDefinition, entry: EntryPoint) -> list[str]:
    """The entry's C parameter types in order: inputs (const), outputs, axes, stream."""
    types = [f"const {_C_TYPES[spec.dtype]}*" for spec in definition.inputs.values()]
    types += [f"{_C_TYPES[spec.dtype]}*" for spec in definition.outputs.values()]
    return [*types, *(["int"] * len(entry.axes)), "cudaStream_t"]


def c_type_headers(definition: OpDefinition) -> tuple[str, ...]:
    """The headers that declare the C types of the definition's tensors, in a stable order."""
    dtypes = [spec.dtype for spec in (*definition.inputs.values(), *definition.outputs.values())]
    return tuple(dict.fromkeys(_C_TYPE_HEADERS[d] for d in dtypes if d in _C_TYPE_HEADERS))


def render_signature(definition: OpDefinition, entry: EntryPoint) -> str:
    """The C prototype the candidate must define."""
    names = [*definition.inputs, *definition.outputs, *entry.axes, "stream"]
    types = c_parameter_types(definition, entry)
    params = ", ".join(f"{t} {n}" for t, n in zip(types, names, strict=True))
    return f'extern "C" int {entry.symbol}({params});'


def _normalise(signature: str) -> str:
    return re.sub(r"\s+", " ", re.sub(r"\s*([(),*;])\s*", r"\1", signature)).strip()


def locate_module(module_name: str) -> Path:
    """The source file of a Python module, found without importing it."""
    try:
        spec = importlib.util.find_spec(module_name)
    except (ImportError, ValueError):
        spec = None
    if spec is None or spec.origin is None or not spec.origin.endswith(".py"):
        raise ValueError(f"module {module_name!r} was not found")
    return Path(spec.origin)


@cache
def top_level_functions(path: Path) -> frozenset[str]:
    """The functions a Python source file defines at top level. Cached: the registry names a
    few modules ninety times, and parsing them again each time was most of the cost of
    ``import ptxgym`` (which every tool run, report reader and spawned worker pays)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    return frozenset(
        node.name for node in tree.body if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
    )


def check_callable_exists(reference: str) -> None:
    """Check that ``module:function`` names a function defined in an importable module.

    The module is located and parsed, not imported: the references need torch and a GPU, and
    this check runs everywhere.
    """
    if not _CALLABLE_RE.match(reference):
        raise ValueError(f"{reference!r} is not of the form 'package.module:function'")
    module_name, function = reference.split(":")
    try:
        path = locate_module(module_name)
    except ValueError as exc:
        raise ValueError(f"{reference!r}: {exc}") from None
    if function not in top_level_functions(path):
        raise ValueError(f"{reference!r}: {module_name} defines no top-level {function!r}")
