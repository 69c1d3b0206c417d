"""Grouped-query attention in FlashInfer's layouts: paged decode and causal ragged prefill.

Fixed geometry: 32 query heads share 8 KV heads (query head ``h`` reads KV head ``h // 4``),
head_dim 128, page size 16, scale ``1/sqrt(128)``. LSE is the natural-log logsumexp of the scaled
scores (FlashInfer itself reports base 2; the baselines convert on read, outside timing).

Decode (one query token per sequence, paged KV cache in NHD layout)::

    q [batch_size, 32, 128]      k_cache, v_cache [num_pages, 16, 8, 128]
    kv_indptr [batch_size + 1]   kv_indices [num_kv_indices]   kv_last_page_len [batch_size]
    -> o [batch_size, 32, 128], lse [batch_size, 32]

Sequence ``b`` reads pages ``kv_indices[kv_indptr[b]:kv_indptr[b+1]]`` in order, the last one
holding ``kv_last_page_len[b]`` valid tokens (1..16).

Prefill (ragged, causal aligned bottom-right)::

    q [total_q, 32, 128]   k, v [total_kv, 8, 128]   qo_indptr, kv_indptr [batch_size + 1]
    -> o [total_q, 32, 128], lse [total_q, 32]

Query ``i`` (0-based within its sequence) attends key ``j`` iff ``j <= i + (kv_len - q_len)``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from kernels_ref._common import (
    LN2,
    QK_STD,
    Draws,
    LazyOutputs,
    check_axes,
    highest_precision,
)

__all__ = [
    "HEAD_DIM",
    "NUM_KV_HEADS",
    "NUM_QO_HEADS",
    "PAGE_SIZE",
    "decode_reference",
    "flashinfer_decode",
    "flashinfer_prefill",
    "make_decode_inputs",
    "make_prefill_inputs",
    "prefill_reference",
]

NUM_QO_HEADS = 32
NUM_KV_HEADS = 8
GROUP_SIZE = NUM_QO_HEADS // NUM_KV_HEADS
HEAD_DIM = 128
PAGE_SIZE = 16
SM_SCALE = 1.0 / math.sqrt(HEAD_DIM)

# FlashInfer's recommended float workspace (split-KV partial results and scheduling metadata).
_WORKSPACE_BYTES = 128 * 1024 * 1024
# Bytes of one float32 score block [kv heads, group, query rows, keys] in the prefill reference.
_SCORE_BLOCK_BYTES = 256 * 1024 * 1024

_FLASHINFER_MISSING = (
    "FlashInfer is required for the GQA baselines: pip install 'ptxgym[flashinfer]' "
    "(flashinfer-python)"
)

_CONST_AXES = {
    "num_qo_heads": NUM_QO_HEADS,
    "num_kv_heads": NUM_KV_HEADS,
    "head_dim": HEAD_DIM,
    "page_size": PAGE_SIZE,
}


def _import_flashinfer() -> Any:
    try:
        import flashinfer
    except ImportError as exc:
        raise ImportError(_FLASHINFER_MISSING) from exc
    return flashinfer


def _lengths(values: Sequence[int], name: str, op: str) -> list[int]:
    out = [int(x) for x in values]
    if not out or any(x <= 0 for x in out):
        raise ValueError(f"{op}: {name} must be a non-empty list of positive ints, got {out}")
    return out


def _indptr(lengths: Sequence[int], device: str | torch.device) -> torch.Tensor:
    offsets = [0]
    for n in lengths:
        offsets.append(offsets[-1] + n)
    return torch.tensor(offsets, dtype=torch.int32, device=device)


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None) -> Any:
    """Grouped attention in float32 for one block of rows.

    ``q`` is ``[kv heads, group, rows, D]``, ``k``/``v`` are ``[kv heads, keys, D]`` and ``mask``
    (True = masked) broadcasts to ``[rows, keys]``. Returns ``(o [kv, group, rows, D], lse
    [kv, group, rows])``.
    """
    s = torch.matmul(q, k.unsqueeze(1).transpose(-1, -2)).mul_(SM_SCALE)
    if mask is not None:
        s.masked_fill_(mask, float("-inf"))
    m = s.amax(dim=-1, keepdim=True)
    p = torch.exp(s.sub_(m))
    denom = p.sum(dim=-1, keepdim=True)
    o = torch.matmul(p, v.unsqueeze(1)).div_(denom)
    return o, (m + torch.log(denom)).squeeze(-1)


# --------------------------------------------------------------------------------------------
# Decode
# --------------------------------------------------------------------------------------------


def make_decode_inputs(
    axes: Mapping[str, int],
    *,
    seed: int,
    device: str = "cuda",
    outliers: bool = False,
    kv_lens: Sequence[int],
) -> dict[str, torch.Tensor]:
    """Draw a paged-KV decode batch whose sequence ``b`` has ``kv_lens[b]`` cached tokens.

    ``q`` and ``k_cache`` are ``N(0, 2)`` (scores with standard deviation 2: neither uniform nor
    one-hot), ``v_cache`` is ``N(0, 1)``; every page slot is filled, so a kernel that reads past
    ``kv_last_page_len`` gets garbage. Pages are assigned by a random permutation, so each
    sequence's pages are scattered through the cache.
    """
    op = "gqa decode"
    lens = _lengths(kv_lens, "kv_lens", op)
    pages = [-(-n // PAGE_SIZE) for n in lens]
    num_pages = sum(pages)
    batch = len(lens)
    check_axes(
        axes,
        {"batch_size": batch, "num_pages": num_pages, "num_kv_indices": num_pages, **_CONST_AXES},
        op,
    )
    draws = Draws(device, seed, outliers=outliers)
    q = draws.randn((batch, NUM_QO_HEADS, HEAD_DIM), std=QK_STD)
    cache_shape = (num_pages, PAGE_SIZE, NUM_KV_HEADS, HEAD_DIM)
    k_cache = draws.randn(cache_shape, std=QK_STD)
    v_cache = draws.randn(cache_shape)
    kv_indptr = _indptr(pages, device)
    kv_indices = draws.randperm(num_pages)
    last = [n - PAGE_SIZE * (p - 1) for n, p in zip(lens, pages, strict=True)]
    kv_last_page_len = torch.tensor(last, dtype=torch.int32, device=device)
    return {
        "q": q,
        "k_cache": k_cache,
        "v_cache": v_cache,
        "kv_indptr": kv_indptr,
        "kv_indices": kv_indices,
        "kv_last_page_len": kv_last_page_len,
    }


def decode_reference(
    inputs: Mapping[str, torch.Tensor], *, kv_lens: Sequence[int] | None = None
) -> dict[str, torch.Tensor]:
    """Return ``{"o": [batch, 32, 128], "lse": [batch, 32]}`` in float32, one sequence at a time.

    Lengths come from the page table; ``kv_lens``, if given, must agree with it.
    """
    q, k_cache, v_cache = inputs["q"], inputs["k_cache"], inputs["v_cache"]
    indptr = inputs["kv_indptr"].tolist()
    last = inputs["kv_last_page_len"].tolist()
    indices = inputs["kv_indices"].long()
    batch = q.shape[0]
    out = torch.empty((batch, NUM_QO_HEADS, HEAD_DIM), dtype=torch.float32, device=q.device)
    lse = torch.empty((batch, NUM_QO_HEADS), dtype=torch.float32, device=q.device)
    with highest_precision():
        for b in range(batch):
            p0, p1 = indptr[b], indptr[b + 1]
            n = (p1 - p0 - 1) * PAGE_SIZE + last[b]
            if kv_lens is not None and int(kv_lens[b]) != n:
                raise ValueError(f"gqa decode: kv_lens[{b}]={kv_lens[b]} but the pages hold {n}")
            pages = indices[p0:p1]
            # [pages, 16, 8, 128] -> [tokens, 8, 128] -> [8, tokens, 128]
            kb = k_cache[pages].reshape(-1, NUM_KV_HEADS, HEAD_DIM)[:n].float().transpose(0, 1)
            vb = v_cache[pages].reshape(-1, NUM_KV_HEADS, HEAD_DIM)[:n].float().transpose(0, 1)
            # Query head h = kv * GROUP_SIZE + g, so a [32, D] row splits as [8, 4, 1, D].
            qb = q[b].float().view(NUM_KV_HEADS, GROUP_SIZE, 1, HEAD_DIM)
            ob, lb = _attend(qb, kb, vb, None)
            out[b] = ob.reshape(NUM_QO_HEADS, HEAD_DIM)
            lse[b] = lb.reshape(NUM_QO_HEADS)
    return {"o": out, "lse": lse}


def flashinfer_decode(
    inputs: Mapping[str, torch.Tensor],
    *,
    kv_lens: Sequence[int] | None = None,
    use_tensor_cores: bool | None = None,
) -> Callable[[], Mapping[str, torch.Tensor]]:
    """Plan ``flashinfer.BatchDecodeWithPagedKVCacheWrapper``; return the closure that runs it.

    Preparation allocates the 128 MiB workspace, builds the wrapper (NHD layout), plans it for
    this page table and makes one untimed run (JIT/module loading happens there). Timed: one
    ``wrapper.run(q, (k_cache, v_cache), out=o, lse=lse, return_lse=True)`` into preallocated
    buffers. ``use_tensor_cores`` defaults to True for group size >= 4 (FlashInfer documents the
    tensor-core path as faster for large GQA groups; serving stacks use the same rule). The
    closure returns ``{"o", "lse"}``; ``lse`` is converted from FlashInfer's base 2 to natural
    log when it is read, so the conversion is never timed.
    """
    del kv_lens
    fi = _import_flashinfer()
    q, k_cache, v_cache = inputs["q"], inputs["k_cache"], inputs["v_cache"]
    tensor_cores = GROUP_SIZE >= 4 if use_tensor_cores is None else bool(use_tensor_cores)
    workspace = torch.zeros(_WORKSPACE_BYTES, dtype=torch.uint8, device=q.device)
    wrapper = fi.BatchDecodeWithPagedKVCacheWrapper(workspace, "NHD", use_tensor_cores=tensor_cores)
    wrapper.plan(
        inputs["kv_indptr"],
        inputs["kv_indices"],
        inputs["kv_last_page_len"],
        NUM_QO_HEADS,
        NUM_KV_HEADS,
        HEAD_DIM,
        PAGE_SIZE,
        pos_encoding_mode="NONE",
        q_data_type=q.dtype,
        kv_data_type=k_cache.dtype,
        sm_scale=SM_SCALE,
    )
    out = torch.empty_like(q)
    lse2 = torch.empty(q.shape[:2], dtype=torch.float32, device=q.device)
    kv = (k_cache, v_cache)

    def run() -> Mapping[str, torch.Tensor]:
        wrapper.run(q, kv, out=out, lse=lse2, return_lse=True)
        return LazyOutputs({"o": out, "lse": lambda: lse2 * LN2})

    run()
    return run


# --------------------------------------------------------------------------------------------
# Prefill
# --------------------------------------------------------------------------------------------


def make_prefill_inputs(
    axes: Mapping[str, int],
    *,
    seed: int,
    device: str = "cuda",
    outliers: bool = False,
    q_lens: Sequence[int],
    kv_lens: Sequence[int],
) -> dict[str, torch.Tensor]:
    """Draw a ragged causal prefill batch; sequence ``b`` has ``q_lens[b] <= kv_lens[b]``.

    ``q`` and ``k`` are ``N(0, 2)``, ``v`` is ``N(0, 1)``.
    """
    op = "gqa prefill"
    qls = _lengths(q_lens, "q_lens", op)
    kls = _lengths(kv_lens, "kv_lens", op)
    if len(qls) != len(kls):
        raise ValueError(f"{op}: q_lens has {len(qls)} entries, kv_lens {len(kls)}")
    if any(ql > kl for ql, kl in zip(qls, kls, strict=True)):
        # Bottom-right alignment would leave the first queries with no key at all.
        raise ValueError(f"{op}: every q_len must be <= its kv_len, got {qls} / {kls}")
    total_q, total_kv = sum(qls), sum(kls)
    check_axes(
        axes,
        {"batch_size": len(qls), "total_q": total_q, "total_kv": total_kv, **_CONST_AXES},
        op,
    )
    draws = Draws(device, seed, outliers=outliers)
    q = draws.randn((total_q, NUM_QO_HEADS, HEAD_DIM), std=QK_STD)
    k = draws.randn((total_kv, NUM_KV_HEADS, HEAD_DIM), std=QK_STD)
    v = draws.randn((total_kv, NUM_KV_HEADS, HEAD_DIM))
    return {
        "q": q,
        "k": k,
        "v": v,
        "qo_indptr": _indptr(qls, device),
        "kv_indptr": _indptr(kls, device),
    }


def prefill_reference(
    inputs: Mapping[str, torch.Tensor],
    *,
    q_lens: Sequence[int] | None = None,
    kv_lens: Sequence[int] | None = None,
) -> dict[str, torch.Tensor]:
    """Return ``{"o": [total_q, 32, 128], "lse": [total_q, 32]}`` in float32.

    One sequence at a time, in blocks of query rows so the score tile stays bounded. Lengths come
    from the indptr arrays; ``q_lens``/``kv_lens``, if given, must agree with them.
    """
    q, k, v = inputs["q"], inputs["k"], inputs["v"]
    qo_indptr = inputs["qo_indptr"].tolist()
    kv_indptr = inputs["kv_indptr"].tolist()
    total_q = q.shape[0]
    out = torch.empty((total_q, NUM_QO_HEADS, HEAD_DIM), dtype=torch.float32, device=q.device)
    lse = torch.empty((total_q, NUM_QO_HEADS), dtype=torch.float32, device=q.device)
    with highest_precision():
        for b in range(len(qo_indptr) - 1):
            q0, q1 = qo_indptr[b], qo_indptr[b + 1]
            k0, k1 = kv_indptr[b], kv_indptr[b + 1]
            ql, kl = q1 - q0, k1 - k0
            if q_lens is not None and int(q_lens[b]) != ql:
                raise ValueError(f"gqa prefill: q_lens[{b}]={q_lens[b]} but qo_indptr gives {ql}")
            if kv_lens is not None and int(kv_lens[b]) != kl:
                raise ValueError(f"gqa prefill: kv_lens[{b}]={kv_lens[b]} but kv_indptr gives {kl}")
            if ql == 0:
                continue
            kb = k[k0:k1].float().transpose(0, 1)  # [8, kl, D]
            vb = v[k0:k1].float().transpose(0, 1)
            rows = max(1, _SCORE_BLOCK_BYTES // (NUM_QO_HEADS * max(1, kl) * 4))
            keys = torch.arange(kl, device=q.device)
            for r0 in range(0, ql, rows):
                r1 = min(ql, r0 + rows)
                # [rows, 32, D] -> [8, 4, rows, D] with query head h = kv * 4 + g.
                qb = q[q0 + r0 : q0 + r1].float().view(r1 - r0, NUM_KV_HEADS, GROUP_SIZE, HEAD_DIM)
                qb = qb.permute(1, 2, 0, 3)
                limit = torch.arange(r0, r1, device=q.device) + (kl - ql)
                mask = keys.unsqueeze(0) > limit.unsqueeze(1)
                ob, lb = _attend(qb, kb, vb, mask)
                out[q0 + r0 : q0 + r1] = ob.permute(2, 0, 1, 3).reshape(r1 - r0, NUM_QO_HEADS, -1)
                lse[q0 + r0 : q0 + r1] = lb.permute(2, 0, 1).reshape(r1 - r0, NUM_QO_HEADS)
    return {"o": out, "lse": lse}


def flashinfer_prefill(
    inputs: Mapping[str, torch.Tensor],
    *,
    q_lens: Sequence[int] | None = None,
    kv_lens: Sequence[int] | None = None,
) -> Callable[[], Mapping[str, torch.Tensor]]:
    """Plan ``flashinfer.BatchPrefillWithRaggedKVCacheWrapper`` (causal); return its closure.

    Preparation allocates the 128 MiB workspace, builds the wrapper (NHD), plans it with
    ``causal=True`` (FlashInfer aligns the causal mask bottom-right, as the definition does) and
    makes one untimed run. Timed: one ``wrapper.run(q, k, v, out=o, lse=lse, return_lse=True)``
    into preallocated buffers. The closure returns ``{"o", "lse"}``, ``lse`` converted from base 2
    to natural log when read, outside timing.
    """
    del q_lens, kv_lens
    fi = _import_flashinfer()
    q, k, v = inputs["q"], inputs["k"], inputs["v"]
    workspace = torch.zeros(_WORKSPACE_BYTES, dtype=torch.uint8, device=q.device)
    wrapper = fi.BatchPrefillWithRaggedKVCacheWrapper(workspace, "NHD")
    wrapper.plan(
        inputs["qo_indptr"],
        inputs["kv_indptr"],
        NUM_QO_HEADS,
        NUM_KV_HEADS,
        HEAD_DIM,
        causal=True,
        pos_encoding_mode="NONE",
        sm_scale=SM_SCALE,
        q_data_type=q.dtype,
        kv_data_type=k.dtype,
    )
    out = torch.empty_like(q)
    lse2 = torch.empty(q.shape[:2], dtype=torch.float32, device=q.device)

    def run() -> Mapping[str, torch.Tensor]:
        wrapper.run(q, k, v, out=out, lse=lse2, return_lse=True)
        return LazyOutputs({"o": out, "lse": lambda: lse2 * LN2})

    run()
    return run
