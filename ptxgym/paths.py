"""Where ptxgym's data folders (``envs/``, ``packs/``, ``examples/``), its cache, and the CUDA
tools it runs live.

In a source checkout or an editable install they sit beside the package; a wheel install puts
them under ``<prefix>/share/ptxgym``. ``PTXGYM_DATA`` overrides both, for users who keep their own
task files.
"""

from __future__ import annotations

import os
import shutil
import sys
from functools import cache
from pathlib import Path

_REQUIRED = ("envs", "packs")


def package_dir() -> Path:
    """The folder of the ``ptxgym`` package itself."""
    return Path(__file__).resolve().parent


def import_root() -> Path:
    """The folder ``ptxgym`` is imported from (a checkout, or site-packages)."""
    return package_dir().parent


@cache
def data_root() -> Path:
    """The folder that holds ``envs/`` and ``packs/``."""
    candidates: list[Path] = []
    if override := os.environ.get("PTXGYM_DATA"):
        candidates.append(Path(override))
    candidates += [import_root(), Path(sys.prefix) / "share" / "ptxgym"]
    for root in candidates:
        if all((root / name).is_dir() for name in _REQUIRED):
            return root
    tried = ", ".join(str(c) for c in candidates)
    raise FileNotFoundError(
        f"ptxgym's data folders (envs/, packs/) were not found; looked in: {tried}. "
        "Install ptxgym from its repository (pip install -e .) or set PTXGYM_DATA."
    )


def envs_dir() -> Path:
    return data_root() / "envs"


def packs_dir() -> Path:
    return data_root() / "packs"


def examples_dir() -> Path:
    return data_root() / "examples"


def cache_dir() -> Path:
    """Per-user cache (builds); ``PTXGYM_CACHE`` overrides, else ``$XDG_CACHE_HOME/ptxgym``."""
    if override := os.environ.get("PTXGYM_CACHE"):
        return Path(override)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "ptxgym"


def lock_dir() -> Path:
    """The GPU locks' folder (ptxgym.device.lock): ``PTXGYM_LOCK_DIR``, else one folder for the
    whole machine, whatever each process's cache folder is, so that every ptxgym process on a GPU
    takes turns with every other."""
    if override := os.environ.get("PTXGYM_LOCK_DIR"):
        return Path(override)
    return Path("/tmp/ptxgym-gpu-locks")


def cuda_tool(name: str, override: str | None = None) -> str | None:
    """A CUDA command-line tool: the file that environment variable ``override`` names (and
    nothing else when it is set), else ``name`` on PATH, else in ``$CUDA_HOME/bin``."""
    if override is not None and (named := os.environ.get(override)):
        return named if Path(named).is_file() else None
    home = Path(os.environ.get("CUDA_HOME", "/usr/local/cuda")) / "bin" / name
    return shutil.which(name) or shutil.which(str(home))
