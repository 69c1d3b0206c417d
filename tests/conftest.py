"""Shared test setup: a private build cache, GPU tests skipped where there is no GPU, how the
H100 pack's checks are built (by their CPU build test and their GPU run alike), and how the
docs' snippets run as plain scripts (on CPU and on a GPU host alike)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from ptxgym.device.gpus import visible_gpus


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    skips = {}
    if not visible_gpus():
        skips["gpu"] = "needs an NVIDIA GPU (run `pytest -m gpu` on a GPU host)"
    if shutil.which("nvcc") is None:
        skips["nvcc"] = "needs nvcc (the CUDA toolkit)"
    for item in items:
        for marker, reason in skips.items():
            if marker in item.keywords:
                item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture(autouse=True, scope="session")
def private_build_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Keep test builds out of the user's cache; shared across the session so cache hits show."""
    cache = tmp_path_factory.mktemp("ptxgym-cache")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PTXGYM_CACHE", str(cache))
        yield cache


@pytest.fixture(scope="session")
def pack_h100_build() -> list[str]:
    """nvcc's flags and source for tests/gpu/pack_h100_wrappers.cu (the caller adds nvcc, the
    output and any flags of its own): the CPU test that it builds without warnings and the GPU
    test that runs it must build the same thing."""
    repo = Path(__file__).resolve().parent.parent
    return [
        "-std=c++17",
        "-O2",
        "-gencode",
        "arch=compute_90a,code=sm_90a",
        "-I",
        str(repo / "packs" / "h100"),
        str(repo / "tests" / "gpu" / "pack_h100_wrappers.cu"),
    ]


@pytest.fixture
def run_script(tmp_path: Path) -> Callable[[str], subprocess.CompletedProcess[str]]:
    """Runs Python code as a plain script of its own (no ``__main__`` guard added, nothing
    defined ahead of it) in a fresh folder, importing this checkout's ptxgym."""
    root = Path(__file__).resolve().parents[1]

    def run(code: str) -> subprocess.CompletedProcess[str]:
        script = tmp_path / "snippet.py"
        script.write_text(code, encoding="utf-8")
        return subprocess.run(
            [sys.executable, str(script)],
            capture_output=True,
            text=True,
            timeout=600,
            cwd=tmp_path,
            env={**os.environ, "PYTHONPATH": os.pathsep.join([str(root), *sys.path])},
            check=False,
        )

    return run
