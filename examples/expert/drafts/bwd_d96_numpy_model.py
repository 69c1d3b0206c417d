"""Numpy model of examples/expert/drafts/mha_bwd_d96.cu's tiling, order and roundings (CPU only).

``python examples/expert/drafts/bwd_d96_numpy_model.py [S ...]`` (default S = 256, 512, 1024,
plain and staggered query order) or ``--outliers S SEEDS``.

The d128 draft's model (bwd_numpy_model.py; all use bwd_model.py) with D = 96 (scale 1/sqrt(96),
so c = log2(e)/sqrt(96)) and the d96 kernel's dQ split, the d64 draft's: per query tile ONE
consumer warpgroup, g = it & 1, computes the whole dQ_i = dS K_j over the 128 keys and all 96 d
(the model asserts that each warpgroup does half of the tiles of every CTA). The rest of
bwd_numpy_model.py's description (tiling, products, roundings, inputs, reference, tolerance and
``--outliers``) applies unchanged. The 96-wide d range is split into 6 k-steps and 3 boxes only in
shared memory (bwd_d96_desc_check.py checks that every k-step reads the intended elements); the
products are the same sums.
"""

from __future__ import annotations

import sys
import time
from collections import Counter

from bwd_model import BM, BN, numpy_main, ring_order
from bwd_model import kernel_model as bwd_kernel_model
from deskcheck import bf16

D = 96  # d96


def kernel_model(q, k, v, o, do, lse, stagger: bool, rnd=bf16):
    """rnd: rounding of the wgmma A operands P^T and dS^T (bf16 in the kernel)."""
    g5_count: Counter = Counter()  # (CTA, warpgroup) -> query tiles whose G5 it runs

    def g5(dq_acc, ds_t, k_tile, qs, kt, it) -> None:
        g5_count[kt, it & 1] += 1  # d96: the warpgroup that runs G5 on this tile (after kDsBar)
        dq_acc[qs, :] += ds_t.T @ k_tile  # [64 q][128 keys] x [128 keys][96 d]

    out = bwd_kernel_model(q, k, v, o, do, lse, query_tiles=ring_order(stagger), g5=g5, rnd=rnd)
    n_q, n_kt = q.shape[0] // BM, q.shape[0] // BN
    assert q.shape[1] == D
    assert all(g5_count[kt, g] == n_q // 2 for kt in range(n_kt) for g in range(2)), (
        "G5 not split evenly between the warpgroups"
    )
    return out


def main(argv: list[str]) -> int:
    t0 = time.time()
    rc = numpy_main(argv, D, kernel_model)
    print(f"({time.time() - t0:.1f} s)")
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
