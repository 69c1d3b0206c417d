"""Reductions of a bf16 ``[M, N]`` tensor along its rows or its columns.

``op`` (a task parameter) picks the reduction::

    row_sum      s[m]   = Σ_n x[m, n]                                float32 [M]
    row_argmax   i[m]   = the smallest n with x[m, n] = max_n x[m, :] int32 [M]
    column_sum   s[n]   = Σ_m x[m, n]                                float32 [N]
    row_mean_var mean[m], var[m]: the mean and the population variance (divide by N) of row m

References reduce in float64 (exact enough that the tolerance is the candidate's alone) and
return float32; the index of ``row_argmax`` is the first maximal one, which ``torch.argmax``
documents. Baselines are PyTorch's eager reductions (one kernel each), and for the mean and
variance ``torch.compile`` (one fused Welford pass over the bf16 input).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch

from kernels_ref._common import Draws, compiled, prepared, require_axes

__all__ = ["baseline", "make_inputs", "reference"]


def make_inputs(
    axes: Mapping[str, int],
    *,
    seed: int,
    device: str = "cuda",
    outliers: bool = False,
    op: str,
) -> dict[str, torch.Tensor]:
    """Draw bf16 ``x [M, N]``, ``N(1, 1)``: a nonzero mean, so a sum's relative error matters
    and a variance computed as E[x²] − E[x]² loses digits that Welford's keeps."""
    del op
    m, n = require_axes(axes, ("M", "N"), "reduction")
    draws = Draws(device, seed, outliers=outliers)
    x = draws.randn((m, n), dtype=torch.float32).add_(1.0).to(torch.bfloat16)
    return {"x": x}


def _reduce(x: torch.Tensor, op: str) -> dict[str, torch.Tensor]:
    """The reduction ``op`` of ``x`` (float64 for the reference, bf16 for the baseline)."""
    if op == "row_sum":
        return {"s": x.sum(dim=1, dtype=torch.float32 if x.dtype != torch.float64 else None)}
    if op == "column_sum":
        return {"s": x.sum(dim=0, dtype=torch.float32 if x.dtype != torch.float64 else None)}
    if op == "row_argmax":
        return {"i": torch.argmax(x, dim=1).to(torch.int32)}
    if op == "row_mean_var":
        source = x.float() if x.dtype != torch.float64 else x
        var, mean = torch.var_mean(source, dim=1, correction=0)
        return {"mean": mean, "var": var}
    raise ValueError(f"reduction: unknown op {op!r}")


def reference(inputs: Mapping[str, torch.Tensor], *, op: str) -> dict[str, torch.Tensor]:
    """The reduction in float64, returned as float32 (int32 for indices)."""
    out = _reduce(inputs["x"].double(), op)
    return {name: t if t.dtype == torch.int32 else t.float() for name, t in out.items()}


def _mean_var(x: torch.Tensor) -> dict[str, torch.Tensor]:
    return _reduce(x, "row_mean_var")


def baseline(
    inputs: Mapping[str, torch.Tensor], *, op: str
) -> Callable[[], Mapping[str, torch.Tensor]]:
    """PyTorch's eager reduction on the bf16 input, accumulating in float32; for
    ``row_mean_var`` ``torch.compile`` of it (eager would first write a float32 copy of x)."""
    x = inputs["x"]
    if op == "row_mean_var":
        function = compiled(_mean_var)
        return prepared(lambda: function(x))
    return prepared(lambda: _reduce(x, op))
