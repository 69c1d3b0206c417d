"""Gathers and scatters of rows: embedding lookups, embedding bags, and an indexed add.

``op`` (a task parameter) picks the operation::

    embedding      out[t, :] = weight[ids[t], :]                       weight [V, D], ids [T]
    embedding_bag  out[b, :] = Σ_{l < L} weight[ids[b, l], :]          ids [B, L] (bags of L)
    index_add      out = x;  out[index[t], :] += src[t, :] for every t  (repeated indices add up)

References compute in float32 (float64 sums for the bag and the indexed add). Baselines:
PyTorch's eager ``F.embedding`` and ``F.embedding_bag(mode="sum")``, and ``torch.index_add``
(atomic adds) after a copy of ``x`` into the output.
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
    """Draw the table or rows (``N(0, 1)``) and int32 indices, uniform over the rows (so
    repeated indices occur, as in a batch of real token ids)."""
    draws = Draws(device, seed, outliers=outliers)
    if op == "embedding":
        v, d, t = require_axes(axes, ("V", "D", "T"), op)
        return {"weight": draws.randn((v, d)), "ids": draws.randint(0, v, (t,))}
    if op == "embedding_bag":
        v, d, b, bag = require_axes(axes, ("V", "D", "B", "L"), op)
        return {"weight": draws.randn((v, d)), "ids": draws.randint(0, v, (b, bag))}
    if op == "index_add":
        r, d, t = require_axes(axes, ("R", "D", "T"), op)
        x = draws.randn((r, d), dtype=torch.float32)
        index = draws.randint(0, r, (t,))
        return {"x": x, "index": index, "src": draws.randn((t, d), dtype=torch.float32)}
    raise ValueError(f"gather_scatter: unknown op {op!r}")


def reference(inputs: Mapping[str, torch.Tensor], *, op: str) -> dict[str, torch.Tensor]:
    """The gather or scatter, sums in float64, returned as float32."""
    if op == "embedding":
        return {"out": inputs["weight"][inputs["ids"].long()].float()}
    if op == "embedding_bag":
        rows = inputs["weight"].double()[inputs["ids"].long()]
        return {"out": rows.sum(dim=1).float()}
    if op == "index_add":
        out = inputs["x"].double().index_add(0, inputs["index"].long(), inputs["src"].double())
        return {"out": out.float()}
    raise ValueError(f"gather_scatter: unknown op {op!r}")


def baseline(
    inputs: Mapping[str, torch.Tensor], *, op: str
) -> Callable[[], Mapping[str, torch.Tensor]]:
    """PyTorch's eager gather or scatter."""
    if op == "embedding":
        weight, ids = inputs["weight"], inputs["ids"]
        return prepared(lambda: {"out": F.embedding(ids, weight)})
    if op == "embedding_bag":
        weight, bags = inputs["weight"], inputs["ids"]

        return prepared(lambda: {"out": F.embedding_bag(bags, weight, mode="sum")})
    if op == "index_add":
        x, index, src = inputs["x"], inputs["index"], inputs["src"]
        out = torch.empty_like(x)

        def run_add() -> Mapping[str, torch.Tensor]:
            out.copy_(x)
            return {"out": out.index_add_(0, index, src)}

        return prepared(run_add)
    raise ValueError(f"gather_scatter: unknown op {op!r}")
