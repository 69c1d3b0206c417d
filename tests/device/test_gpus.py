"""Finding the GPUs (``ptxgym.device.gpus.visible_gpus``): through NVML where nvidia-ml-py is
installed, from nvidia-smi otherwise. No GPU: both are stood in for."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest

from ptxgym.device import gpus
from ptxgym.device.gpus import GPUInfo, visible_gpus


@pytest.fixture(autouse=True)
def fresh_answer() -> Iterator[None]:
    visible_gpus.cache_clear()
    yield
    visible_gpus.cache_clear()


class NVMLError(Exception):
    pass


def stand_in_nvml(*, fails: bool = False) -> ModuleType:
    """pynvml's calls that ``visible_gpus`` makes, for two H200s (one name as old releases'
    bytes); ``fails``: no NVML library, as on a machine without the driver."""
    nvml = ModuleType("pynvml")
    calls: list[str] = []

    def init() -> None:
        calls.append("init")
        if fails:
            raise NVMLError("NVML Shared Library Not Found")

    names = ["NVIDIA H200", b"NVIDIA H200 NVL"]
    nvml.__dict__.update(
        NVMLError=NVMLError,
        calls=calls,
        nvmlInit=init,
        nvmlShutdown=lambda: calls.append("shutdown"),
        nvmlSystemGetDriverVersion=lambda: "580.95.05",
        nvmlDeviceGetCount=lambda: 2,
        nvmlDeviceGetHandleByIndex=lambda index: index,
        nvmlDeviceGetName=lambda handle: names[handle],
        nvmlDeviceGetCudaComputeCapability=lambda handle: (9, 0),
    )
    return nvml


def stand_in_nvidia_smi(monkeypatch: pytest.MonkeyPatch, calls: list[list[str]]) -> None:
    def run(command: list[str], **_: Any) -> SimpleNamespace:
        calls.append(command)
        return SimpleNamespace(returncode=0, stdout="0, NVIDIA H100 80GB HBM3, 9.0, 570.1\n")

    monkeypatch.setattr(gpus.shutil, "which", lambda name: f"/usr/bin/{name}")
    monkeypatch.setattr(gpus.subprocess, "run", run)


def test_nvml_is_used_where_it_is_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    nvml = stand_in_nvml()
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    smi: list[list[str]] = []
    stand_in_nvidia_smi(monkeypatch, smi)
    assert visible_gpus() == (
        GPUInfo(0, "NVIDIA H200", (9, 0), "580.95.05"),
        GPUInfo(1, "NVIDIA H200 NVL", (9, 0), "580.95.05"),
    )
    assert smi == [] and nvml.calls == ["init", "shutdown"]


@pytest.mark.parametrize("nvml", [None, stand_in_nvml(fails=True)], ids=["absent", "no_library"])
def test_nvidia_smi_is_the_fallback(
    monkeypatch: pytest.MonkeyPatch, nvml: ModuleType | None
) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", nvml)  # None: the import fails
    smi: list[list[str]] = []
    stand_in_nvidia_smi(monkeypatch, smi)
    assert visible_gpus() == (GPUInfo(0, "NVIDIA H100 80GB HBM3", (9, 0), "570.1"),)
    assert len(smi) == 1 and smi[0][0] == "nvidia-smi"


def test_no_gpu_tool_means_no_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)
    monkeypatch.setattr(gpus.shutil, "which", lambda name: None)
    monkeypatch.setattr(gpus.subprocess, "run", subprocess_must_not_run)
    assert visible_gpus() == ()


def subprocess_must_not_run(*args: Any, **kwargs: Any) -> None:
    raise AssertionError(f"ran {args}")
