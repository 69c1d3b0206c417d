"""The scripts of benchmarks/ as modules, for their CPU tests (benchmarks/ is not a package)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def script(name: str) -> Path:
    """The path of ``benchmarks/<name>.py``."""
    return BENCHMARKS / f"{name}.py"


def load_benchmark(name: str) -> ModuleType:
    """``benchmarks/<name>.py``, imported as the module ``name``."""
    spec = importlib.util.spec_from_file_location(name, script(name))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
