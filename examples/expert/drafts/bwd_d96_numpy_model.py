"""Numpy model of examples/expert/mha_bwd_d96.cu's tiling, order and roundings (CPU only).

``python examples/expert/drafts/bwd_d96_numpy_model.py [S ...]`` (default S = 256, 512, 1024,
plain and staggered query order) or ``--outliers S SEEDS``.

The d128 draft's model (bwd_numpy_model.py; all use bwd_model.py) with D = 96 (scale 1/sqrt(96),
so c = log2(e)/sqrt(96)) and the d96 kernel's dQ split, the d64 draft's: per query tile ONE
consumer warpgroup, g = it & 1, computes the whole dQ_i = dS K_j over the 128 keys and all 96 d
(the model asserts that each warpgroup does half of the tiles of every CTA). The rest of
bwd_numpy_model.py's description (tiling, products, roundings, inputs, reference, tolerance and
``--outliers``) applies unchanged. Negative controls (both must fail the comparison at S = 256):
only warpgroup 0 running G5 (the odd tiles' dQ lost), and G5 reading only two of the three
32-wide K boxes. The 96-wide d range is split into 6 k-steps and 3 boxes only in
shared memory (bwd_d96_desc_check.py checks that every k-step reads the intended elements); the
products are the same sums.
"""

from __future__ import annotations

import sys
import time
from collections import Counter

from bwd_model import BM, BN, compare_all, make_inputs, numpy_main, reference, ring_order
from bwd_model import kernel_model as bwd_kernel_model
from deskcheck import bf16

D = 96  # d96


def kernel_model(q, k, v, o, do, lse, stagger: bool, rnd=bf16, bug: str = ""):
    """rnd: rounding of the wgmma A operands P^T and dS^T (bf16 in the kernel). bug (negative
    controls): "g5_one_wg" (only warpgroup 0 ever runs G5, so the odd tiles' dQ is lost),
    "g5_two_boxes" (G5's B operand covers only the first two 32-wide K boxes, d 0..63)."""
    g5_count: Counter = Counter()  # (CTA, warpgroup) -> query tiles whose G5 it runs

    def g5(dq_acc, ds_t, k_tile, qs, kt, it) -> None:
        g = it & 1  # d96: the warpgroup that runs G5 on this tile (after kDsBar)
        if bug == "g5_one_wg" and g == 1:
            return
        g5_count[kt, g] += 1
        n_d = 64 if bug == "g5_two_boxes" else D
        dq_acc[qs, :n_d] += ds_t.T @ k_tile[:, :n_d]  # [64 q][128 keys] x [128 keys][96 d]

    out = bwd_kernel_model(q, k, v, o, do, lse, query_tiles=ring_order(stagger), g5=g5, rnd=rnd)
    n_q, n_kt = q.shape[0] // BM, q.shape[0] // BN
    assert q.shape[1] == D
    if not bug:
        assert all(g5_count[kt, g] == n_q // 2 for kt in range(n_kt) for g in range(2)), (
            "G5 not split evenly between the warpgroups"
        )
    return out


def negative_controls(S: int = 256) -> bool:
    """Each deliberately broken variant must fail the comparison; True if all are caught."""
    q, k, v, o, do, lse = make_inputs(S, D, seed=S, outliers=False)
    ref = reference(q, k, v, o, do, lse)
    caught_all = True
    for bug in ("g5_one_wg", "g5_two_boxes"):
        caught = not compare_all(kernel_model(q, k, v, o, do, lse, False, bug=bug), ref, True)
        print(f"negative control {bug} (S = {S}): {'caught' if caught else 'NOT caught'}")
        caught_all &= caught
    return caught_all


def main(argv: list[str]) -> int:
    t0 = time.time()
    rc = numpy_main(argv, D, kernel_model)
    if not (argv and argv[0] == "--outliers") and not negative_controls():
        rc = 1
    print(f"({time.time() - t0:.1f} s)")
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
