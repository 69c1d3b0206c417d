"""tests/gpu/pack_h100_wrappers.cu (the GPU checks of the Hopper pack) still compiles cleanly.

The program itself runs only on an sm_90 GPU (tests/gpu/test_pack_wrappers.py); this test
compiles it to an object with the same flags, so a change to packs/h100/wrappers.cuh that breaks
the checks is caught where there is nvcc but no GPU.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.nvcc


def test_pack_h100_checks_compile_without_warnings(
    tmp_path: Path, pack_h100_build: list[str]
) -> None:
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("nvcc is not on PATH: cannot compile pack_h100_wrappers.cu")
    obj = tmp_path / "pack_h100_wrappers.o"
    cmd = [
        nvcc,
        *pack_h100_build,
        "-Xcompiler",
        "-Wall,-Wextra",
        "-c",
        "-o",
        str(obj),
    ]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
    log = result.stdout + result.stderr
    assert result.returncode == 0, f"nvcc failed\n{' '.join(cmd)}\n{log}"
    assert "warning" not in log.lower(), f"nvcc printed warnings\n{log}"
    assert "C7508" not in log, f"setmaxnreg ignored by ptxas\n{log}"
    assert obj.stat().st_size > 0
