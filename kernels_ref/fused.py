"""Fused transformer blocks: RMSNorm feeding a projection, and a SwiGLU MLP's first half.

``op`` (a task parameter) picks the block; ``X [M, K]`` is bf16, weights are K-major ``[N, K]``
bf16 drawn ``N(0, 1/K)``::

    rms_norm_gemm  Xn = bf16(X / sqrt(mean(X²) + 1e-6) · g)   (per row, rounded to bf16 as a
                   fused kernel rounds it to feed the tensor cores);  Y = Xn · Wᵀ
    swiglu         H = silu(X · Wgᵀ) ⊙ (X · Wuᵀ)

References compute in float32 (TF32 off), with ``Xn`` rounded to bf16 as defined. Baselines:
``torch.compile`` of the PyTorch definition: inductor fuses the norm (or the activation) into
one kernel and calls cuBLAS for the products.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

import torch
import torch.nn.functional as F

from kernels_ref._common import Draws, compiled, highest_precision, prepared, require_axes

__all__ = ["EPS", "baseline", "make_inputs", "reference"]

EPS = 1e-6


def make_inputs(
    axes: Mapping[str, int],
    *,
    seed: int,
    device: str = "cuda",
    outliers: bool = False,
    op: str,
) -> dict[str, torch.Tensor]:
    """Draw ``X`` ``N(0, 1)``, weights ``N(0, 1/K)`` and the norm's scale ``N(1, 0.1²)``."""
    m, n, k = require_axes(axes, ("M", "N", "K"), op)
    draws = Draws(device, seed, outliers=outliers)
    x = draws.randn((m, k))
    std = 1.0 / math.sqrt(k)
    if op == "rms_norm_gemm":
        g = Draws(device, seed + 1).randn((k,), std=0.1, dtype=torch.float32).add_(1.0)
        return {"X": x, "g": g.bfloat16(), "W": draws.randn((n, k), std=std)}
    if op == "swiglu":
        return {"X": x, "Wg": draws.randn((n, k), std=std), "Wu": draws.randn((n, k), std=std)}
    raise ValueError(f"fused: unknown op {op!r}")


def _normalised(x: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """``Xn`` of the definition, bf16."""
    xf = x.float()
    scale = torch.rsqrt(xf.square().mean(dim=-1, keepdim=True) + EPS)
    return (xf * scale * g.float()).to(torch.bfloat16)


def reference(inputs: Mapping[str, torch.Tensor], *, op: str) -> dict[str, torch.Tensor]:
    """The block in float32 (``Xn`` rounded to bf16 as defined)."""
    with highest_precision():
        if op == "rms_norm_gemm":
            xn = _normalised(inputs["X"], inputs["g"]).float()
            return {"Y": xn @ inputs["W"].float().T}
        if op == "swiglu":
            x = inputs["X"].float()
            gate = x @ inputs["Wg"].float().T
            up = x @ inputs["Wu"].float().T
            return {"H": F.silu(gate) * up}
    raise ValueError(f"fused: unknown op {op!r}")


def _rms_norm_gemm(x: torch.Tensor, g: torch.Tensor, w: torch.Tensor) -> dict[str, torch.Tensor]:
    return {"Y": _normalised(x, g) @ w.T}


def _swiglu(x: torch.Tensor, wg: torch.Tensor, wu: torch.Tensor) -> dict[str, torch.Tensor]:
    return {"H": F.silu(x @ wg.T) * (x @ wu.T)}


def baseline(
    inputs: Mapping[str, torch.Tensor], *, op: str
) -> Callable[[], Mapping[str, torch.Tensor]]:
    """``torch.compile`` of the block (cuBLAS products, fused elementwise parts)."""
    if op == "rms_norm_gemm":
        block = compiled(_rms_norm_gemm)
        x, g, w = inputs["X"], inputs["g"], inputs["W"]
        return prepared(lambda: block(x, g, w))
    swiglu = compiled(_swiglu)
    x, wg, wu = inputs["X"], inputs["Wg"], inputs["Wu"]
    return prepared(lambda: swiglu(x, wg, wu))
