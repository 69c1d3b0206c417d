"""compute-sanitizer on the GPU (``pytest -m gpu``): memcheck catches a write past the output that
the checks cannot see, names the line, and turns the step into MEMORY_ERROR; a clean kernel is
clean; racecheck (on request) finds a shared-memory race."""

from __future__ import annotations

import functools
from typing import Any

import pytest
from gemm_candidates import GEMM, NAIVE_GEMM

from ptxgym.env import PTXKernelEnv
from ptxgym.evaluate.judge_settings import JudgeSettings
from ptxgym.evaluate.local_gpu import LocalGPUEvaluator, incompatibility
from ptxgym.evaluate.sanitizer import sanitize_candidate
from ptxgym.evaluate.worker import host_inputs
from ptxgym.languages.cuda.compiler import compile_source

pytestmark = pytest.mark.gpu

WORKLOAD = {"axes": GEMM.workloads[0].axes, "sequences": {}}


@functools.cache
def _inputs() -> dict[str, Any]:
    """The first workload's inputs for seed 1, made once (the judge's trusted generator)."""
    return host_inputs(GEMM, WORKLOAD, 1)


LAUNCH_END = "  return static_cast<int>(cudaGetLastError());\n}"

# The naive GEMM plus one write of one float past the end of a 100-float scratch buffer of its
# own. The write stays inside the allocation's 512-byte granule, so it harms nothing and the
# outputs stay right: only memcheck, which knows each allocation's size, can tell. (A write
# past the end of C proved no test: where it lands depends on how the driver lays out the
# allocations, and on the H200 it once landed in the input B, in the worker and under memcheck.)
OUT_OF_BOUNDS = NAIVE_GEMM.replace(
    'extern "C" int gemm(',
    (
        "__global__ void write_past_end(float* scratch, int n) {\n"
        "  scratch[n] = 1.0f;  // one element past the end\n"
        "}\n\n"
        "static float* scratch = nullptr;\n\n"
        'extern "C" int gemm('
    ),
).replace(
    LAUNCH_END,
    "  if (scratch == nullptr && cudaMalloc(&scratch, 100 * sizeof(float)) != cudaSuccess) {\n"
    "    return static_cast<int>(cudaGetLastError());\n"
    "  }\n"
    "  write_past_end<<<1, 1, 0, stream>>>(scratch, 100);\n" + LAUNCH_END,
)

RACY = """\
#include <cuda_runtime.h>
#include <cuda_bf16.h>
// Each thread writes its shared slot and reads its neighbour's with no barrier between.
__global__ void racy(__nv_bfloat16* C) {
  __shared__ float slots[128];
  slots[threadIdx.x] = threadIdx.x;
  C[threadIdx.x] = __float2bfloat16(slots[(threadIdx.x + 1) % 128]);
}
extern "C" int gemm(const __nv_bfloat16* A, const __nv_bfloat16* B, __nv_bfloat16* C, int M,
                    int N, int K, cudaStream_t stream) {
  racy<<<1, 128, 0, stream>>>(C);
  return static_cast<int>(cudaGetLastError());
}
"""


@pytest.fixture(autouse=True)
def _sm90() -> None:
    reason = incompatibility(GEMM)
    if reason is not None:
        pytest.skip(reason)


def _library(source: str) -> str:
    build = compile_source(source, GEMM)
    assert build.ok and build.library is not None, build.log
    return build.library


def test_memcheck_turns_a_hidden_out_of_bounds_write_into_memory_error() -> None:
    assert LAUNCH_END in NAIVE_GEMM and "write_past_end<<<" in OUT_OF_BOUNDS
    settings = JudgeSettings(stage_timeout_s=62.0, warmup=2, iters=5, trials=3, profile=False)
    env = PTXKernelEnv("PTX-H100-GEMM", evaluator=LocalGPUEvaluator(settings=settings))
    env.reset(seed=0)
    info = env.step(OUT_OF_BOUNDS)[4]
    assert info["status"] == "MEMORY_ERROR", info["feedback"]
    (memcheck,) = info["outcome"]["sanitizers"]
    assert memcheck["tool"] == "memcheck" and memcheck["errors"] >= 1
    assert "Invalid __global__ write" in memcheck["findings"][0]
    assert "write_past_end" in memcheck["findings"][0]
    assert "candidate.cu:" in memcheck["findings"][0]
    assert "memcheck" in info["feedback"] and info["reward_components"]["correct"] == 0.0
    # The next step, an honest kernel, passes with a clean memcheck.
    after = env.step(NAIVE_GEMM)[4]
    assert after["status"] == "PASSED", after["feedback"]
    assert after["outcome"]["sanitizers"][0]["errors"] == 0
    assert "- memcheck: no errors" in after["feedback"]


def test_racecheck_finds_a_shared_memory_race() -> None:
    library = _library(RACY)
    report = sanitize_candidate(GEMM, library, WORKLOAD, _inputs(), device=0, tool="racecheck")
    assert report.ok, report.reason
    assert report.errors >= 1 and report.findings


def test_memcheck_of_a_clean_kernel_is_clean() -> None:
    library = _library(RACY)
    report = sanitize_candidate(GEMM, library, WORKLOAD, _inputs(), device=0, tool="memcheck")
    assert report.ok and report.clean, report.findings
