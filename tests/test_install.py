"""What a new user meets: the README's commands are the ones CI runs, an installed package ships
every data file the code reads, and each third-party module the code imports is declared."""

from __future__ import annotations

import ast
import configparser
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DATA_FOLDERS = ("envs", "packs", "examples")
# Import names whose distribution is named otherwise.
DISTRIBUTIONS = {
    "yaml": "pyyaml",
    "pynvml": "nvidia-ml-py",
    "cupti": "cupti-python",
    "cuda": "cuda-bindings",
    "flashinfer": "flashinfer-python",
    # lizard's distribution installs its extensions and language readers as modules of their own.
    "lizard_ext": "lizard",
    "lizard_languages": "lizard",
}


def setup_cfg() -> configparser.ConfigParser:
    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg", encoding="utf-8")
    return config


def readme_commands() -> list[str]:
    """The shell commands of the README's ```bash blocks in its Quick start section."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```bash\n(.*?)```", section, flags=re.DOTALL)
    return [line.strip() for block in blocks for line in block.splitlines() if line.strip()]


def ci_commands() -> set[str]:
    script = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    return {line.strip() for line in script.splitlines() if not line.lstrip().startswith("#")}


def test_readme_commands_are_the_ones_ci_runs() -> None:
    commands = readme_commands()
    assert "pip install -e . && ptxgym demo" in commands
    assert "pip install -e '.[dev]' && pytest" in commands
    assert [command for command in commands if command not in ci_commands()] == []


def test_every_data_file_is_installed_beside_its_folder() -> None:
    """A wheel install reads the data from <prefix>/share/ptxgym (ptxgym.paths): each file of
    envs/, packs/ and examples/ must match a data_files pattern of its own folder."""
    patterns = {
        destination: [line.strip() for line in sources.splitlines() if line.strip()]
        for destination, sources in setup_cfg()["options.data_files"].items()
    }
    missing = []
    for folder in DATA_FOLDERS:
        for path in sorted((ROOT / folder).rglob("*")):
            if not path.is_file() or "__pycache__" in path.parts:
                continue
            relative = path.relative_to(ROOT)
            destination = f"share/ptxgym/{relative.parent.as_posix()}"
            if not any(relative.match(p) for p in patterns.get(destination, [])):
                missing.append(relative.as_posix())
    assert missing == []


def requirement_names(lines: str) -> set[str]:
    return {
        re.split(r"[<>=!~\[; ]", line.strip(), maxsplit=1)[0].lower()
        for line in lines.splitlines()
        if line.strip()
    }


def module_named_in_call(node: ast.AST) -> str | None:
    """The module of an ``importlib.import_module("name")`` call, the way optional, untyped
    modules are imported."""
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "import_module"
        and node.args
        and isinstance(node.args[0], ast.Constant)
        and isinstance(node.args[0].value, str)
    ):
        return node.args[0].value
    return None


def test_every_imported_distribution_is_declared() -> None:
    """Each third-party module that ptxgym or kernels_ref imports is in install_requires or an
    extra: a dependency that only a CI script installs is missing for every user."""
    config = setup_cfg()
    declared = requirement_names(config["options"]["install_requires"])
    for extra in config["options.extras_require"].values():
        declared |= requirement_names(extra)
    first_party = {"ptxgym", "kernels_ref", "ncu_report"}  # ncu_report: Nsight Compute's own
    imported: set[str] = set()
    for package in ("ptxgym", "kernels_ref"):
        for source in (ROOT / package).rglob("*.py"):
            for node in ast.walk(ast.parse(source.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Import):
                    imported |= {alias.name.split(".")[0] for alias in node.names}
                elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                    imported.add(node.module.split(".")[0])
                elif named := module_named_in_call(node):
                    imported.add(named.split(".")[0])
    third_party = imported - set(sys.stdlib_module_names) - first_party
    undeclared = {m for m in third_party if DISTRIBUTIONS.get(m, m).lower() not in declared}
    assert undeclared == set()
