"""Elementwise activations over a ``[M, N]`` tensor, one output element per input element.

``op`` (a task parameter) picks the function; every one reads ``x`` (and ``SiLUMul`` also ``up``)
and writes ``y`` of the same shape and dtype::

    gelu          y = x · Φ(x),  Φ the standard normal CDF (erf form)
    gelu_tanh     y = 0.5 x (1 + tanh(√(2/π) (x + 0.044715 x³)))
    silu          y = x · sigmoid(x)
    relu_squared  y = max(x, 0)²
    silu_mul      y = silu(x) · up          (the SwiGLU activation of a gated MLP)

References compute in float32 from the inputs' values. Baselines: PyTorch's eager kernels where
one kernel does the whole function (gelu, gelu_tanh, silu: each a single vectorised kernel), and
``torch.compile`` where eager would launch several (relu_squared, silu_mul), so the baseline is
one fused kernel either way.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch
import torch.nn.functional as F

from kernels_ref._common import Draws, compiled, prepared, require_axes, torch_dtype

__all__ = ["baseline", "make_inputs", "reference"]


def _relu_squared(x: torch.Tensor) -> torch.Tensor:
    return torch.square(F.relu(x))


def _silu_mul(x: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    return F.silu(x) * up


_FUNCTIONS: dict[str, Callable[..., torch.Tensor]] = {
    "gelu": F.gelu,
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "silu": F.silu,
    "relu_squared": _relu_squared,
    "silu_mul": _silu_mul,
}
# The functions whose eager form launches more than one kernel: their baseline is compiled.
_FUSED = frozenset({"relu_squared", "silu_mul"})


def _function(op: str) -> Callable[..., torch.Tensor]:
    if op not in _FUNCTIONS:
        raise ValueError(f"elementwise: unknown op {op!r}; one of {sorted(_FUNCTIONS)}")
    return _FUNCTIONS[op]


def _operands(inputs: Mapping[str, torch.Tensor], op: str) -> list[torch.Tensor]:
    return [inputs["x"], inputs["up"]] if op == "silu_mul" else [inputs["x"]]


def make_inputs(
    axes: Mapping[str, int],
    *,
    seed: int,
    device: str = "cuda",
    outliers: bool = False,
    op: str,
    dtype: str = "bfloat16",
) -> dict[str, torch.Tensor]:
    """Draw ``x`` (and ``up`` for ``silu_mul``) ``[M, N]``, ``N(0, 2²)`` of ``dtype``: wide
    enough that both tails of every activation are exercised."""
    m, n = require_axes(axes, ("M", "N"), "elementwise")
    draws = Draws(device, seed, outliers=outliers)
    kind = torch_dtype(dtype)
    inputs = {"x": draws.randn((m, n), std=2.0, dtype=kind)}
    if op == "silu_mul":
        inputs["up"] = draws.randn((m, n), dtype=kind)
    return inputs


def reference(
    inputs: Mapping[str, torch.Tensor], *, op: str, dtype: str = "bfloat16"
) -> dict[str, torch.Tensor]:
    """Return ``{"y": f(x)}`` in float32."""
    del dtype
    return {"y": _function(op)(*(t.float() for t in _operands(inputs, op)))}


def baseline(
    inputs: Mapping[str, torch.Tensor], *, op: str, dtype: str = "bfloat16"
) -> Callable[[], Mapping[str, torch.Tensor]]:
    """Prepare the baseline (eager, or ``torch.compile`` for ``_FUSED``); return its closure."""
    del dtype
    operands = _operands(inputs, op)
    function = compiled(_function(op)) if op in _FUSED else _function(op)

    def run() -> Mapping[str, torch.Tensor]:
        return {"y": function(*operands)}

    return prepared(run)
