"""The task schema: typed, validated records of a task (operator definition, workloads, GPU
target, instruction families, entry point, tolerances) and the C signature it implies.

A task is data (``envs/``); :mod:`ptxgym.tasks.loader` reads the files into these records.
"""

from __future__ import annotations

import ast
import importlib.util
import re
from collections.abc import Mapping
from functools import cache
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from ptxgym.tasks import expressions

GPU = Literal["H100", "B200"]
DType = Literal["bfloat16", "float32", "int32"]
FamilyKey = Literal["compute", "data_movement"]

TASK_ID_RE = re.compile(r"^PTX-(?P<gpu>H100|B200)-(?P<op>[A-Za-z]+)(?:-d(?P<head_dim>\d+))?$")
_C_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_CALLABLE_RE = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")
_C_TYPES: dict[str, str] = {"bfloat16": "__nv_bfloat16", "float32": "float", "int32": "int"}
DTYPE_BYTES: dict[str, int] = {"bfloat16": 2, "float32": 4, "int32": 4}


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


class TensorSpec(_Model):
    """One input or output tensor: shape as axis names, dtype, memory layout in words."""

    shape: list[str]
    dtype: DType
    layout: str = "row-major, contiguous"
    description: str = ""


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


class Tolerance(_Model):
    atol: float = Field(gt=0)
    rtol: float = Field(gt=0)


class Task(_Model):
    """One environment: an operator, a workload pool, a GPU target and the evaluation settings."""

    id: str
    family: str
    op: str
    gpu: GPU
    description: str
    definition: OpDefinition
    workloads: list[WorkloadSpec] = Field(min_length=1)
    callables: Callables
    target: Target
    entry_point: EntryPoint
    tolerance: Tolerance
    turns: int = Field(ge=1)
    # The operator's floating-point work on a workload: an expression over its axes and
    # sequences (ptxgym.tasks.expressions), counting each multiply-add of its matrix products
    # as 2 and only the pairs a causal mask keeps.
    flops: str
    # The part of that work the target family of tensor-core instructions must do for the
    # compute family to qualify (ptxgym.evaluate.profile.InstructionProfile.qualified).
    min_coverage: float = Field(ge=0.0, le=1.0)
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
        expected = render_signature(self.definition, self.entry_point)
        if _normalise(self.entry_point.signature) != _normalise(expected):
            raise ValueError(
                "entry_point.signature: does not match the definition; "
                f"from the inputs, outputs and axes it must be: {expected}"
            )
        names = {w.name for w in self.workloads}
        if len(names) != len(self.workloads):
            raise ValueError("workloads: names must be unique")
        for workload in self.workloads:
            try:
                work = self.flops_of(workload.axes, workload.sequences)
            except expressions.ExpressionError as exc:
                raise ValueError(f"flops: {exc}") from None
            if work <= 0:
                raise ValueError(f"flops: {work} on workload {workload.name!r}; it must be > 0")
        return self

    def flops_of(self, axes: Mapping[str, int], sequences: Mapping[str, list[int]]) -> int:
        """The operator's floating-point work on a workload of these axes and sequences."""
        names: dict[str, expressions.Value] = {**self.definition.const_axes, **axes}
        names.update({name: list(lengths) for name, lengths in sequences.items()})
        work = expressions.evaluate(self.flops, names)
        if type(work) is not int:
            raise expressions.ExpressionError(f"{self.flops!r} is not an integer")
        return work

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
