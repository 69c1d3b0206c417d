"""Sorting and top-k along the rows of a float32 ``[M, N]`` tensor.

``op`` (a task parameter) picks the operation; ties are broken by the smaller index first, so
every output is fully defined::

    topk     values[m, :K], indices[m, :K]: the K largest of row m, in descending order
    sort     values[m, :]: row m in ascending order
    argsort  indices[m, :]: the stable ascending order of row m (equal values keep their order)

References use ``torch.sort(stable=True)`` (descending for top-k, where a stable sort keeps the
smaller index first among equals). Baselines: PyTorch's eager ``torch.topk`` and ``torch.sort``
(CUB segmented sorts or torch's own bitonic sort by size).
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
    K: int = 0,
) -> dict[str, torch.Tensor]:
    """Draw float32 ``x [M, N]``, ``N(0, 1)`` rounded to multiples of 2⁻⁸: about 2000 distinct
    values, so ties are common and the tie rule is tested."""
    del op, K
    m, n = require_axes(axes, ("M", "N"), "sort")
    draws = Draws(device, seed, outliers=outliers)
    x = draws.randn((m, n), dtype=torch.float32)
    return {"x": torch.round(x * 256.0) / 256.0}


def reference(
    inputs: Mapping[str, torch.Tensor], *, op: str, K: int = 0
) -> dict[str, torch.Tensor]:
    """Stable sorts of each row; indices as int32."""
    x = inputs["x"]
    if op == "topk":
        values, indices = torch.sort(x, dim=1, descending=True, stable=True)
        return {"values": values[:, :K].contiguous(), "indices": indices[:, :K].to(torch.int32)}
    values, indices = torch.sort(x, dim=1, stable=True)
    if op == "sort":
        return {"values": values}
    if op == "argsort":
        return {"indices": indices.to(torch.int32)}
    raise ValueError(f"sort: unknown op {op!r}")


def baseline(
    inputs: Mapping[str, torch.Tensor], *, op: str, K: int = 0
) -> Callable[[], Mapping[str, torch.Tensor]]:
    """Eager ``torch.topk`` (sorted; its order among equal values is not defined, so its indices
    may differ from the contract's at ties: the GPU test compares its values) or
    ``torch.sort``."""
    x = inputs["x"]
    if op == "topk":

        def run_topk() -> Mapping[str, torch.Tensor]:
            values, indices = torch.topk(x, K, dim=1, largest=True, sorted=True)
            return {"values": values, "indices": indices.to(torch.int32)}

        return prepared(run_topk)
    if op == "sort":
        return prepared(lambda: {"values": torch.sort(x, dim=1).values})
    if op == "argsort":
        return prepared(lambda: {"indices": torch.sort(x, dim=1, stable=True).indices.int()})
    raise ValueError(f"sort: unknown op {op!r}")
