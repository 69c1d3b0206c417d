"""Least privilege for candidate processes, on the CPU: the scrubbed environment and confine()."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from ptxgym.isolation import MAX_FILE_BYTES, scrubbed_environment


def test_only_what_cuda_and_python_need_is_kept(tmp_path: Path) -> None:
    base = {
        "PATH": "/usr/bin",
        "LD_LIBRARY_PATH": "/usr/local/cuda/lib64",
        "CUDA_VISIBLE_DEVICES": "3",
        "NVIDIA_DRIVER_CAPABILITIES": "compute",
        "PYTHONPATH": "/site",
        "HOME": "/root",
        "AWS_SECRET_ACCESS_KEY": "secret",
        "HF_TOKEN": "secret",
        "PTXGYM_CACHE": "/root/.cache/ptxgym",
        "SSH_AUTH_SOCK": "/tmp/agent",
    }
    environment = scrubbed_environment(tmp_path, base)
    assert environment == {
        "PATH": "/usr/bin",
        "LD_LIBRARY_PATH": "/usr/local/cuda/lib64",
        "CUDA_VISIBLE_DEVICES": "3",
        "NVIDIA_DRIVER_CAPABILITIES": "compute",
        "PYTHONPATH": "/site",
        "HOME": str(tmp_path),
        "TMPDIR": str(tmp_path),
    }


_PROBE = """
import ctypes, json, os, resource, sys
from pathlib import Path
from ptxgym.isolation import confine
facts = confine(Path(sys.argv[1]))
print(json.dumps({
    "facts": facts,
    "cwd": os.getcwd(),
    "secret": os.environ.get("PTXGYM_TEST_SECRET"),
    "c_getenv": ctypes.CDLL(None).getenv(b"PTXGYM_TEST_SECRET"),
    "home": os.environ["HOME"],
    "fsize": resource.getrlimit(resource.RLIMIT_FSIZE)[0],
    "core": resource.getrlimit(resource.RLIMIT_CORE)[0],
}))
"""


def test_confine_scrubs_moves_and_limits_the_process(tmp_path: Path) -> None:
    folder = tmp_path / "worker"
    result = subprocess.run(
        [sys.executable, "-c", _PROBE, str(folder)],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PTXGYM_TEST_SECRET": "hunter2"},
    )
    facts = json.loads(result.stdout)
    assert facts["cwd"] == str(folder) and facts["home"] == str(folder)
    assert facts["secret"] is None
    assert facts["c_getenv"] == 0  # gone from the C library's environment too (NULL)
    assert facts["fsize"] == MAX_FILE_BYTES and facts["core"] == 0
    assert isinstance(facts["facts"]["network_isolated"], bool)
