"""Which NVIDIA GPUs this machine has, read with nvidia-smi so that no CUDA context is created."""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import subprocess
from dataclasses import dataclass
from functools import cache


@dataclass(frozen=True)
class GPUInfo:
    index: int
    name: str
    capability: tuple[int, int]
    driver: str


@cache
def visible_gpus() -> tuple[GPUInfo, ...]:
    """GPUs as nvidia-smi lists them; read without creating a CUDA context here."""
    if not shutil.which("nvidia-smi"):
        return ()
    result = subprocess.run(
        [
            "nvidia-smi",
            "--query-gpu=index,name,compute_cap,driver_version",
            "--format=csv,noheader",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    gpus = []
    for line in result.stdout.splitlines() if result.returncode == 0 else []:
        try:
            index, name, capability, driver = (part.strip() for part in line.split(","))
            major, minor = capability.split(".")
            gpus.append(GPUInfo(int(index), name, (int(major), int(minor)), driver))
        except ValueError:
            continue
    return tuple(gpus)


def physical_device(device: int) -> str:
    """CUDA device ``device`` of this process, as a child process must name it in
    CUDA_VISIBLE_DEVICES (this process may itself see a subset of the GPUs)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if not visible:
        return str(device)
    return visible.split(",")[device].strip()


def initialize_driver() -> None:
    """Load and initialise the CUDA driver (``cuInit``) without making a context.

    A tool's injection library (Nsight Compute, compute-sanitizer) loads here, which takes
    longer than the context itself; none of it runs on the GPU, so it need not wait for, or
    hold, the GPU lock (``ptxgym.gpu_lock``): only the context that follows does. A failure is
    left for the context's creation to report, in CUDA's own words.
    """
    with contextlib.suppress(OSError):  # no driver here: the context's creation says so
        ctypes.CDLL("libcuda.so.1").cuInit(0)


def make_context(device: int) -> None:
    """Make this process's CUDA context on ``device`` and make it torch's current device,
    launching nothing of ours on the GPU (no kernel, copy or memset). The driver's own work for
    a new context still moves a long kernel's timing in another process, so callers hold the GPU
    shared (``ptxgym.gpu_lock``). Under a tool (Nsight Compute, compute-sanitizer) the tool's
    injection loads here too, unless ``initialize_driver`` loaded it before."""
    import torch

    torch.cuda.set_device(device)
    torch.cuda.synchronize()  # the first call that needs the context makes it
