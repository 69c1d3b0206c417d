"""The Hopper pack's wrappers (packs/h100/wrappers.cuh) checked on an sm_90 GPU (``pytest -m gpu``).

``pack_h100_wrappers.cu`` beside this file is built once with nvcc and run; it prints one
``CHECK <name> <value> <limit>`` line per check (pass: value <= limit). Each expected check is one
test case, so a check that goes missing from the output fails too.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass

import pytest

from ptxgym.device.gpus import visible_gpus

pytestmark = pytest.mark.gpu

BUILD_TIMEOUT_S = 300
RUN_TIMEOUT_S = 120

EXPECTED_CHECKS = [
    "device_compute_capability_9_0",
    "device_smem_per_block_optin",
    "device_smem_per_sm",
    "device_reserved_smem_per_block",
    "device_registers_per_sm",
    "device_registers_per_block",
    "device_max_threads_per_sm",
    "device_max_blocks_per_sm",
    "tensor_map_encode_2d",
    "tensor_map_encode_3d",
    "tensor_map_rejects_box128_sw128",
    "tma_load_2d_swizzle128",
    "tma_load_3d_swizzle128",
    "wgmma_ss_k_major_n64",
    "wgmma_ss_k_major_n96",
    "wgmma_ss_k_major_n128",
    "wgmma_ss_k_major_n192",
    "wgmma_ss_k_major_n256",
    "wgmma_rs_formula_fragment_n256",
    "wgmma_rs_ldmatrix_fragment_n256",
    "wgmma_ss_mn_major_b_n256",
    "wgmma_rs_mn_major_b_n256",
    "tma_store_stmatrix_swizzle",
    "cluster_multicast_tma",
    "mbarrier_remote_arrive",
    "mbarrier_remote_arrive_cta",
    "dsmem_store_remote",
    "dsmem_load_remote",
    "cluster_nctarank",
    "cluster_id_x",
    "cluster_ctarank",
    "setmaxnreg_dec_producers",
    "setmaxnreg_inc_consumers",
]

_CHECK_RE = re.compile(r"^CHECK (\S+) (\S+) (\S+)$")


@dataclass(frozen=True)
class Check:
    line: str
    value: float
    limit: float


@dataclass(frozen=True)
class Run:
    returncode: int
    output: str
    checks: dict[str, Check]


def _environment() -> dict[str, str]:
    """Run on the first sm_90 GPU, unless the caller already chose GPUs."""
    env = dict(os.environ)
    if "CUDA_VISIBLE_DEVICES" not in env:
        hopper = next(gpu for gpu in visible_gpus() if gpu.capability == (9, 0))
        # nvidia-smi numbers GPUs in PCI bus order; make CUDA number them the same way.
        env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
        env["CUDA_VISIBLE_DEVICES"] = str(hopper.index)
    return env


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory, pack_h100_build: list[str]) -> Run:
    if not any(gpu.capability == (9, 0) for gpu in visible_gpus()):
        have = ", ".join(
            f"{g.name} (sm_{g.capability[0]}{g.capability[1]})" for g in visible_gpus()
        )
        pytest.skip(f"needs an sm_90 (Hopper) GPU; visible: {have or 'none'}")
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("needs nvcc (the CUDA toolkit) to build pack_h100_wrappers.cu")
    binary = tmp_path_factory.mktemp("pack_h100_wrappers") / "pack_h100_wrappers"
    cmd = [nvcc, *pack_h100_build, "-o", str(binary)]
    build = subprocess.run(
        cmd, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S, check=False
    )
    assert build.returncode == 0, f"nvcc failed\n{' '.join(cmd)}\n{build.stdout}{build.stderr}"
    result = subprocess.run(
        [str(binary)],
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        env=_environment(),
        check=False,
    )
    output = result.stdout + result.stderr
    checks: dict[str, Check] = {}
    for line in result.stdout.splitlines():
        match = _CHECK_RE.match(line.strip())
        if match is None:
            continue
        name, value, limit = match.groups()
        assert name not in checks, f"check {name} printed twice\n{output}"
        checks[name] = Check(line.strip(), float(value), float(limit))
    return Run(result.returncode, output, checks)


def test_program_exits_zero(run: Run) -> None:
    assert run.returncode == 0, f"exit status {run.returncode}\n{run.output}"


def test_every_printed_check_is_listed(run: Run) -> None:
    unlisted = sorted(set(run.checks) - set(EXPECTED_CHECKS))
    assert not unlisted, f"checks missing from EXPECTED_CHECKS: {unlisted}"


@pytest.mark.parametrize("name", EXPECTED_CHECKS)
def test_check(run: Run, name: str) -> None:
    check = run.checks.get(name)
    assert check is not None, f"no CHECK line for {name}; output:\n{run.output}"
    info = [line for line in run.output.splitlines() if line.startswith(f"INFO {name} ")]
    assert check.value <= check.limit, "\n".join([check.line, *info])
