"""GEMM: ``C[M, N] = A[M, K] @ B[N, K]^T`` in bf16 with float32 accumulation.

Both operands are K-major (row-major ``A[M, K]`` and ``B[N, K]``), the "TN" layout that cuBLAS
and the tensor cores handle natively. The baseline is cuBLAS through ``torch.matmul``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch

from kernels_ref._common import Draws, highest_precision, require_axes

__all__ = ["cublas", "make_inputs", "reference"]


def make_inputs(
    axes: Mapping[str, int],
    *,
    seed: int,
    device: str = "cuda",
    outliers: bool = False,
) -> dict[str, torch.Tensor]:
    """Draw ``A[M, K]`` and ``B[N, K]``, bf16 ``N(0, 1)``.

    Parameters
    ----------
    axes
        ``M``, ``N`` and ``K``.
    seed, device
        Seed of the ``torch.Generator`` on ``device``; the same seed gives the same tensors.
    outliers
        Scale about 0.1% of the elements of the same draw by 8-16x.
    """
    m, n, k = require_axes(axes, ("M", "N", "K"), "gemm")
    draws = Draws(device, seed, outliers=outliers)
    a = draws.randn((m, k))
    b = draws.randn((n, k))
    return {"A": a, "B": b}


def reference(inputs: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Return ``{"C": A @ B^T}`` computed in float32 (TF32 off)."""
    a, b = inputs["A"], inputs["B"]
    with highest_precision():
        c = a.float() @ b.float().T
    return {"C": c}


def cublas(inputs: Mapping[str, torch.Tensor]) -> Callable[[], dict[str, torch.Tensor]]:
    """Prepare a cuBLAS bf16 GEMM into a preallocated ``C``; return the closure that runs it.

    The closure calls ``torch.matmul(A, B.t(), out=C)``: ``B.t()`` is a view, so cuBLAS runs one
    TN GEMM with float32 accumulation and writes bf16 ``C``, and nothing else is launched.
    """
    a, b = inputs["A"], inputs["B"]
    if a.dim() != 2 or b.dim() != 2 or a.shape[1] != b.shape[1]:
        raise ValueError(f"gemm: expected A[M, K] and B[N, K], got {tuple(a.shape)}, {b.shape}")
    c = torch.empty((a.shape[0], b.shape[0]), dtype=a.dtype, device=a.device)
    bt = b.t()

    def run() -> dict[str, torch.Tensor]:
        torch.matmul(a, bt, out=c)
        return {"C": c}

    return run
