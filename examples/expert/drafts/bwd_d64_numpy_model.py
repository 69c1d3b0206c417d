"""Numpy model of examples/expert/mha_bwd_d64.cu's tiling, order and roundings (CPU only).

``python examples/expert/drafts/bwd_d64_numpy_model.py [S ...]``

The d128 draft's model (bwd_numpy_model.py; both use bwd_model.py) with D = 64 and the d64
kernel's dQ split: per query tile ONE consumer warpgroup, g = it & 1, computes the whole
dQ_i = dS K_j over the 128 keys and all 64 d (the model asserts that each warpgroup does half of
the tiles and that the dS^T buffer it reads holds both halves of the current tile). The rest of
bwd_numpy_model.py's description (tiling, products, roundings, inputs, reference, tolerance and
``--outliers``) applies unchanged.
"""

from __future__ import annotations

import sys
from collections import Counter

from bwd_model import BM, BN, numpy_main, ring_order
from bwd_model import kernel_model as bwd_kernel_model
from deskcheck import bf16

D = 64  # d64


def kernel_model(q, k, v, o, do, lse, stagger: bool, rnd=bf16):
    """rnd: rounding of the wgmma A operands P^T and dS^T (bf16 in the kernel)."""
    g5_count: Counter = Counter()  # (CTA, warpgroup) -> query tiles whose G5 it runs

    def g5(dq_acc, ds_t, k_tile, qs, kt, it) -> None:
        g5_count[kt, it & 1] += 1  # d64: the warpgroup that runs G5 on this tile (after kDsBar)
        dq_acc[qs, :] += ds_t.T @ k_tile

    out = bwd_kernel_model(q, k, v, o, do, lse, query_tiles=ring_order(stagger), g5=g5, rnd=rnd)
    n_q, n_kt = q.shape[0] // BM, q.shape[0] // BN
    assert all(g5_count[kt, g] == n_q // 2 for kt in range(n_kt) for g in range(2)), (
        "G5 not split evenly between the warpgroups"
    )
    return out


def main(argv: list[str]) -> int:
    return numpy_main(argv, D, kernel_model)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
