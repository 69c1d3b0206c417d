"""A task's reference as one self-contained Python source, for a FlashInfer-Trace Definition:
the reference module with the ``kernels_ref`` modules it imports inlined ahead of it, and a
generated ``run`` entry point."""

from __future__ import annotations

import ast
import keyword
from pathlib import Path
from typing import Any

from ptxgym import tasks as _tasks
from ptxgym.interop.flashinfer_schema import TraceExportError

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
