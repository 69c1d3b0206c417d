"""Grouped-query attention decode over a paged KV cache, in Triton.

One program per (sequence, KV head) serves the 4 query heads that share the KV head: it walks
the sequence's pages 32 tokens at a time (two 16-token pages), gathering each token's page
through ``kv_indices``, with an online softmax in base 2. One query token per head leaves too
few rows for a matrix instruction, so the products are reductions on the CUDA cores: this
kernel is correct and memory-bound, and executes no target instruction.
"""

import math

import triton
import triton.language as tl

NUM_QO_HEADS = 32
NUM_KV_HEADS = 8
HEAD_DIM = 128
PAGE_SIZE = 16
LOG2E = 1.4426950408889634
LN2 = tl.constexpr(0.6931471805599453)  # used inside the kernel


@triton.jit
def gqa_decode_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    indptr_ptr,
    indices_ptr,
    last_len_ptr,
    o_ptr,
    lse_ptr,
    qk_scale,
    NUM_QO: tl.constexpr,
    NUM_KV: tl.constexpr,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    PAGE: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    first_page = tl.load(indptr_ptr + seq)
    pages = tl.load(indptr_ptr + seq + 1) - first_page
    length = (pages - 1) * PAGE + tl.load(last_len_ptr + seq)
    offs_g = tl.arange(0, GROUP)
    offs_d = tl.arange(0, HEAD_DIM)
    offs_n = tl.arange(0, BLOCK_N)
    q_rows = seq * NUM_QO + kv_head * GROUP + offs_g
    q = tl.load(q_ptr + q_rows[:, None] * HEAD_DIM + offs_d[None, :]).to(tl.float32)
    m_i = tl.full((GROUP,), float("-inf"), tl.float32)
    l_i = tl.zeros((GROUP,), tl.float32)
    acc = tl.zeros((GROUP, HEAD_DIM), tl.float32)
    for start in range(0, length, BLOCK_N):
        token = start + offs_n
        valid = token < length
        page = tl.load(indices_ptr + first_page + token // PAGE, mask=valid, other=0)
        kv_row = (page.to(tl.int64) * PAGE + token % PAGE) * NUM_KV + kv_head
        k = tl.load(
            k_ptr + kv_row[:, None] * HEAD_DIM + offs_d[None, :], mask=valid[:, None], other=0.0
        ).to(tl.float32)
        scores = tl.sum(q[:, None, :] * k[None, :, :], 2) * qk_scale
        scores = tl.where(valid[None, :], scores, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(scores, 1))
        p = tl.exp2(scores - m_new[:, None])
        alpha = tl.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(
            v_ptr + kv_row[:, None] * HEAD_DIM + offs_d[None, :], mask=valid[:, None], other=0.0
        ).to(tl.float32)
        acc = acc * alpha[:, None] + tl.sum(p[:, :, None] * v[None, :, :], 1)
        m_i = m_new
    acc = acc / l_i[:, None]
    tl.store(o_ptr + q_rows[:, None] * HEAD_DIM + offs_d[None, :], acc.to(tl.bfloat16))
    tl.store(lse_ptr + q_rows, (m_i + tl.log2(l_i)) * LN2)


def gqa_decode(
    q,
    k_cache,
    v_cache,
    kv_indptr,
    kv_indices,
    kv_last_page_len,
    o,
    lse,
    batch_size,
    num_pages,
    num_kv_indices,
):
    gqa_decode_kernel[(batch_size, NUM_KV_HEADS)](
        q,
        k_cache,
        v_cache,
        kv_indptr,
        kv_indices,
        kv_last_page_len,
        o,
        lse,
        LOG2E / math.sqrt(HEAD_DIM),
        NUM_QO=NUM_QO_HEADS,
        NUM_KV=NUM_KV_HEADS,
        GROUP=NUM_QO_HEADS // NUM_KV_HEADS,
        HEAD_DIM=HEAD_DIM,
        PAGE=PAGE_SIZE,
        BLOCK_N=32,
        num_warps=4,
    )
