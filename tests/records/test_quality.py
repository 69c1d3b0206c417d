"""Code-quality metrics of a submission: lizard for CUDA C++, radon for Python."""

from __future__ import annotations

from ptxgym import paths
from ptxgym.records.quality import measure

SIMPLE_CUDA = """\
// A comment line.
__global__ void k(float* x, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n && x[i] > 0) x[i] = 0;  // two decisions: if, &&
}

extern "C" int entry(float* x, int n, cudaStream_t s) {
  k<<<(n + 255) / 256, 256, 0, s>>>(x, n);
  return 0;
}
"""


def test_cuda_counts_lines_functions_and_complexity() -> None:
    quality = measure(SIMPLE_CUDA, "cuda")
    assert quality is not None
    assert (quality.lines, quality.functions) == (10, 2)
    assert quality.comment_lines == 2
    assert quality.sloc == 8
    assert (quality.cyclomatic_max, quality.cyclomatic_total) == (3, 4)
    assert 0 < quality.maintainability <= 100
    assert quality.tool.startswith("lizard")


def test_a_longer_branchier_kernel_is_less_maintainable() -> None:
    naive_gemm = (paths.examples_dir() / "naive" / "gemm.cu").read_text()
    simple, gemm = measure(SIMPLE_CUDA, "cuda"), measure(naive_gemm, "cuda")
    assert simple is not None and gemm is not None
    assert gemm.maintainability < simple.maintainability
    assert gemm.cyclomatic_max > simple.cyclomatic_max


def test_python_candidates_are_measured_by_radon() -> None:
    source = "def f(x):\n    # halve\n    if x > 0:\n        return x / 2\n    return 0\n"
    quality = measure(source, "triton")
    assert quality is not None
    assert (quality.functions, quality.cyclomatic_max, quality.comment_lines) == (1, 2, 1)
    assert quality.tool.startswith("radon")
    assert measure("def broken(:\n", "triton") is None


def test_no_source_has_no_metrics() -> None:
    assert measure(None, "cuda") is None and measure("", "cuda") is None
