"""The Hopper GEMM task and the candidate sources many tests submit to it: the naive example
kernel, and the parts of a hand-written one (the headers and the entry point's signature)."""

from __future__ import annotations

from ptxgym import paths
from ptxgym.tasks import get_task

GEMM = get_task("PTX-H100-GEMM")
NAIVE_GEMM = (paths.examples_dir() / "naive" / "gemm.cu").read_text()
SIGNATURE = (
    'extern "C" int gemm(const __nv_bfloat16* A, const __nv_bfloat16* B, __nv_bfloat16* C, '
    "int M, int N, int K, cudaStream_t stream)"
)
HEADER = "#include <cuda_runtime.h>\n#include <cuda_bf16.h>\n"
