"""Normalisation layers over the rows of activations (and over channel groups for GroupNorm).

``op`` (a task parameter) picks the layer; ``eps`` is fixed per op::

    layer_norm    y = (x − mean) / sqrt(var + 1e-5) · w + b      per row of x [M, N]
    rms_norm      y = x / sqrt(mean(x²) + 1e-6) · w              per row of x [M, N]
    add_rms_norm  h = x + residual;  y = rms_norm(h) · w;  residual_out = h
    group_norm    y = (x − mean_g) / sqrt(var_g + 1e-5) · w[c] + b[c], statistics per
                  (batch, group of C/G channels) over the group's channels and positions;
                  x [B, C, P] (P = H·W positions, NCHW flattened), G = 32

The variance is the population variance. References compute in float32 (TF32 off). Baselines:
PyTorch's eager fused kernels for LayerNorm and GroupNorm (``F.layer_norm``, ``F.group_norm``)
and ``torch.compile`` for the RMS norms (one fused kernel; eager ``F.rms_norm`` composes several
on some torch versions).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch
import torch.nn.functional as F

from kernels_ref._common import Draws, compiled, prepared, require_axes

__all__ = ["GROUPS", "baseline", "make_inputs", "reference"]

GROUPS = 32
_EPS = {"layer_norm": 1e-5, "rms_norm": 1e-6, "add_rms_norm": 1e-6, "group_norm": 1e-5}


def make_inputs(
    axes: Mapping[str, int],
    *,
    seed: int,
    device: str = "cuda",
    outliers: bool = False,
    op: str,
) -> dict[str, torch.Tensor]:
    """Draw bf16 activations ``N(0.5, 2²)`` (a nonzero mean, which LayerNorm must remove) and
    weights ``N(1, 0.1²)``, biases ``N(0, 0.1²)``: non-trivial affine parameters."""
    draws = Draws(device, seed, outliers=outliers)
    if op == "group_norm":
        b, c, p = require_axes(axes, ("B", "C", "P"), op)
        shape: tuple[int, ...] = (b, c, p)
        features = c
    else:
        m, n = require_axes(axes, ("M", "N"), op)
        shape, features = (m, n), n
    x = draws.randn(shape, std=2.0, dtype=torch.float32).add_(0.5).to(torch.bfloat16)
    residual = draws.randn(shape) if op == "add_rms_norm" else None
    # Parameters are drawn without outliers: the outlier stage tests the activations.
    plain = Draws(device, seed + 1)
    inputs = {"x": x, "w": plain.randn((features,), std=0.1, dtype=torch.float32).add_(1.0)}
    inputs["w"] = inputs["w"].bfloat16()
    if op in ("layer_norm", "group_norm"):
        inputs["b"] = plain.randn((features,), std=0.1)
    if residual is not None:
        inputs["residual"] = residual
    return inputs


def _rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    scale = torch.rsqrt(xf.square().mean(dim=-1, keepdim=True) + eps)
    return (xf * scale * w.float()).to(x.dtype)


def _add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, w: torch.Tensor, eps: float
) -> dict[str, torch.Tensor]:
    h = x.float() + residual.float()
    return {"y": _rms_norm(h, w, eps).to(x.dtype), "residual_out": h.to(x.dtype)}


def _apply(inputs: Mapping[str, torch.Tensor], op: str) -> dict[str, torch.Tensor]:
    """The layer on ``inputs`` as they are (float32 for the reference, bf16 for eager)."""
    x, w, eps = inputs["x"], inputs["w"], _EPS[op]
    if op == "layer_norm":
        return {"y": F.layer_norm(x, (x.shape[-1],), w, inputs["b"], eps)}
    if op == "group_norm":
        return {"y": F.group_norm(x, GROUPS, w, inputs["b"], eps)}
    if op == "rms_norm":
        return {"y": _rms_norm(x, w, eps)}
    if op == "add_rms_norm":
        return _add_rms_norm(x, inputs["residual"], w, eps)
    raise ValueError(f"normalization: unknown op {op!r}")


def reference(inputs: Mapping[str, torch.Tensor], *, op: str) -> dict[str, torch.Tensor]:
    """The layer in float32."""
    return _apply({name: t.float() for name, t in inputs.items()}, op)


def _rms(x: torch.Tensor, w: torch.Tensor) -> dict[str, torch.Tensor]:
    return {"y": _rms_norm(x, w, _EPS["rms_norm"])}


def _add_rms(x: torch.Tensor, residual: torch.Tensor, w: torch.Tensor) -> dict[str, torch.Tensor]:
    return _add_rms_norm(x, residual, w, _EPS["add_rms_norm"])


def baseline(
    inputs: Mapping[str, torch.Tensor], *, op: str
) -> Callable[[], Mapping[str, torch.Tensor]]:
    """Eager ``F.layer_norm`` / ``F.group_norm`` on bf16, or the compiled RMS norm."""
    if op == "rms_norm":
        rms = compiled(_rms)
        x, w = inputs["x"], inputs["w"]
        return prepared(lambda: rms(x, w))
    if op == "add_rms_norm":
        add_rms = compiled(_add_rms)
        x, residual, w = inputs["x"], inputs["residual"], inputs["w"]
        return prepared(lambda: add_rms(x, residual, w))
    return prepared(lambda: _apply(inputs, op))
