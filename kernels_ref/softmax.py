"""Softmax and log-softmax over the rows of a ``[M, N]`` tensor, and the causal softmax of
attention scores.

``op`` (a task parameter) picks the function::

    softmax         p[m, n] = exp(x[m, n] − max_m) / Σ_k exp(x[m, k] − max_m)      bf16 → bf16
    log_softmax     l[m, n] = x[m, n] − logsumexp(x[m, :])                        bf16 → float32
    causal_softmax  p[r, i, j] = softmax_j(scale · s[r, i, j]) over j ≤ i, 0 above the diagonal;
                    s [R, S, S] float32 scores (R = batch × heads), scale = 1/sqrt(128)

References compute in float32 (log-softmax in float64). Baselines: PyTorch's eager softmax
kernels (one kernel each: the input's logits are read once or twice, as torch's persistent or
two-pass softmax does), and ``torch.compile`` for the causal softmax (scale, mask and softmax
fused; eager would launch three kernels).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

import torch

from kernels_ref._common import Draws, compiled, prepared, require_axes

__all__ = ["CAUSAL_SCALE", "baseline", "make_inputs", "reference"]

# The causal softmax's scale: attention scores of head dimension 128.
CAUSAL_SCALE = 1.0 / math.sqrt(128.0)


def make_inputs(
    axes: Mapping[str, int],
    *,
    seed: int,
    device: str = "cuda",
    outliers: bool = False,
    op: str,
) -> dict[str, torch.Tensor]:
    """Draw logits ``N(0, 2²)``: rows far from uniform and far from one-hot. The causal scores
    are float32 ``N(0, (2·sqrt(128))²)``, so the scaled scores have standard deviation 2."""
    draws = Draws(device, seed, outliers=outliers)
    if op == "causal_softmax":
        r, s = require_axes(axes, ("R", "S"), op)
        return {"s": draws.randn((r, s, s), std=2.0 / CAUSAL_SCALE, dtype=torch.float32)}
    m, n = require_axes(axes, ("M", "N"), op)
    return {"x": draws.randn((m, n), std=2.0)}


def _causal_probabilities(s: torch.Tensor) -> torch.Tensor:
    """float32 probabilities of the scaled scores, keys above the diagonal masked out."""
    seq = s.shape[-1]
    above = torch.ones(seq, seq, dtype=torch.bool, device=s.device).triu_(1)
    return torch.softmax((s * CAUSAL_SCALE).masked_fill(above, float("-inf")), dim=-1)


def _causal(s: torch.Tensor) -> dict[str, torch.Tensor]:
    return {"p": _causal_probabilities(s).to(torch.bfloat16)}


def reference(inputs: Mapping[str, torch.Tensor], *, op: str) -> dict[str, torch.Tensor]:
    """The function in float32 (float64 for log-softmax, whose values reach −40)."""
    if op == "softmax":
        return {"p": torch.softmax(inputs["x"].float(), dim=-1)}
    if op == "log_softmax":
        return {"l": torch.log_softmax(inputs["x"].double(), dim=-1).float()}
    if op == "causal_softmax":
        return {"p": _causal_probabilities(inputs["s"])}
    raise ValueError(f"softmax: unknown op {op!r}")


def baseline(
    inputs: Mapping[str, torch.Tensor], *, op: str
) -> Callable[[], Mapping[str, torch.Tensor]]:
    """Eager ``torch.softmax`` / ``torch.log_softmax`` (float32 output), or the compiled causal
    softmax."""
    if op == "causal_softmax":
        causal = compiled(_causal)
        s = inputs["s"]
        return prepared(lambda: causal(s))
    x = inputs["x"]
    if op == "softmax":
        return prepared(lambda: {"p": torch.softmax(x, dim=-1)})
    if op == "log_softmax":
        return prepared(lambda: {"l": torch.log_softmax(x, dim=-1, dtype=torch.float32)})
    raise ValueError(f"softmax: unknown op {op!r}")
