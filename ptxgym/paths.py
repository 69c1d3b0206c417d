"""Where ptxgym's data folders (``envs/``, ``packs/``, ``examples/``) live.

In a source checkout or an editable install they sit beside the package; a wheel install puts
them under ``<prefix>/share/ptxgym``. ``PTXGYM_DATA`` overrides both, for users who keep their own
task files.
"""

from __future__ import annotations

import os
import sys
from functools import cache
from pathlib import Path

_REQUIRED = ("envs", "packs")


@cache
def data_root() -> Path:
    """The folder that holds ``envs/`` and ``packs/``."""
    candidates: list[Path] = []
    if override := os.environ.get("PTXGYM_DATA"):
        candidates.append(Path(override))
    candidates += [Path(__file__).resolve().parent.parent, Path(sys.prefix) / "share" / "ptxgym"]
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
