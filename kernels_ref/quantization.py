"""Quantisation of bf16 activations to int8 and float8 (e4m3), and dequantisation back.

``op`` (a task parameter) picks the operation; scales are float32, one per row or per block of
128 consecutive elements of a row (``G = N / 128`` groups)::

    quant_int8_row    scale[m] = max_n |x[m, n]| / 127;  q = clamp(round(x / scale), −127, 127)
    quant_fp8_row     scale[m] = max_n |x[m, n]| / 448;  q = e4m3(clamp(x / scale, −448, 448))
    quant_fp8_block   as quant_fp8_row, per block: scale[m, g] over x[m, 128g .. 128g + 127]
    dequant_int8_row  y = q · scale[m]  (bf16)
    dequant_fp8_row   y = e4m3 value of q · scale[m]  (bf16)

A scale of 0 (an all-zero row or block) is taken as 1. Rounding is to nearest, ties to even
(``torch.round``, and the e4m3 conversion). References compute in float32; the checks allow an
int8 result one step off and an e4m3 result one e4m3 step off (docs/tasks.md, "Tolerances"),
since ``x / scale`` and ``x · (1 / scale)`` can round apart. Baselines: ``torch.compile`` of
the references' PyTorch code (one fused kernel; PyTorch has no eager kernel for these).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch

from kernels_ref._common import Draws, compiled, prepared, require_axes

__all__ = ["BLOCK", "FP8_MAX", "INT8_MAX", "baseline", "make_inputs", "reference"]

INT8_MAX = 127.0
FP8_MAX = 448.0
BLOCK = 128


def make_inputs(
    axes: Mapping[str, int],
    *,
    seed: int,
    device: str = "cuda",
    outliers: bool = False,
    op: str,
) -> dict[str, torch.Tensor]:
    """Draw bf16 activations ``N(0, 1)`` for a quantiser; for a dequantiser, quantise such a
    draw with the reference quantiser (its outputs are the dequantiser's inputs)."""
    m, n = require_axes(axes, ("M", "N"), op)
    x = Draws(device, seed, outliers=outliers).randn((m, n))
    if op.startswith("quant_"):
        return {"x": x}
    source = "quant_int8_row" if op == "dequant_int8_row" else "quant_fp8_row"
    quantised = _quantise(x, source)
    return {"q": quantised["q"], "scale": quantised["scale"]}


def _scales(amax: torch.Tensor, limit: float) -> torch.Tensor:
    scale = amax / limit
    return torch.where(scale > 0, scale, torch.ones_like(scale))


def _quantise(x: torch.Tensor, op: str) -> dict[str, torch.Tensor]:
    """The quantiser ``op`` of bf16 ``x``, computed in float32."""
    xf = x.float()
    if op == "quant_int8_row":
        scale = _scales(xf.abs().amax(dim=1), INT8_MAX)
        q = torch.round(xf / scale[:, None]).clamp_(-INT8_MAX, INT8_MAX).to(torch.int8)
        return {"q": q, "scale": scale}
    if op == "quant_fp8_row":
        scale = _scales(xf.abs().amax(dim=1), FP8_MAX)
        q = (xf / scale[:, None]).clamp_(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
        return {"q": q, "scale": scale}
    if op == "quant_fp8_block":
        m, n = xf.shape
        blocks = xf.view(m, n // BLOCK, BLOCK)
        scale = _scales(blocks.abs().amax(dim=2), FP8_MAX)
        q = (blocks / scale[:, :, None]).clamp_(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
        return {"q": q.view(m, n), "scale": scale}
    raise ValueError(f"quantization: unknown quantiser {op!r}")


def _dequantise(q: torch.Tensor, scale: torch.Tensor) -> dict[str, torch.Tensor]:
    return {"y": (q.float() * scale[:, None]).to(torch.bfloat16)}


def reference(inputs: Mapping[str, torch.Tensor], *, op: str) -> dict[str, torch.Tensor]:
    """The quantiser's ``q`` and ``scale`` (as they are: int8 or e4m3, and float32), or the
    dequantised values in float32."""
    if op.startswith("quant_"):
        return _quantise(inputs["x"], op)
    return {"y": inputs["q"].float() * inputs["scale"][:, None]}


def _quant_int8_row(x: torch.Tensor) -> dict[str, torch.Tensor]:
    return _quantise(x, "quant_int8_row")


def _quant_fp8_row(x: torch.Tensor) -> dict[str, torch.Tensor]:
    return _quantise(x, "quant_fp8_row")


def _quant_fp8_block(x: torch.Tensor) -> dict[str, torch.Tensor]:
    return _quantise(x, "quant_fp8_block")


_QUANTISERS: dict[str, Callable[[torch.Tensor], dict[str, torch.Tensor]]] = {
    "quant_int8_row": _quant_int8_row,
    "quant_fp8_row": _quant_fp8_row,
    "quant_fp8_block": _quant_fp8_block,
}


def baseline(
    inputs: Mapping[str, torch.Tensor], *, op: str
) -> Callable[[], Mapping[str, torch.Tensor]]:
    """``torch.compile`` of the reference's code."""
    if op in _QUANTISERS:
        quantise = compiled(_QUANTISERS[op])
        x = inputs["x"]
        return prepared(lambda: quantise(x))
    dequantise = compiled(_dequantise)
    q, scale = inputs["q"], inputs["scale"]
    return prepared(lambda: dequantise(q, scale))
