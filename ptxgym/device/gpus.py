"""Which NVIDIA GPUs this machine has, read through NVML (nvidia-ml-py's ``pynvml``) where it is
installed and from nvidia-smi's text otherwise; neither creates a CUDA context."""

from __future__ import annotations

import contextlib
import ctypes
import importlib
import os
import shutil
import subprocess
from dataclasses import dataclass
from functools import cache
from typing import Any


@dataclass(frozen=True)
class GPUInfo:
    index: int
    name: str
    capability: tuple[int, int]
    driver: str


@cache
def visible_gpus() -> tuple[GPUInfo, ...]:
    """GPUs in NVML's order (nvidia-smi's indices), without creating a CUDA context here."""
    try:
        # By name: nvidia-ml-py is optional (the ``gpu`` extra) and has no type information.
        nvml = importlib.import_module("pynvml")
    except ImportError:
        return _gpus_from_nvidia_smi()
    try:
        return _gpus_from_nvml(nvml)
    except nvml.NVMLError:  # no NVML library or driver: nvidia-smi says what there is
        return _gpus_from_nvidia_smi()


def _gpus_from_nvml(nvml: Any) -> tuple[GPUInfo, ...]:
    nvml.nvmlInit()
    try:
        driver = _text(nvml.nvmlSystemGetDriverVersion())
        gpus = []
        for index in range(nvml.nvmlDeviceGetCount()):
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            major, minor = nvml.nvmlDeviceGetCudaComputeCapability(handle)
            name = _text(nvml.nvmlDeviceGetName(handle))
            gpus.append(GPUInfo(index, name, (int(major), int(minor)), driver))
        return tuple(gpus)
    finally:
        nvml.nvmlShutdown()


def _text(value: str | bytes) -> str:
    """NVML's strings: ``str`` in current nvidia-ml-py, ``bytes`` in releases before 11.5."""
    return value.decode() if isinstance(value, bytes) else value


def _gpus_from_nvidia_smi() -> tuple[GPUInfo, ...]:
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
    hold, the GPU lock (``ptxgym.device.lock``): only the context that follows does. A failure is
    left for the context's creation to report, in CUDA's own words.
    """
    with contextlib.suppress(OSError):  # no driver here: the context's creation says so
        ctypes.CDLL("libcuda.so.1").cuInit(0)


def make_context(device: int) -> None:
    """Make this process's CUDA context on ``device`` and make it torch's current device,
    launching nothing of ours on the GPU (no kernel, copy or memset). The driver's own work for
    a new context still moves a long kernel's timing in another process, so callers hold the GPU
    shared (``ptxgym.device.lock``). Under a tool (Nsight Compute, compute-sanitizer) the tool's
    injection loads here too, unless ``initialize_driver`` loaded it before."""
    import torch

    torch.cuda.set_device(device)
    torch.cuda.synchronize()  # the first call that needs the context makes it
