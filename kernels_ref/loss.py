"""Per-row losses over ``[M, V]`` logits (a language model's vocabulary) and ``[M, N]`` scores.

``op`` (a task parameter) picks the loss; every one writes a float32 loss per row::

    cross_entropy  loss[m] = logsumexp(z[m, :]) − z[m, target[m]]
    kl_div         loss[m] = Σ_v p[m, v] (log p[m, v] − log q[m, v]),
                   p = softmax(z_p[m, :]) (the teacher), q = softmax(z_q[m, :]) (the student)
    bce_logits     loss[m] = mean_n [max(z, 0) − z·y + log(1 + exp(−|z|))], y ∈ {0, 1} (bf16)

References compute in float64 and return float32. Baselines: ``torch.compile`` of the PyTorch
definition (``F.cross_entropy``, ``F.kl_div`` with ``log_target``,
``F.binary_cross_entropy_with_logits``, each per row): inductor fuses the softmax or the
elementwise loss with the row reduction into one pass, where eager launches two or more.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch
import torch.nn.functional as F

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
    """Draw bf16 logits ``N(0, 2²)``, and int32 targets uniform over the vocabulary, a second
    set of logits, or 0/1 labels, as the loss takes."""
    draws = Draws(device, seed, outliers=outliers)
    if op == "cross_entropy":
        m, v = require_axes(axes, ("M", "V"), op)
        return {"z": draws.randn((m, v), std=2.0), "target": draws.randint(0, v, (m,))}
    if op == "kl_div":
        m, v = require_axes(axes, ("M", "V"), op)
        return {"z_p": draws.randn((m, v), std=2.0), "z_q": draws.randn((m, v), std=2.0)}
    if op == "bce_logits":
        m, n = require_axes(axes, ("M", "N"), op)
        labels = draws.randint(0, 2, (m, n)).to(torch.bfloat16)
        return {"z": draws.randn((m, n), std=2.0), "y": labels}
    raise ValueError(f"loss: unknown op {op!r}")


def _loss(inputs: Mapping[str, torch.Tensor], op: str) -> torch.Tensor:
    """The per-row loss of ``inputs`` in their own dtype (float64 for the reference)."""
    if op == "cross_entropy":
        return F.cross_entropy(inputs["z"], inputs["target"].long(), reduction="none")
    if op == "kl_div":
        log_p = F.log_softmax(inputs["z_p"], dim=-1)
        log_q = F.log_softmax(inputs["z_q"], dim=-1)
        return F.kl_div(log_q, log_p, reduction="none", log_target=True).sum(dim=-1)
    if op == "bce_logits":
        z, y = inputs["z"], inputs["y"]
        return F.binary_cross_entropy_with_logits(z, y, reduction="none").mean(dim=-1)
    raise ValueError(f"loss: unknown op {op!r}")


def reference(inputs: Mapping[str, torch.Tensor], *, op: str) -> dict[str, torch.Tensor]:
    """The per-row loss in float64, as float32."""
    wide = {name: t if name == "target" else t.double() for name, t in inputs.items()}
    return {"loss": _loss(wide, op).float()}


def _cross_entropy(z: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(z.float(), target.long(), reduction="none")


def _kl_div(z_p: torch.Tensor, z_q: torch.Tensor) -> torch.Tensor:
    return _loss({"z_p": z_p.float(), "z_q": z_q.float()}, "kl_div")


def _bce_logits(z: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return _loss({"z": z.float(), "y": y.float()}, "bce_logits")


_COMPILED_LOSSES: dict[str, tuple[Callable[..., torch.Tensor], tuple[str, ...]]] = {
    "cross_entropy": (_cross_entropy, ("z", "target")),
    "kl_div": (_kl_div, ("z_p", "z_q")),
    "bce_logits": (_bce_logits, ("z", "y")),
}


def baseline(
    inputs: Mapping[str, torch.Tensor], *, op: str
) -> Callable[[], Mapping[str, torch.Tensor]]:
    """``torch.compile`` of the loss on the bf16 inputs, computing in float32."""
    function, names = _COMPILED_LOSSES[op]
    loss = compiled(function)
    operands = [inputs[name] for name in names]
    return prepared(lambda: {"loss": loss(*operands)})
