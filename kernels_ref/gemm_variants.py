"""Variants of the GEMM: batched, in float16, and with a fused bias + GELU epilogue.

Operands are K-major as in ``kernels_ref.gemm`` (``A[.., M, K]``, ``B[.., N, K]``)::

    batched     C[l] = A[l] · B[l]ᵀ                       bf16, float32 accumulation
    fp16        C = A · Bᵀ                                 float16, float32 accumulation
    bias_gelu   C = gelu_tanh(A · Bᵀ + bias)               bf16; bias [N]

``B`` is drawn ``N(0, 1/K)`` (a layer's weights at their usual initial scale), so products are
``N(0, 1)`` and the tolerance's absolute part is meaningful. References compute in float32
(TF32 off). Baselines are cuBLAS / cuBLASLt through torch: ``torch.bmm`` (strided batched),
``torch.matmul`` in float16, and ``torch._addmm_activation(use_gelu=True)``, which runs the
product with cuBLASLt's GELU_BIAS epilogue (the tanh form of GELU) in one kernel.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

import torch
import torch.nn.functional as F

from kernels_ref._common import Draws, highest_precision, prepared, require_axes

__all__ = ["baseline", "make_inputs", "reference"]


def make_inputs(
    axes: Mapping[str, int],
    *,
    seed: int,
    device: str = "cuda",
    outliers: bool = False,
    op: str,
) -> dict[str, torch.Tensor]:
    """Draw ``A`` ``N(0, 1)`` and ``B`` ``N(0, 1/K)`` (and ``bias`` ``N(0, 1)``)."""
    draws = Draws(device, seed, outliers=outliers)
    if op == "batched":
        batch, m, n, k = require_axes(axes, ("L", "M", "N", "K"), op)
        a_shape: tuple[int, ...] = (batch, m, k)
        b_shape: tuple[int, ...] = (batch, n, k)
    else:
        m, n, k = require_axes(axes, ("M", "N", "K"), op)
        a_shape, b_shape = (m, k), (n, k)
    dtype = torch.float16 if op == "fp16" else torch.bfloat16
    inputs = {
        "A": draws.randn(a_shape, dtype=dtype),
        "B": draws.randn(b_shape, std=1.0 / math.sqrt(k), dtype=dtype),
    }
    if op == "bias_gelu":
        inputs["bias"] = draws.randn((n,))
    return inputs


def reference(inputs: Mapping[str, torch.Tensor], *, op: str) -> dict[str, torch.Tensor]:
    """The product (and epilogue) in float32."""
    a, b = inputs["A"].float(), inputs["B"].float()
    with highest_precision():
        c = torch.matmul(a, b.transpose(-1, -2))
    if op == "bias_gelu":
        c = F.gelu(c + inputs["bias"].float(), approximate="tanh")
    return {"C": c}


def baseline(
    inputs: Mapping[str, torch.Tensor], *, op: str
) -> Callable[[], Mapping[str, torch.Tensor]]:
    """cuBLAS (cuBLASLt for the fused epilogue) into a preallocated ``C``."""
    a, b = inputs["A"], inputs["B"]
    bt = b.transpose(-1, -2)  # a view: cuBLAS runs the TN product
    c = torch.empty((*a.shape[:-1], b.shape[-2]), dtype=a.dtype, device=a.device)
    if op == "bias_gelu":
        bias = inputs["bias"]

        def run_epilogue() -> Mapping[str, torch.Tensor]:
            return {"C": torch._addmm_activation(bias, a, bt, use_gelu=True)}

        return prepared(run_epilogue)
    if op == "batched":
        return prepared(lambda: {"C": torch.bmm(a, bt, out=c)})
    return prepared(lambda: {"C": torch.matmul(a, bt, out=c)})
