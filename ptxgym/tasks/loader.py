"""Task files: the loader and its validation.

``envs/targets/<gpu>.yaml`` describes a GPU target (architecture, nvcc flags, instruction
families that qualify, knowledge pack); ``envs/ops/<family>.yaml`` describes an operator family
(definition, workloads, reference/baseline callables, entry point) once, with per-task overrides,
for each GPU it lists. The loader merges the two, resolves every workload's axes, and validates
the result into :mod:`ptxgym.tasks.schema` records. A bad file is rejected with a
:class:`TaskFileError` that names the file, the field and the problem.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import cache
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from ptxgym import paths
from ptxgym.tasks import expressions
from ptxgym.tasks.schema import (
    Target,
    Task,
    TaskFileError,
    WorkloadSpec,
)

# libyaml's parser where PyYAML was built with it (its wheels are): importing ptxgym loads every
# task file, and every process of an evaluation imports ptxgym (the judge, each sanitizer and count
# run). The 122 tasks took 0.42-0.48 CPU-seconds with the pure-Python parser, 0.11-0.12 with it.
_SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        data = yaml.load(path.read_text(encoding="utf-8"), Loader=_SAFE_LOADER)
    except yaml.YAMLError as exc:
        raise TaskFileError(f"{path}: not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise TaskFileError(f"{path}: the top level must be a mapping")
    return data


def _deep_merge(base: Mapping[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    """``override`` merged into ``base``, mappings recursively; a null in ``override`` removes
    the key (an entry that drops an axis or a tensor of its family's defaults)."""
    merged = dict(base)
    for key, value in override.items():
        if value is None:
            merged.pop(key, None)
        elif isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
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


def workload_for(
    task: Task,
    name: str,
    axes: Mapping[str, int],
    sequences: Mapping[str, Any] | None = None,
) -> WorkloadSpec:
    """A workload of ``task`` other than its own (e.g. a small one for a CPU test): the derived
    axes computed and the constraints checked exactly as the loader does for the task file's."""
    raw = {"name": name, "axes": dict(axes), "sequences": dict(sequences or {})}
    definition = task.definition.model_dump()
    resolved = _resolve_workload(raw, task.derived_axes, definition, f"{task.id}: {name}")
    return WorkloadSpec.model_validate(resolved)


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
    "category",
    "kind",
    "description",
    "definition",
    "derived_axes",
    "workloads",
    "callables",
    "entry_point",
    "tolerance",
    "outlier_tolerance",
    "turns",
    "flops",
    "bytes",
    "min_coverage",
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
    fields = {k: v for k, v in merged.items() if k != "suffix"}
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
