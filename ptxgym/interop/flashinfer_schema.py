"""FlashInfer-Trace's schema: FlashInfer-Bench's records as pydantic models, and their files read.

The models mirror ``flashinfer_bench/data/`` (``definition.py``, ``workload.py``, ``solution.py``,
``trace.py``) of flashinfer-ai/flashinfer-bench at commit 40e6ca78: the same field names, nesting,
defaults, enum values and validators, so a dump of ours parses with theirs and theirs with ours.
ptxgym does not depend on flashinfer-bench (it needs torch); these are written from its schema.

Dumps for files use ``exclude_unset=True``, as FlashInfer-Bench's ``save_json_file`` does, so a
document read from their format dumps back to the same dict. Two kinds of field always count as
set: the ``type`` tags of axes and workload inputs, and a Trace's ``solution``/``evaluation``
(FlashInfer-Bench writes workload records with explicit nulls).
"""

from __future__ import annotations

import ast
import math
from collections.abc import Mapping
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    field_validator,
    model_validator,
)

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


def to_json(model: BaseModel, *, indent: int | None = None) -> str:
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


def read_definition(path: Path) -> Definition:
    """A Definition from a FlashInfer ``.json`` file."""
    return Definition.model_validate_json(path.read_text(encoding="utf-8"))


def read_jsonl(path: Path) -> list[Trace]:
    """Traces (workload records or evaluated) from a FlashInfer ``.jsonl`` file."""
    lines = path.read_text(encoding="utf-8").splitlines()
    return [Trace.model_validate_json(line) for line in lines if line.strip()]
