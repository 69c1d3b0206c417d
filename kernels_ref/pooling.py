"""Pooling over the spatial positions of NHWC (channels-last) feature maps.

``op`` (a task parameter) picks the pooling; x is ``[B, H, W, C]``::

    max_pool     3×3 windows, stride 2, padding 1 (padding never wins the max):
                 y [B, Ho, Wo, C], Ho = (H − 1) // 2 + 1
    avg_pool     2×2 windows, stride 2, no padding: y [B, H/2, W/2, C], the mean of 4
    global_avg   the mean over all H·W positions: y [B, C], float32

References compute in float32 (float64 for the global mean) through ``F.max_pool2d`` and
``F.avg_pool2d`` on the NCHW view. Baselines: the same PyTorch eager ops on the bf16
channels-last tensors (torch's native channels-last pooling kernels), and ``x.mean`` over the
spatial axes for the global average.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch
import torch.nn.functional as F

from kernels_ref._common import Draws, prepared, require_axes

__all__ = ["baseline", "make_inputs", "reference"]


def make_inputs(
    axes: Mapping[str, int],
    *,
    seed: int,
    device: str = "cuda",
    outliers: bool = False,
    op: str,
) -> dict[str, torch.Tensor]:
    """Draw bf16 ``x [B, H, W, C]``, ``N(0, 1)``."""
    b, h, w, c = require_axes(axes, ("B", "H", "W", "C"), op)
    return {"x": Draws(device, seed, outliers=outliers).randn((b, h, w, c))}


def _pool(x: torch.Tensor, op: str) -> torch.Tensor:
    """The pooling of NHWC ``x`` as NHWC (or ``[B, C]``), in ``x``'s dtype."""
    nchw = x.permute(0, 3, 1, 2)  # a view: channels-last memory seen as NCHW
    if op == "max_pool":
        return F.max_pool2d(nchw, kernel_size=3, stride=2, padding=1).permute(0, 2, 3, 1)
    if op == "avg_pool":
        return F.avg_pool2d(nchw, kernel_size=2, stride=2).permute(0, 2, 3, 1)
    if op == "global_avg":
        return x.mean(dim=(1, 2))
    raise ValueError(f"pooling: unknown op {op!r}")


def reference(inputs: Mapping[str, torch.Tensor], *, op: str) -> dict[str, torch.Tensor]:
    """The pooling in float32 (the global mean in float64)."""
    x = inputs["x"]
    if op == "global_avg":
        return {"y": _pool(x.double(), op).float()}
    return {"y": _pool(x.float(), op).contiguous()}


def baseline(
    inputs: Mapping[str, torch.Tensor], *, op: str
) -> Callable[[], Mapping[str, torch.Tensor]]:
    """PyTorch's eager pooling on the bf16 channels-last tensor (float32 mean for the global
    average)."""
    x = inputs["x"]
    if op == "global_avg":
        return prepared(lambda: {"y": x.mean(dim=(1, 2), dtype=torch.float32)})
    return prepared(lambda: {"y": _pool(x, op)})
