"""Convolutions: a 3×3 convolution of NHWC feature maps, and the causal depthwise 1-D
convolution of state-space models.

``op`` (a task parameter) picks the convolution::

    conv2d3x3        y[b, h, w, f] = Σ_{r,s<3} Σ_c x[b, h + r − 1, w + s − 1, c] · wt[f, r, s, c]
                     (stride 1, zero padding 1: y has x's height and width); bf16, NHWC / KRSC
    dwconv1d_causal  y[b, c, t] = Σ_{j<4} wt[c, j] · x[b, c, t − 3 + j] + bias[c]  (x = 0 before
                     t = 0); bf16 [B, C, T], as Mamba's short convolution

The 2-D weights are drawn ``N(0, 1/(9·C))`` so outputs are ``N(0, 1)``. References compute in
float32 (TF32 off, for cuDNN too). Baselines: cuDNN through ``F.conv2d`` on the channels-last
tensors, and ``F.conv1d(groups=C)`` with its output trimmed to the causal part (cuDNN).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager

import torch
import torch.nn.functional as F

from kernels_ref._common import Draws, highest_precision, prepared, require_axes

__all__ = ["TAPS", "baseline", "make_inputs", "reference"]

TAPS = 4  # the causal convolution's width


@contextmanager
def _exact_convolutions() -> Iterator[None]:
    """float32 convolutions in float32 (cuDNN's TF32 off), matmuls likewise. ``flags`` resets
    every cuDNN setting it is not given (``enabled`` defaults to False there), so the current
    ones are passed on."""
    cudnn = torch.backends.cudnn
    with (
        highest_precision(),
        cudnn.flags(
            enabled=cudnn.enabled,
            benchmark=cudnn.benchmark,
            deterministic=cudnn.deterministic,
            allow_tf32=False,
        ),
    ):
        yield


def make_inputs(
    axes: Mapping[str, int],
    *,
    seed: int,
    device: str = "cuda",
    outliers: bool = False,
    op: str,
) -> dict[str, torch.Tensor]:
    """Draw activations ``N(0, 1)`` and weights scaled to give outputs of unit variance."""
    draws = Draws(device, seed, outliers=outliers)
    if op == "conv2d3x3":
        b, h, w, c, f = require_axes(axes, ("B", "H", "W", "C", "F"), op)
        x = draws.randn((b, h, w, c))
        return {"x": x, "wt": draws.randn((f, 3, 3, c), std=1.0 / math.sqrt(9 * c))}
    if op == "dwconv1d_causal":
        b, c, t = require_axes(axes, ("B", "C", "T"), op)
        x = draws.randn((b, c, t))
        plain = Draws(device, seed + 1)
        return {"x": x, "wt": plain.randn((c, TAPS), std=0.5), "bias": plain.randn((c,))}
    raise ValueError(f"convolution: unknown op {op!r}")


def _conv2d(x: torch.Tensor, wt: torch.Tensor) -> torch.Tensor:
    """NHWC ``x`` and KRSC ``wt`` as the NCHW / KCRS views torch takes (no copies)."""
    out = F.conv2d(x.permute(0, 3, 1, 2), wt.permute(0, 3, 1, 2), padding=1)
    return out.permute(0, 2, 3, 1)


def _dwconv1d(x: torch.Tensor, wt: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    channels, length = x.shape[1], x.shape[2]
    out = F.conv1d(x, wt.unsqueeze(1), bias, padding=TAPS - 1, groups=channels)
    return out[..., :length]


def reference(inputs: Mapping[str, torch.Tensor], *, op: str) -> dict[str, torch.Tensor]:
    """The convolution in float32."""
    wide = {name: t.float() for name, t in inputs.items()}
    with _exact_convolutions():
        if op == "conv2d3x3":
            return {"y": _conv2d(wide["x"], wide["wt"]).contiguous()}
        if op == "dwconv1d_causal":
            return {"y": _dwconv1d(wide["x"], wide["wt"], wide["bias"])}
    raise ValueError(f"convolution: unknown op {op!r}")


def baseline(
    inputs: Mapping[str, torch.Tensor], *, op: str
) -> Callable[[], Mapping[str, torch.Tensor]]:
    """cuDNN through torch on the bf16 tensors, channels-last for the 2-D convolution."""
    if op == "conv2d3x3":
        x, wt = inputs["x"], inputs["wt"]
        return prepared(lambda: {"y": _conv2d(x, wt)})
    x, wt, bias = inputs["x"], inputs["wt"], inputs["bias"]
    return prepared(lambda: {"y": _dwconv1d(x, wt, bias)})
