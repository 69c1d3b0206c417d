"""Inclusive scans along the rows of a ``[M, N]`` tensor.

``op`` (a task parameter) picks the scan::

    cumsum           y[m, n] = Σ_{k ≤ n} x[m, k]                          float32 → float32
    cumsum_int       y[m, n] = Σ_{k ≤ n} x[m, k], x in 0..7 (counts)      int32 → int32, exact
    logcumsumexp     y[m, n] = log Σ_{k ≤ n} exp(x[m, k])                  float32 → float32

References scan in float64 (int64 for counts) and return the output dtype. Baselines: PyTorch's
eager scans (``torch.cumsum``, ``torch.logcumsumexp``: one kernel each).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch

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
    """Draw ``x [M, N]``: float32 ``N(0, 1)``, or int32 counts in ``0..7`` (a stream
    compaction's per-element output counts; their scan is its output offsets)."""
    m, n = require_axes(axes, ("M", "N"), op)
    draws = Draws(device, seed, outliers=outliers)
    if op == "cumsum_int":
        return {"x": draws.randint(0, 8, (m, n))}
    return {"x": draws.randn((m, n), dtype=torch.float32)}


def reference(inputs: Mapping[str, torch.Tensor], *, op: str) -> dict[str, torch.Tensor]:
    """The scan in float64 (int64 for counts)."""
    x = inputs["x"]
    if op == "cumsum":
        return {"y": torch.cumsum(x.double(), dim=1).float()}
    if op == "cumsum_int":
        return {"y": torch.cumsum(x.long(), dim=1).to(torch.int32)}
    if op == "logcumsumexp":
        return {"y": torch.logcumsumexp(x.double(), dim=1).float()}
    raise ValueError(f"scan: unknown op {op!r}")


def baseline(
    inputs: Mapping[str, torch.Tensor], *, op: str
) -> Callable[[], Mapping[str, torch.Tensor]]:
    """PyTorch's eager scan in the input's dtype."""
    x = inputs["x"]
    if op in ("cumsum", "cumsum_int"):
        return prepared(lambda: {"y": torch.cumsum(x, dim=1, dtype=x.dtype)})
    if op == "logcumsumexp":
        return prepared(lambda: {"y": torch.logcumsumexp(x, dim=1)})
    raise ValueError(f"scan: unknown op {op!r}")
