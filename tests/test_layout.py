"""The package's layout holds: no import cycles, stages that depend one way, old names that still
import.

The import graph is read from the source (every ``import`` and ``from ... import``, including
those inside functions, which are deferred but still dependencies), with an edge from a module
to each package whose ``__init__`` its imports run. The root package's own ``__init__`` is left
out of that: every import runs it first, and it imports only the task registry.
"""

from __future__ import annotations

import ast
import importlib
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from ptxgym import _moved, paths

PACKAGE = paths.package_dir()


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(path): path for path in PACKAGE.rglob("*.py")}


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The ptxgym modules (and packages) importing ``name`` runs."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{anchor}.{base}" if base else anchor
            # "from package import module" imports the module; "from module import name" the
            # module (or package) that defines the name.
            targets = [
                f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
                for alias in node.names
            ]
        for target in targets:
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target and target not in (name, "ptxgym"):
                found.add(target)
            # Every package above the target runs its __init__ first, unless it is one above
            # the importer too (then it is already running); the root's is left out.
            above = target.rpartition(".")[0]
            while above and above != "ptxgym":
                if not (name == above or name.startswith(above + ".")):
                    found.add(above)
                above = above.rpartition(".")[0]
    return found


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(name, path, modules) for name, path in modules.items()}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as a path, or None."""
    state: dict[str, int] = {}  # 1 on the current path, 2 finished
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for successor in sorted(graph.get(node, ())):
            if state.get(successor) == 1:
                return [*path[path.index(successor) :], successor]
            if successor not in state and (found := visit(successor)):
                return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_the_graph_sees_the_imports_it_must() -> None:
    graph = _graph()
    assert "ptxgym.evaluate.judge_settings" in graph["ptxgym.evaluate.local_gpu"]
    assert "ptxgym.evaluate" in graph["ptxgym.env"]  # the __init__ of the package imported from
    assert "ptxgym.evaluate.local_gpu" in graph["ptxgym.evaluate.evaluator"]  # a deferred import
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]


def test_no_module_import_cycle() -> None:
    assert _cycle(_graph()) is None


def _stage_imports() -> dict[str, set[str]]:
    """Subpackage (or top module) -> the other subpackages and top modules its modules import."""
    stages: dict[str, set[str]] = {}
    for module, imported in _graph().items():
        source = module.split(".")[1] if "." in module else module
        for target in imported:
            destination = target.split(".")[1]
            if destination != source:
                stages.setdefault(source, set()).add(destination)
    return stages


def _documented() -> dict[str, set[str]]:
    """docs/architecture.md's table: subpackage -> what it may import."""
    table = (paths.data_root() / "docs" / "architecture.md").read_text(encoding="utf-8")
    rows = re.findall(r"^\| `(\w+)` \|[^|]*\| (.*) \|$", table, re.MULTILINE)
    return {name: set(re.findall(r"`(\w+)`", allowed)) for name, allowed in rows}


def test_architecture_md_describes_every_subpackage_and_its_imports() -> None:
    documented = _documented()
    subpackages = {path.parent.name for path in PACKAGE.glob("*/__init__.py")}
    assert set(documented) == subpackages
    actual = _stage_imports()
    for subpackage, allowed in documented.items():
        assert actual.get(subpackage, set()) <= allowed, (subpackage, actual[subpackage] - allowed)


def test_stages_depend_one_way() -> None:
    # Every stage, a subpackage or a module at the top (outcome, wrappers, ...): none imports
    # one that imports it back, even where no single module closes a cycle.
    stages = _stage_imports()
    assert _cycle(stages) is None, stages


@pytest.mark.parametrize("old", sorted(_moved.MOVED))
def test_old_module_names_import_with_a_deprecation_warning(old: str) -> None:
    """Each old name, imported in a fresh interpreter, warns and gives the new module's names."""
    new = importlib.import_module(_moved.MOVED[old])
    name = next(
        n for n in sorted(getattr(new, "__all__", None) or dir(new)) if not n.startswith("_")
    )
    script = (
        "import warnings; warnings.simplefilter('error', DeprecationWarning)\n"
        "try:\n"
        f"    import {old}\n"
        "except DeprecationWarning as warning:\n"
        "    print('warned:', warning)\n"
        "warnings.simplefilter('ignore', DeprecationWarning)\n"
        f"import {old} as old, {_moved.MOVED[old]} as new\n"
        f"assert getattr(old, {name!r}) is getattr(new, {name!r})\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        check=False,
        cwd=PACKAGE.parent,
    )
    assert result.returncode == 0, result.stderr
    assert f"warned: {old} moved to {_moved.MOVED[old]}" in result.stdout


# A name of each split that the module it left no longer holds, and where it went.
SPLIT_NAMES = [
    ("ptxgym.judge", "OutputChecks", "ptxgym.evaluate.conversation"),
    ("ptxgym.report", "report_figure", "ptxgym.bench.plots"),
    ("ptxgym.trace", "DType", "ptxgym.interop.flashinfer_schema"),
]


def test_every_split_has_an_example() -> None:
    assert {_moved.MOVED[old] for old, _, _ in SPLIT_NAMES} == set(_moved.SPLIT)


@pytest.mark.parametrize(("old", "name", "home"), SPLIT_NAMES)
def test_an_old_name_still_gives_what_left_its_module_in_a_split(
    old: str, name: str, home: str
) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        old_module = importlib.import_module(old)
    assert not hasattr(importlib.import_module(_moved.MOVED[old]), name)
    assert getattr(old_module, name) is getattr(importlib.import_module(home), name)
    with pytest.raises(AttributeError, match=f"module '{old}' has no attribute 'no_such_name'"):
        _ = old_module.no_such_name


def test_new_names_import_without_warnings() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        for name in _modules():
            if name != "ptxgym.__main__":  # that one runs the command line
                importlib.import_module(name)


def test_readme_layout_lists_every_module() -> None:
    """README's layout names each subpackage with exactly its modules, and the top modules."""
    readme = (paths.data_root() / "README.md").read_text(encoding="utf-8")
    block = readme.split("## Layout", 1)[1].split("envs/ ", 1)[0]
    text = " ".join(block.split())
    for folder in sorted({path.parent for path in PACKAGE.rglob("__init__.py")} - {PACKAGE}):
        listed = re.search(rf"{folder.relative_to(PACKAGE).as_posix()}/ \(([^)]*)\)", text)
        assert listed, f"README's layout does not list {folder.name}/"
        modules = {path.stem for path in folder.glob("*.py") if path.stem != "__init__"}
        assert set(re.findall(r"\w+", listed.group(1))) == modules, folder
    top = re.search(r"at the top ([\w, ]+)", text)
    assert top
    modules = {path.stem for path in PACKAGE.glob("*.py")} - {"__init__", "__main__", "_moved"}
    assert set(re.findall(r"\w+", top.group(1))) == modules
