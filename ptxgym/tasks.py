"""Task files: schema, loader and validation.

A task is data. ``envs/targets/<gpu>.yaml`` describes a GPU target (architecture, nvcc flags,
instruction families that qualify, knowledge pack); ``envs/ops/<family>.yaml`` describes an operator
family (definition, workloads, reference/baseline callables, entry point) once, with per-task
overrides, for each GPU it lists. The loader merges the two, resolves every workload's axes, and
validates the result. A bad file is rejected with a :class:`TaskFileError` that names the file, the
field and the problem.
"""

from __future__ import annotations

import ast
import importlib.util
import re
from collections.abc import Mapping
from functools import cache
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from ptxgym import expressions, paths

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
        return self

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


# --------------------------------------------------------------------------------------------
# Loading


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise TaskFileError(f"{path}: not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise TaskFileError(f"{path}: the top level must be a mapping")
    return data


def _deep_merge(base: Mapping[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in override.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = _deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def _format_validation(error: ValidationError) -> str:
    lines = []
    for item in error.errors():
        loc = ".".join(str(part) for part in item["loc"])
        message = str(item["msg"]).removeprefix("Value error, ")
        lines.append(f"{loc}: {message}" if loc else message)
    return "; ".join(lines)


def _expand_sequence(spec: Any, where: str) -> list[int]:
    """A sequence is a list of ints, ``{repeat: L, count: N}`` or ``{cycle: [..], count: N}``."""
    if isinstance(spec, list) and spec and all(type(x) is int and x > 0 for x in spec):
        return list(spec)
    if isinstance(spec, dict) and set(spec) == {"repeat", "count"}:
        value, count = spec["repeat"], spec["count"]
        if type(value) is int and type(count) is int and value > 0 and count > 0:
            return [value] * count
    if isinstance(spec, dict) and set(spec) == {"cycle", "count"}:
        cycle, count = spec["cycle"], spec["count"]
        if (
            isinstance(cycle, list)
            and cycle
            and all(type(x) is int and x > 0 for x in cycle)
            and type(count) is int
            and count > 0
        ):
            return [cycle[i % len(cycle)] for i in range(count)]
    raise TaskFileError(
        f"{where}: expected a list of positive ints, {{repeat: L, count: N}} or "
        f"{{cycle: [L1, L2, ...], count: N}}, got {spec!r}"
    )


def _resolve_workload(
    raw: Any, derived: Mapping[str, str], definition: Mapping[str, Any], where: str
) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise TaskFileError(f"{where}: a workload must be a mapping")
    extra = set(raw) - {"name", "description", "axes", "sequences"}
    if extra:
        raise TaskFileError(f"{where}: unknown fields {sorted(extra)}")
    name = raw.get("name")
    if not isinstance(name, str) or not name:
        raise TaskFileError(f"{where}.name: a non-empty string is required")
    axes_raw = raw.get("axes", {})
    if not isinstance(axes_raw, dict) or not all(
        type(v) is int and v > 0 for v in axes_raw.values()
    ):
        raise TaskFileError(f"{where}.axes: expected a mapping of axis name to positive int")
    sequences = {
        key: _expand_sequence(spec, f"{where}.sequences.{key}")
        for key, spec in (raw.get("sequences") or {}).items()
    }
    axis_defs = definition.get("axes", {})
    consts = {n: a["value"] for n, a in axis_defs.items() if isinstance(a, dict) and "value" in a}
    names: dict[str, expressions.Value] = {**consts, **axes_raw, **sequences}
    axes = dict(axes_raw)
    for axis, expression in derived.items():
        if axis in axes:
            continue
        try:
            value = expressions.evaluate(expression, names)
        except expressions.ExpressionError as exc:
            raise TaskFileError(f"{where}: derived axis {axis}: {exc}") from None
        if type(value) is not int or value <= 0:
            raise TaskFileError(f"{where}: derived axis {axis} = {value!r}, not a positive int")
        axes[axis] = names[axis] = value
    var_axes = {n for n, a in axis_defs.items() if isinstance(a, dict) and a.get("type") == "var"}
    if set(axes) != var_axes:
        missing, unknown = sorted(var_axes - set(axes)), sorted(set(axes) - var_axes)
        raise TaskFileError(
            f"{where}.axes: must set exactly the var axes; missing {missing}, not var {unknown}"
        )
    for constraint in definition.get("constraints", []):
        try:
            holds = expressions.evaluate(constraint, names)
        except expressions.ExpressionError as exc:
            raise TaskFileError(f"{where}: constraint: {exc}") from None
        if holds is not True:
            raise TaskFileError(f"{where}: constraint {constraint!r} does not hold")
    return {
        "name": name,
        "description": raw.get("description", ""),
        "axes": axes,
        "sequences": sequences,
    }


def load_targets(directory: Path) -> dict[str, Target]:
    targets: dict[str, Target] = {}
    for path in sorted(directory.glob("*.yaml")):
        try:
            target = Target.model_validate(_read_yaml(path))
        except ValidationError as exc:
            raise TaskFileError(f"{path}: {_format_validation(exc)}") from None
        if target.gpu in targets:
            raise TaskFileError(f"{path}: gpu: a second target for {target.gpu}")
        targets[target.gpu] = target
    return targets


_FAMILY_FIELDS = {"family", "gpus", "defaults", "tasks"}
_TASK_FIELDS = {
    "op",
    "suffix",
    "description",
    "definition",
    "derived_axes",
    "workloads",
    "callables",
    "entry_point",
    "tolerance",
    "turns",
}


def load_family_file(path: Path, targets: Mapping[str, Target]) -> list[Task]:
    """All tasks of one operator-family file, one per (task entry, GPU)."""
    data = _read_yaml(path)
    extra = set(data) - _FAMILY_FIELDS
    if extra:
        raise TaskFileError(f"{path}: unknown top-level fields {sorted(extra)}")
    family = data.get("family")
    if not isinstance(family, str) or not family:
        raise TaskFileError(f"{path}: family: a non-empty string is required")
    gpus = data.get("gpus")
    if not isinstance(gpus, list) or not gpus:
        raise TaskFileError(f"{path}: gpus: a non-empty list is required")
    for gpu in gpus:
        if gpu not in targets:
            raise TaskFileError(
                f"{path}: gpus: no target file for {gpu!r} (known: {sorted(targets)})"
            )
    defaults = data.get("defaults", {})
    entries = data.get("tasks")
    if not isinstance(defaults, dict):
        raise TaskFileError(f"{path}: defaults: must be a mapping")
    if not isinstance(entries, list) or not entries:
        raise TaskFileError(f"{path}: tasks: a non-empty list is required")

    tasks = []
    for index, entry in enumerate(entries):
        if not isinstance(entry, dict):
            raise TaskFileError(f"{path}: tasks[{index}]: must be a mapping")
        merged = _deep_merge(defaults, entry)
        extra = set(merged) - _TASK_FIELDS
        if extra:
            raise TaskFileError(f"{path}: tasks[{index}]: unknown fields {sorted(extra)}")
        for gpu in gpus:
            tasks.append(_build_task(path, index, merged, family, targets[gpu]))
    return tasks


def _build_task(
    path: Path, index: int, merged: dict[str, Any], family: str, target: Target
) -> Task:
    op = merged.get("op")
    suffix = merged.get("suffix")
    task_id = f"PTX-{target.gpu}-{op}" + (f"-{suffix}" if suffix else "")
    where = f"{path}: tasks[{index}] ({task_id})"
    definition = merged.get("definition")
    if not isinstance(definition, dict):
        raise TaskFileError(f"{where}: definition: a mapping is required")
    derived = merged.get("derived_axes", {})
    if not isinstance(derived, dict) or not all(isinstance(v, str) for v in derived.values()):
        raise TaskFileError(f"{where}: derived_axes: expected a mapping of axis to expression")
    raw_workloads = merged.get("workloads")
    if not isinstance(raw_workloads, list) or not raw_workloads:
        raise TaskFileError(f"{where}: workloads: a non-empty list is required")
    workloads = [
        _resolve_workload(w, derived, definition, f"{where}: workloads[{i}]")
        for i, w in enumerate(raw_workloads)
    ]
    fields = {k: v for k, v in merged.items() if k not in ("suffix", "derived_axes")}
    try:
        return Task.model_validate(
            {
                **fields,
                "id": task_id,
                "family": family,
                "gpu": target.gpu,
                "target": target,
                "workloads": workloads,
                "source": str(path),
            }
        )
    except ValidationError as exc:
        raise TaskFileError(f"{where}: {_format_validation(exc)}") from None


def load_tasks(envs: Path | None = None) -> dict[str, Task]:
    """Every task under ``envs`` (default: the package's ``envs/``), keyed by id, in file order."""
    root = envs or paths.envs_dir()
    targets = load_targets(root / "targets")
    tasks: dict[str, Task] = {}
    for path in sorted((root / "ops").glob("*.yaml")):
        for task in load_family_file(path, targets):
            if task.id in tasks:
                raise TaskFileError(
                    f"{path}: id {task.id} is already defined in {tasks[task.id].source}"
                )
            tasks[task.id] = task
    return tasks


@cache
def registry() -> dict[str, Task]:
    """The package's tasks, loaded once per process."""
    return load_tasks()


def get_task(task_id: str) -> Task:
    """The task with this id; a clear error names close matches."""
    tasks = registry()
    if task_id not in tasks:
        close = [t for t in tasks if task_id.lower() in t.lower()][:5]
        hint = f" Did you mean: {', '.join(close)}?" if close else " See `ptxgym list`."
        raise KeyError(f"unknown task {task_id!r}.{hint}")
    return tasks[task_id]
