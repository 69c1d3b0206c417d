"""Multi-head attention forward and backward, ``[B, S, H, D]`` layout, baseline cuDNN.

Definitions (scale = 1/sqrt(D); causal: query i attends keys j <= i)::

    P   = softmax(scale * Q K^T)            per (b, h), rows = queries
    O   = P V                               bf16, [B, S, H, D]
    LSE = log(sum_j exp(scale * q_i . k_j))  float32, [B, H, S], natural log

Backward, given dO and the forward's O and LSE::

    P  = exp(scale * Q K^T - LSE)          (recomputed from the LSE input)
    dV = P^T dO
    dP = dO V^T
    Dr = rowsum(dO * O)                    (from the O input)
    dS = P * (dP - Dr)
    dQ = scale * dS K,  dK = scale * dS^T Q

The references compute this in float32, in blocks over (batch, head, query rows) so the extra
memory stays bounded (about 1 GiB) on long sequences.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.nn.functional as F

from kernels_ref._common import QK_STD, Draws, compiled, highest_precision, prepared, require_axes

__all__ = [
    "bwd_reference",
    "cudnn_bwd",
    "cudnn_fwd",
    "flex_fwd",
    "fwd_reference",
    "make_bwd_inputs",
    "make_fwd_inputs",
]

# Bytes of one float32 score block [heads, queries, keys]; the backward holds about four such
# temporaries at once (S/P, dP, dS and a product), so this bounds the extra memory near 1 GiB.
_SCORE_BLOCK_BYTES = 256 * 1024 * 1024


def _axes(axes: Mapping[str, int]) -> tuple[int, int, int, int]:
    b, s, h, d = require_axes(axes, ("B", "S", "H", "D"), "mha")
    return b, s, h, d


def _chunks(heads: int, q_len: int, k_len: int) -> tuple[int, int]:
    """Return ``(heads, query rows)`` per block so one score tile fits ``_SCORE_BLOCK_BYTES``."""
    row_bytes = max(1, k_len) * 4
    q_chunk = max(1, min(q_len, _SCORE_BLOCK_BYTES // row_bytes))
    h_chunk = max(1, min(heads, _SCORE_BLOCK_BYTES // (row_bytes * q_chunk)))
    return h_chunk, q_chunk


def _causal_mask(
    q0: int, q1: int, k_len: int, device: torch.device, window: int = 0
) -> torch.Tensor:
    """Return a ``[q1 - q0, k_len]`` bool mask that is True where key j > query i, and with a
    sliding ``window`` also where j <= i - window (query i sees the ``window`` keys up to it)."""
    qi = torch.arange(q0, q1, device=device).unsqueeze(1)
    kj = torch.arange(k_len, device=device).unsqueeze(0)
    masked = kj > qi
    return masked | (kj <= qi - window) if window > 0 else masked


def _heads_first(x: torch.Tensor, b: int, q0: int, q1: int, h0: int, h1: int) -> torch.Tensor:
    """Slice ``x[b, q0:q1, h0:h1, :]`` of a [B, S, H, D] tensor as float32 [heads, rows, D]."""
    return x[b, q0:q1, h0:h1].float().transpose(0, 1)


# --------------------------------------------------------------------------------------------
# Inputs
# --------------------------------------------------------------------------------------------


def make_fwd_inputs(
    axes: Mapping[str, int],
    *,
    seed: int,
    device: str = "cuda",
    outliers: bool = False,
    causal: bool = False,
    window: int = 0,
) -> dict[str, torch.Tensor]:
    """Draw bf16 ``Q, K, V`` of shape ``[B, S, H, D]``.

    ``Q`` and ``K`` are ``N(0, 2)`` (``QK_STD``), so the scaled scores have standard deviation 2
    and the softmax is neither uniform nor one-hot; ``V`` is ``N(0, 1)``. ``causal`` and
    ``window`` do not change the draw; they are accepted because tasks pass their parameters to
    every callable.
    """
    del causal, window
    b, s, h, d = _axes(axes)
    draws = Draws(device, seed, outliers=outliers)
    shape = (b, s, h, d)
    q = draws.randn(shape, std=QK_STD)
    k = draws.randn(shape, std=QK_STD)
    v = draws.randn(shape)
    return {"Q": q, "K": k, "V": v}


def make_bwd_inputs(
    axes: Mapping[str, int],
    *,
    seed: int,
    device: str = "cuda",
    outliers: bool = False,
    causal: bool = False,
) -> dict[str, torch.Tensor]:
    """Draw ``Q, K, V, dO`` and derive ``O`` (bf16) and ``LSE`` with the reference forward.

    The draw order is ``Q, K, V, dO`` (``dO`` is ``N(0, 1)``); the returned dict follows the
    definition order ``Q, K, V, O, dO, LSE``.
    """
    b, s, h, d = _axes(axes)
    draws = Draws(device, seed, outliers=outliers)
    shape = (b, s, h, d)
    q = draws.randn(shape, std=QK_STD)
    k = draws.randn(shape, std=QK_STD)
    v = draws.randn(shape)
    do = draws.randn(shape)
    fwd = fwd_reference({"Q": q, "K": k, "V": v}, causal=causal)
    o = fwd["O"].to(torch.bfloat16)
    return {"Q": q, "K": k, "V": v, "O": o, "dO": do, "LSE": fwd["LSE"]}


# --------------------------------------------------------------------------------------------
# References
# --------------------------------------------------------------------------------------------


def fwd_reference(
    inputs: Mapping[str, torch.Tensor], *, causal: bool = False, window: int = 0
) -> dict[str, torch.Tensor]:
    """Return ``{"O": [B, S, H, D], "LSE": [B, H, S]}`` in float32; with ``window`` (causal
    only), query i attends keys i - window < j <= i."""
    q, k, v = inputs["Q"], inputs["K"], inputs["V"]
    bsz, seq, heads, dim = q.shape
    scale = 1.0 / math.sqrt(dim)
    out = torch.empty((bsz, seq, heads, dim), dtype=torch.float32, device=q.device)
    lse = torch.empty((bsz, heads, seq), dtype=torch.float32, device=q.device)
    h_chunk, q_chunk = _chunks(heads, seq, seq)
    with highest_precision():
        for b in range(bsz):
            for h0 in range(0, heads, h_chunk):
                h1 = min(heads, h0 + h_chunk)
                kb = _heads_first(k, b, 0, seq, h0, h1)
                vb = _heads_first(v, b, 0, seq, h0, h1)
                for q0 in range(0, seq, q_chunk):
                    q1 = min(seq, q0 + q_chunk)
                    qb = _heads_first(q, b, q0, q1, h0, h1)
                    s = torch.matmul(qb, kb.transpose(1, 2)).mul_(scale)
                    if causal:
                        mask = _causal_mask(q0, q1, seq, q.device, window)
                        s.masked_fill_(mask, float("-inf"))
                    m = s.amax(dim=-1, keepdim=True)
                    p = torch.exp(s.sub_(m))
                    denom = p.sum(dim=-1, keepdim=True)
                    ob = torch.matmul(p, vb).div_(denom)
                    out[b, q0:q1, h0:h1] = ob.transpose(0, 1)
                    lse[b, h0:h1, q0:q1] = (m + torch.log(denom)).squeeze(-1)
    return {"O": out, "LSE": lse}


def bwd_reference(
    inputs: Mapping[str, torch.Tensor], *, causal: bool = False
) -> dict[str, torch.Tensor]:
    """Return ``{"dQ", "dK", "dV"}``, float32 ``[B, S, H, D]``, from the definition's formulas.

    ``P`` is recomputed from the ``LSE`` input and ``rowsum(dO * O)`` uses the ``O`` input, as a
    kernel given these inputs does; with the forward's own ``O`` and ``LSE`` these are the exact
    gradients of ``O`` with respect to ``Q, K, V``.
    """
    q, k, v = inputs["Q"], inputs["K"], inputs["V"]
    o, do, lse = inputs["O"], inputs["dO"], inputs["LSE"]
    bsz, seq, heads, dim = q.shape
    scale = 1.0 / math.sqrt(dim)
    dq = torch.empty((bsz, seq, heads, dim), dtype=torch.float32, device=q.device)
    dk = torch.empty_like(dq)
    dv = torch.empty_like(dq)
    h_chunk, q_chunk = _chunks(heads, seq, seq)
    with highest_precision():
        for b in range(bsz):
            for h0 in range(0, heads, h_chunk):
                h1 = min(heads, h0 + h_chunk)
                kb = _heads_first(k, b, 0, seq, h0, h1)
                vb = _heads_first(v, b, 0, seq, h0, h1)
                dk_acc = torch.zeros_like(kb)
                dv_acc = torch.zeros_like(vb)
                for q0 in range(0, seq, q_chunk):
                    q1 = min(seq, q0 + q_chunk)
                    qb = _heads_first(q, b, q0, q1, h0, h1)
                    ob = _heads_first(o, b, q0, q1, h0, h1)
                    dob = _heads_first(do, b, q0, q1, h0, h1)
                    lse_b = lse[b, h0:h1, q0:q1].float().unsqueeze(-1)
                    s = torch.matmul(qb, kb.transpose(1, 2)).mul_(scale)
                    if causal:
                        s.masked_fill_(_causal_mask(q0, q1, seq, q.device), float("-inf"))
                    p = torch.exp(s.sub_(lse_b))
                    dv_acc += torch.matmul(p.transpose(1, 2), dob)
                    dp = torch.matmul(dob, vb.transpose(1, 2))
                    row_dot = (dob * ob).sum(dim=-1, keepdim=True)
                    ds = p.mul_(dp.sub_(row_dot))
                    dq[b, q0:q1, h0:h1] = torch.matmul(ds, kb).mul_(scale).transpose(0, 1)
                    dk_acc += torch.matmul(ds.transpose(1, 2), qb).mul_(scale)
                dk[b, :, h0:h1] = dk_acc.transpose(0, 1)
                dv[b, :, h0:h1] = dv_acc.transpose(0, 1)
    return {"dQ": dq, "dK": dk, "dV": dv}


# --------------------------------------------------------------------------------------------
# cuDNN baselines
# --------------------------------------------------------------------------------------------


def _bhsd(x: torch.Tensor) -> torch.Tensor:
    """View a [B, S, H, D] tensor as [B, H, S, D] (no copy; cuDNN takes the strides as given)."""
    return x.transpose(1, 2)


def _require_cudnn(x: torch.Tensor) -> None:
    if x.device.type != "cuda":
        raise RuntimeError(f"cuDNN attention baselines need CUDA tensors, got {x.device}")
    if not torch.backends.cudnn.is_available():
        raise RuntimeError("cuDNN attention baseline: torch.backends.cudnn is not available")


def _sdpa_cudnn_only(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float
) -> torch.Tensor:
    """Run SDPA with only the cuDNN backend enabled; SDPA raises if cuDNN cannot run it."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)


def _check_cudnn_selectable(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float
) -> None:
    """Raise ``RuntimeError`` unless SDPA's cuDNN backend accepts this problem."""
    try:
        _sdpa_cudnn_only(q, k, v, causal, scale)
    except RuntimeError as exc:
        raise RuntimeError(
            f"cuDNN attention is not available for Q{tuple(q.shape)} {q.dtype} "
            f"(causal={causal}) on this GPU/torch build: {exc}"
        ) from exc


def _lse_bhs(lse: torch.Tensor) -> torch.Tensor:
    # cuDNN's softmax stats come back as [B, H, S, 1] or [B, H, S] depending on the torch
    # version; squeeze is a view either way.
    return lse.squeeze(-1) if lse.dim() == 4 else lse


def cudnn_fwd(
    inputs: Mapping[str, torch.Tensor], *, causal: bool = False
) -> Callable[[], dict[str, torch.Tensor]]:
    """Prepare cuDNN attention forward; return the closure that runs it.

    Timed: one call of ``torch.ops.aten._scaled_dot_product_cudnn_attention`` (the op SDPA's cuDNN
    backend dispatches to) with ``compute_log_sumexp=True`` on ``[B, H, S, D]`` views, i.e. one
    cuDNN SDPA forward graph execution writing O and the softmax stats (LSE). The closure returns
    ``{"O": [B, S, H, D], "LSE": [B, H, S]}`` as views. If this torch has no such op, the closure
    runs ``F.scaled_dot_product_attention`` restricted to the cuDNN backend and returns only
    ``{"O"}``. Preparation checks that cuDNN accepts the problem (raising otherwise) and makes one
    untimed call so the cuDNN graph is built and cached before timing.
    """
    q, k, v = (_bhsd(inputs[n]) for n in ("Q", "K", "V"))
    _require_cudnn(q)
    scale = 1.0 / math.sqrt(q.shape[-1])
    _check_cudnn_selectable(q, k, v, causal, scale)
    op: Any = getattr(torch.ops.aten, "_scaled_dot_product_cudnn_attention", None)

    if op is None:

        def run_sdpa() -> dict[str, torch.Tensor]:
            return {"O": _sdpa_cudnn_only(q, k, v, causal, scale).transpose(1, 2)}

        run_sdpa()
        return run_sdpa

    def run() -> dict[str, torch.Tensor]:
        res = op(q, k, v, None, True, 0.0, causal, False, scale=scale)
        return {"O": res[0].transpose(1, 2), "LSE": _lse_bhs(res[1])}

    run()
    return run


def cudnn_bwd(
    inputs: Mapping[str, torch.Tensor], *, causal: bool = False
) -> Callable[[], dict[str, torch.Tensor]]:
    """Prepare cuDNN attention backward; return the closure that runs it.

    Timed: one call of ``torch.ops.aten._scaled_dot_product_cudnn_attention_backward`` on the
    task's own ``Q, K, V, O, dO, LSE`` (as ``[B, H, S, D]`` views; no copies since O and dO share
    Q's layout), i.e. one cuDNN SDPA backward graph execution writing dQ, dK, dV. Preparation runs
    the cuDNN forward once, only to obtain the bookkeeping arguments the backward op expects
    (philox seed/offset, sequence metadata, the LSE shape convention), then makes one untimed
    backward call so the cuDNN graph is built and cached. If this torch lacks the op, the closure
    instead runs ``torch.autograd.grad`` through a cuDNN-only SDPA forward prepared once (that
    path uses cuDNN's own O and LSE and lets autograd make ``dO`` contiguous, a copy that is then
    timed too). The closure returns ``{"dQ", "dK", "dV"}`` as ``[B, S, H, D]`` views.
    """
    q, k, v, o, do = (_bhsd(inputs[n]) for n in ("Q", "K", "V", "O", "dO"))
    lse = inputs["LSE"]
    _require_cudnn(q)
    scale = 1.0 / math.sqrt(q.shape[-1])
    _check_cudnn_selectable(q, k, v, causal, scale)
    fwd_op: Any = getattr(torch.ops.aten, "_scaled_dot_product_cudnn_attention", None)
    bwd_op: Any = getattr(torch.ops.aten, "_scaled_dot_product_cudnn_attention_backward", None)

    if fwd_op is None or bwd_op is None:
        return _autograd_bwd(q, k, v, do, causal, scale)

    fwd = fwd_op(q, k, v, None, True, 0.0, causal, False, scale=scale)
    # reshape, not view: a non-contiguous LSE is copied once here, never inside the closure.
    lse_arg = lse.reshape(fwd[1].shape)
    philox_seed, philox_offset = fwd[6], fwd[7]
    cum_q, cum_k, max_q, max_k = fwd[2], fwd[3], fwd[4], fwd[5]
    del fwd

    def run() -> dict[str, torch.Tensor]:
        dq, dk, dv = bwd_op(
            do, q, k, v, o, lse_arg, philox_seed, philox_offset, None,
            cum_q, cum_k, max_q, max_k, 0.0, causal, scale=scale,
        )  # fmt: skip
        return {"dQ": dq.transpose(1, 2), "dK": dk.transpose(1, 2), "dV": dv.transpose(1, 2)}

    run()
    return run


def _autograd_bwd(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    do: torch.Tensor,
    causal: bool,
    scale: float,
) -> Callable[[], dict[str, torch.Tensor]]:
    with torch.enable_grad():
        leaves = [x.detach().requires_grad_(True) for x in (q, k, v)]
        out = _sdpa_cudnn_only(leaves[0], leaves[1], leaves[2], causal, scale)

    def run() -> dict[str, torch.Tensor]:
        dq, dk, dv = torch.autograd.grad(out, leaves, grad_outputs=do, retain_graph=True)
        return {"dQ": dq.transpose(1, 2), "dK": dk.transpose(1, 2), "dV": dv.transpose(1, 2)}

    run()
    return run


# --------------------------------------------------------------------------------------------
# FlexAttention baseline (sliding window: neither cuDNN through SDPA nor FlashInfer, absent on the
# GPU host, takes one)
# --------------------------------------------------------------------------------------------


def flex_fwd(
    inputs: Mapping[str, torch.Tensor], *, causal: bool = True, window: int = 0
) -> Callable[[], Mapping[str, torch.Tensor]]:
    """Prepare FlexAttention (``torch.compile`` of ``flex_attention``) with a causal
    sliding-window block mask built once, outside the timed call; return the closure that runs
    it. The closure returns ``{"O": [B, S, H, D], "LSE": [B, H, S]}`` as views; FlexAttention's
    public LSE is the natural-log one (it converts its base-2 kernel value)."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    if not causal or window <= 0:
        raise ValueError("flex_fwd is the sliding-window baseline: causal with a window")
    q, k, v = (_bhsd(inputs[n]) for n in ("Q", "K", "V"))
    seq = q.shape[2]

    def sliding(b: Any, h: Any, qi: Any, kj: Any) -> Any:
        return (kj <= qi) & (kj > qi - window)

    mask = create_block_mask(sliding, None, None, seq, seq, device=q.device)
    attend = compiled(flex_attention)

    def run() -> dict[str, torch.Tensor]:
        out, lse = attend(q, k, v, block_mask=mask, return_lse=True)
        return {"O": out.transpose(1, 2), "LSE": lse}

    return prepared(run)
