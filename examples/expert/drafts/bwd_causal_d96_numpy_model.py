"""Numpy model of examples/expert/mha_bwd_causal_d96.cu (CPU only).

``python examples/expert/drafts/bwd_causal_d96_numpy_model.py [S ...]`` (default S = 128, 256,
384, 512, 1024) or ``--outliers S SEEDS``.

The causal d128 draft's model (bwd_causal_numpy_model.py: causal inputs and dense causal
reference, query tiles 2kt .. S/64 - 1 per key tile, the mask where the kernel applies it, built
from every thread's register predicate, and the structural mask claims asserted for every
(kt, qt, g)) with the d96 draft's D = 96 and dQ split (bwd_d96_numpy_model.py): per iteration
ONE consumer warpgroup, g = it & 1, computes the whole dQ_i = dS K_j over the 128 keys and all
96 d. The mask predicate and claims are imported from bwd_causal_numpy_model.py, not copied: the
S^T tile is [64 keys][64 queries] whatever D is, and the kernel's mask code is the causal d128
draft's, character for character. The model asserts that in every CTA each warpgroup runs G5 on
exactly half of the n_it = S/64 - 2kt (even) tiles, and dK/dV start as NaN so every key row must
be written.

Negative controls (each must fail the comparison at S = 256): the fully masked (g = 1, it = 0)
tile left unmasked; the diagonal masked with key >= query; only warpgroup 0 running G5.
"""

from __future__ import annotations

import pathlib
import sys
import time
from collections import Counter

import numpy as np
from bwd_model import (
    BM,
    BN,
    causal_mask_tile,
    causal_model_check,
    compare_all,
    make_inputs,
    outlier_study,
    reference,
)
from bwd_model import kernel_model as bwd_kernel_model
from deskcheck import bf16

D = 96

MASKS = {(g, it): causal_mask_tile(g, it) for g in range(2) for it in range(2) if it <= g}


def mask_code(name: str) -> str:
    """The mask block of a causal draft, from its "causal: mask" comment to the exp loop."""
    src = (pathlib.Path(__file__).parent.parent / name).read_text()
    start = src.index("    // causal: mask key > query")
    return src[start : src.index("      // Registers 4j+e (row r0)", start)]


def check_mask_code() -> bool:
    """The predicate modelled above is the causal d128 draft's: the d96 kernel's mask code must be
    the same text."""
    same = mask_code("mha_bwd_causal_d96.cu") == mask_code("mha_bwd_causal_d128.cu")
    print(f"mask code identical to mha_bwd_causal_d128.cu's: {'OK' if same else 'DIFFERENT'}")
    return same


def kernel_model(q, k, v, o, do, lse, rnd=bf16, masks=None, bug: str = ""):
    """rnd: rounding of the wgmma A operands P^T and dS^T (bf16 in the kernel). masks: the
    (g, it) -> mask table (MASKS; the negative controls pass a broken one). bug "g5_one_wg":
    only warpgroup 0 ever runs G5."""
    masks = MASKS if masks is None else masks
    g5_count: Counter = Counter()  # (CTA, warpgroup) -> tiles whose G5 it runs
    assert q.shape[1] == D

    def query_tiles(kt: int, n_q: int) -> range:
        return range(2 * kt, n_q)  # causal: from the diagonal, no wrap

    def mask(g: int, it: int) -> np.ndarray | None:
        return masks[(g, it)] if it <= g else None

    def g5(dq_acc, ds_t, k_tile, qs, kt, it) -> None:
        g = it & 1  # d96: the warpgroup that runs G5 on this iteration (after kDsBar)
        if bug == "g5_one_wg" and g == 1:
            return
        g5_count[kt, g] += 1
        dq_acc[qs, :] += ds_t.T @ k_tile  # [64 q][128 keys] x [128 keys][96 d]

    out = bwd_kernel_model(
        q, k, v, o, do, lse, query_tiles=query_tiles, g5=g5, mask=mask, rnd=rnd, poison=True
    )
    n_q, n_kt = q.shape[0] // BM, q.shape[0] // BN
    if not bug:
        assert all(
            g5_count[kt, g] == (n_q - 2 * kt) // 2 for kt in range(n_kt) for g in range(2)
        ), "G5 not split evenly between the warpgroups"
    return out


def negative_controls() -> bool:
    """Wrong variants the model must reject (each should fail the comparison)."""
    S = 256
    q, k, v, o, do, lse = make_inputs(S, D, seed=7, outliers=False, causal=True)
    ref = reference(q, k, v, o, do, lse, causal=True)
    diag_ge = np.triu(np.ones((64, 64), bool), k=0).T
    variants = {
        "no mask on the fully masked (g=1, it=0) tile": ({(1, 0): np.zeros((64, 64), bool)}, ""),
        "diagonal mask key >= query (drops the diagonal)": ({(0, 0): diag_ge, (1, 1): diag_ge}, ""),
        "only warpgroup 0 runs G5": ({}, "g5_one_wg"),
    }
    caught = True
    for label, (patch, bug) in variants.items():
        got = kernel_model(q, k, v, o, do, lse, masks={**MASKS, **patch}, bug=bug)
        ok = compare_all(got, ref, quiet=True)
        print(f"negative control '{label}': {'NOT caught' if ok else 'caught'}")
        caught &= not ok
    return caught


def main(argv: list[str]) -> int:
    t0 = time.time()
    if argv and argv[0] == "--outliers":
        S = int(argv[1]) if len(argv) > 1 else 1024
        outlier_study(S, int(argv[2]) if len(argv) > 2 else 2, D, kernel_model, causal=True)
        return 0
    sizes = [int(a) for a in argv] or [128, 256, 384, 512, 1024]
    ok = check_mask_code()
    ok &= causal_model_check(sizes, D, MASKS, kernel_model)  # G5 split asserted per CTA
    ok &= negative_controls()
    print(f"{'ALL OK' if ok else 'SOME FAILED'} ({time.time() - t0:.1f} s)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
