"""Executed instructions counted by CUPTI's SASS metrics on the GPU (``pytest -m gpu``), against
what the test kernels issue and against Nsight Compute's counts of the same call.

One m64n64k16 wgmma per warpgroup is 4 warp-level HGMMA (128 predicated-on threads); one TMA load
is 1 per block (ptxgym/evaluate/self-test/wgmma_tma.cu, as tests/gpu/test_gpu_profile.py checks
with ncu).
"""

from __future__ import annotations

import functools
from typing import Any

import pytest
from expert_examples import EXPERTS

from ptxgym import paths
from ptxgym.env import PTXKernelEnv
from ptxgym.evaluate.count import SELF_TEST_KERNELS, count_candidate
from ptxgym.evaluate.count_audit import AGREED
from ptxgym.evaluate.judge_settings import JudgeSettings
from ptxgym.evaluate.local_gpu import LocalGPUEvaluator, incompatibility
from ptxgym.evaluate.profile import profile_candidate
from ptxgym.evaluate.worker import host_inputs
from ptxgym.languages.cuda.compiler import compile_source
from ptxgym.outcome import InstructionProfile
from ptxgym.tasks import Task, get_task

pytestmark = pytest.mark.gpu

GEMM = get_task("PTX-H100-GEMM")
MHA = get_task("PTX-H100-MHAFwd-d128")
BLOCKS = GEMM.workloads[0].axes["M"] // 64  # the test kernels launch one warpgroup per 64 rows
EXAMPLES = paths.examples_dir()
TARGETS = ("HGMMA", "UTMALDG")


@pytest.fixture(autouse=True)
def _sm90() -> None:
    if reason := incompatibility(GEMM):
        pytest.skip(reason)


@functools.cache
def _inputs(task_id: str) -> tuple[dict[str, Any], dict[str, Any]]:
    task = get_task(task_id)
    workload = {"axes": task.workloads[0].axes, "sequences": task.workloads[0].sequences}
    return workload, host_inputs(task, workload, 1)


def _library(task: Task, source: str) -> str:
    build = compile_source(source, task)
    assert build.ok and build.library is not None, build.log
    return build.library


def _step(source: str, **settings: Any) -> dict[str, Any]:
    """One env step of ``source`` on the GEMM task with the judge ``settings`` (memcheck off);
    the step's info."""
    judge = JudgeSettings(memcheck=False, **settings)
    env = PTXKernelEnv("PTX-H100-GEMM", evaluator=LocalGPUEvaluator(settings=judge))
    env.reset()
    try:
        info: dict[str, Any] = env.step(source)[4]
    finally:
        env.close()
    return info


def _count(task: Task, source: str) -> InstructionProfile:
    workload, inputs = _inputs(task.id)
    result = count_candidate(task, _library(task, source), workload, inputs, device=0)
    assert result.ok, result.reason
    assert result.method == "cupti"
    return result


def test_executed_wgmma_and_tma_are_counted() -> None:
    result = _count(GEMM, (SELF_TEST_KERNELS / "wgmma_tma.cu").read_text())
    assert result.families == {"compute": True, "data_movement": True}
    assert result.warp_counts["HGMMA"] == 4 * BLOCKS
    assert result.thread_counts["HGMMA"] == 128 * BLOCKS
    assert result.warp_counts["UTMALDG"] == BLOCKS
    assert {"load", "call", "count", "gpu"} <= set(result.call_seconds)


def test_a_kernel_launched_after_another_is_counted_too() -> None:
    """CUPTI counted only a process's first kernel unless its Activity API had been used and
    turned off before (the helper's warm-up): a plain kernel first, then the wgmma one."""
    source = (SELF_TEST_KERNELS / "wgmma_tma.cu").read_text()
    first = "__global__ void first_kernel(__nv_bfloat16* C) { C[threadIdx.x] = C[threadIdx.x]; }\n"
    launch = "  wgmma_tma_kernel<<<M / 64, 128, 0, stream>>>(tmap_a, C);"
    assert launch in source
    source = source.replace('#include "ptxgym_h100.cuh"\n', '#include "ptxgym_h100.cuh"\n' + first)
    source = source.replace(launch, "  first_kernel<<<1, 32, 0, stream>>>(C);\n" + launch)
    result = _count(GEMM, source)
    assert result.warp_counts["HGMMA"] == 4 * BLOCKS


def test_wgmma_on_a_branch_never_taken_does_not_qualify() -> None:
    result = _count(GEMM, (SELF_TEST_KERNELS / "wgmma_never_taken.cu").read_text())
    assert result.thread_counts.get("HGMMA", 0) == 0
    assert result.qualified is False


def test_plain_cuda_executes_neither_family() -> None:
    source = (EXAMPLES / "naive" / "gemm.cu").read_text()
    workload, inputs = _inputs(GEMM.id)
    result = count_candidate(GEMM, _library(GEMM, source), workload, inputs, device=0)
    # Its SASS has no target instruction: decided from the listing, not run.
    assert result.ok and result.method == "sass"
    assert result.families == {"compute": False, "data_movement": False}


# Every example kernel with a target instruction, and the kernels built to cheat or to break the
# instruction proof: a token wgmma beside FFMA work, a wgmma on a branch never taken, and a
# clustered launch with 224 KB of shared memory per block (Nsight Compute failed on such a kernel).
EQUAL_COUNT_KERNELS = {
    "wgmma_tma": (GEMM, lambda: (SELF_TEST_KERNELS / "wgmma_tma.cu").read_text()),
    "wgmma_never_taken": (GEMM, lambda: (SELF_TEST_KERNELS / "wgmma_never_taken.cu").read_text()),
    "token_wgmma_gemm": (GEMM, lambda: _token_wgmma_gemm()),
    "clustered_224kb_gemm": (GEMM, lambda: _clustered_big_smem_gemm()),
    # Every shipped expert kernel of examples/manifest.yaml, on each task it solves.
    **{
        f"{file}:{task_id}": (get_task(task_id), lambda file=file: (EXAMPLES / file).read_text())
        for file, task_id, _ in EXPERTS
    },
}


@pytest.mark.parametrize("name", sorted(EQUAL_COUNT_KERNELS))
def test_cupti_counts_equal_nsight_computes(name: str) -> None:
    task, make_source = EQUAL_COUNT_KERNELS[name]
    text = make_source()
    counted = _count(task, text)
    workload, inputs = _inputs(task.id)
    profiled = profile_candidate(task, _library(task, text), workload, inputs, device=0)
    assert profiled.ok, profiled.reason
    for opcode in TARGETS:
        assert counted.thread_counts.get(opcode, 0) == profiled.thread_counts.get(opcode, 0)
        assert counted.warp_counts.get(opcode, 0) == profiled.warp_counts.get(opcode, 0)
    assert counted.families == profiled.families
    assert counted.qualified == profiled.qualified
    print(
        f"{name}: HGMMA {counted.warp_counts.get('HGMMA', 0)} warps, UTMALDG "
        f"{counted.warp_counts.get('UTMALDG', 0)}, qualified {counted.qualified} (both methods)"
    )


def test_the_env_qualifies_the_expert_gemm_with_cupti_counts() -> None:
    info = _step((EXAMPLES / "expert" / "gemm.cu").read_text(), profile_method="cupti")
    assert info["status"] == "PASSED", info["feedback"]
    assert info["outcome"]["qualified"] is True
    assert info["outcome"]["profile"]["method"] == "cupti"


TOKEN_KERNEL = """
__global__ void __launch_bounds__(128, 1) token_wgmma_kernel(__nv_bfloat16* C) {
  __shared__ __align__(1024) __nv_bfloat16 tile[64 * 64];
  float acc[32] = {};
  ptx::wgmma_fence();
  ptx::wgmma_m64n64k16_ss(acc, ptx::make_desc_kmajor_sw128(tile),
                          ptx::make_desc_kmajor_sw128(tile), 0);
  ptx::wgmma_commit();
  ptx::wgmma_wait<0>();
  C[threadIdx.x] = __float2bfloat16(acc[0]);
}
"""


def _token_wgmma_gemm() -> str:
    """The naive (FFMA) GEMM, correct, plus one wgmma executed by one warpgroup before it (whose
    output the GEMM then overwrites)."""
    source = (EXAMPLES / "naive" / "gemm.cu").read_text()
    entry, launch = 'extern "C" int gemm(', "  gemm_tn_kernel<<<"
    assert entry in source and launch in source
    source = '#include "ptxgym_h100.cuh"\n' + source.replace(entry, TOKEN_KERNEL + entry, 1)
    return source.replace(launch, "  token_wgmma_kernel<<<1, 128, 0, stream>>>(C);\n" + launch, 1)


def test_coverage_is_the_part_of_the_operators_work_the_matrix_instructions_did() -> None:
    expert = _count(GEMM, (EXAMPLES / "expert" / "gemm.cu").read_text())
    assert expert.coverage == pytest.approx(1.0, rel=1e-9)  # every FLOP on HGMMA, none padded
    assert expert.qualified is True
    mha = _count(MHA, (EXAMPLES / "expert" / "mha_fwd_d128.cu").read_text())
    assert mha.coverage == pytest.approx(1.0, rel=0.01)
    token = _count(GEMM, _token_wgmma_gemm())
    assert token.families == {"compute": True, "data_movement": False}
    assert token.coverage is not None and token.coverage < 1e-6
    assert token.qualified is False


def test_a_token_wgmma_is_correct_but_does_not_qualify_through_the_env() -> None:
    for method in ("cupti", "ncu"):
        info = _step(_token_wgmma_gemm(), profile_method=method)
        assert info["status"] == "PASSED", info["feedback"]
        assert info["outcome"]["qualified"] is False, method
        assert "below the 50% it must do to qualify" in info["feedback"]


def test_the_self_test_passes_on_this_gpu() -> None:
    """What a judge asked for CUPTI counts runs first (else it falls back to Nsight Compute)."""
    from ptxgym.evaluate.count import self_test

    assert self_test(0, (9, 0)) is None


CLUSTER_SMEM_BYTES = 224 * 1024  # per block: the kind of launch Nsight Compute's run failed on


def _clustered_big_smem_gemm() -> str:
    """The expert GEMM launched in clusters of two blocks, each asking for 224 KB of shared
    memory (its pipeline uses 193 KB; the rest stands in for a deeper one)."""
    source = (EXAMPLES / "expert" / "gemm.cu").read_text()
    declaration = "__global__ void __launch_bounds__(kThreads, 1)\n    gemm_ws_kernel("
    budget = "constexpr int kSmemBytes = kStages * (kStageBytesA + kStageBytesB) + 1024 + 256;"
    assert declaration in source and budget in source
    source = source.replace(
        declaration,
        "__global__ void __launch_bounds__(kThreads, 1) __cluster_dims__(2, 1, 1)\n"
        "    gemm_ws_kernel(",
    )
    return source.replace(budget, f"constexpr int kSmemBytes = {CLUSTER_SMEM_BYTES};")


def test_a_clustered_gemm_with_224_kb_of_shared_memory_gets_a_definite_verdict() -> None:
    source = _clustered_big_smem_gemm()
    build = compile_source(source, GEMM)
    assert build.ok, build.log
    counted = _count(GEMM, source)
    assert counted.qualified is True
    assert counted.coverage == pytest.approx(1.0, rel=1e-9)
    info = _step(source, profile_method="cupti")
    assert info["status"] == "PASSED", info["feedback"]
    assert info["outcome"]["qualified"] is True
    # What Nsight Compute makes of the same call, for the record (it failed on such launches).
    workload, inputs = _inputs(GEMM.id)
    profiled = profile_candidate(GEMM, build.library or "", workload, inputs, device=0)
    print(f"ncu on the clustered 224-KB GEMM: ok={profiled.ok} {profiled.reason[:200]}")


def test_nsight_computes_audit_agrees_with_the_cupti_counts_of_the_expert_gemm() -> None:
    info = _step((EXAMPLES / "expert" / "gemm.cu").read_text(), count_audit_rate=1.0)
    assert info["status"] == "PASSED", info["feedback"]
    profile = info["outcome"]["profile"]
    assert profile["method"] == "cupti" and profile["audit"] == AGREED
    assert info["outcome"]["qualified"] is True
    assert "count_audit" in info["outcome"]["stage_seconds"]
