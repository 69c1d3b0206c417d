"""Numpy model of examples/expert/mha_bwd_causal_d128.cu (CPU only).

``python examples/expert/drafts/bwd_causal_numpy_model.py [S ...]``

The non-causal d128 draft's model (bwd_numpy_model.py; both use bwd_model.py's inputs, reference,
per-tile products and comparison) changed where the causal kernel changes:
* inputs: O and LSE come from the CAUSAL forward (query i attends keys j <= i), as
  kernels_ref.mha.make_bwd_inputs(causal=True) makes them; the reference is the float64 dense
  causal backward (P = 0 above the diagonal);
* per key tile kt (one CTA) the query tiles run from 2kt to S/64 - 1 in that order; the mask is
  applied exactly where the kernel applies it (iteration it <= consumer g), with the kernel's
  per-register predicate (8j + e < r0 + 64(g - it) - 2q4, and + 8 for the second row) evaluated
  for every thread and register, and masked scores set to -inf before the exp;
* structural claims asserted on the way: the predicate equals "key > query" for every
  (thread, register, g, it <= g); no pair with key > query exists in the tiles the kernel does
  not mask (it > g); every pair of a skipped query tile (qt < 2kt) has key > query, so skipping
  it drops exactly zeros.

``--outliers S SEEDS`` runs the judge's outlier distribution (one head per seed) and prints the
worst err/tol with P^T / dS^T rounded to bf16 (the kernel) and to fp16.
"""

from __future__ import annotations

import sys

import numpy as np
from bwd_model import (
    causal_mask_tile,
    causal_model_check,
    check_causal_mask_claims,
    compare_all,
    make_inputs,
    outlier_study,
    reference,
)
from bwd_model import kernel_model as bwd_kernel_model
from deskcheck import bf16

D = 128


_MASKS = {(g, it): causal_mask_tile(g, it) for g in range(2) for it in range(2) if it <= g}


def check_mask_claims(S: int) -> None:
    """The header's structural claims against the dense causal mask, with this kernel's masks."""
    check_causal_mask_claims(S, _MASKS)


def kernel_model(q, k, v, o, do, lse, rnd=bf16):
    """rnd: rounding of the wgmma A operands P^T and dS^T (bf16 in the kernel)."""

    def query_tiles(kt: int, n_q: int) -> range:
        return range(2 * kt, n_q)  # causal: from the diagonal, no wrap

    def mask(g: int, it: int) -> np.ndarray | None:
        return _MASKS[(g, it)] if it <= g else None

    def g5(dq_acc, ds_t, k_tile, qs, kt, it) -> None:
        for g in range(2):  # G5 of both warpgroups, after the kDsBar barrier: d columns 64g..
            cols = slice(64 * g, 64 * g + 64)
            dq_acc[qs, cols] += ds_t.T @ k_tile[:, cols]

    return bwd_kernel_model(
        q, k, v, o, do, lse, query_tiles=query_tiles, g5=g5, mask=mask, rnd=rnd, poison=True
    )


def negative_controls() -> bool:
    """Wrong variants the model must reject (each should fail the comparison)."""
    S = 256
    q, k, v, o, do, lse = make_inputs(S, D, seed=7, outliers=False, causal=True)
    ref = reference(q, k, v, o, do, lse, causal=True)
    caught = True
    saved = dict(_MASKS)
    variants = {
        "no mask on the fully masked (g=1, it=0) tile": {(1, 0): np.zeros((64, 64), bool)},
        "diagonal mask key >= query (drops the diagonal)": {
            (0, 0): np.triu(np.ones((64, 64), bool), k=0).T,
            (1, 1): np.triu(np.ones((64, 64), bool), k=0).T,
        },
    }
    for label, patch in variants.items():
        _MASKS.update(patch)
        got = kernel_model(q, k, v, o, do, lse)
        _MASKS.clear()
        _MASKS.update(saved)
        ok = compare_all(got, ref, quiet=True)
        print(f"negative control '{label}': {'NOT caught' if ok else 'caught'}")
        caught &= not ok
    return caught


def main(argv: list[str]) -> int:
    if argv and argv[0] == "--outliers":
        S = int(argv[1]) if len(argv) > 1 else 1024
        outlier_study(S, int(argv[2]) if len(argv) > 2 else 2, D, kernel_model, causal=True)
        return 0
    sizes = [int(a) for a in argv] or [128, 256, 384, 512, 1024]
    ok = causal_model_check(sizes, D, _MASKS, kernel_model)
    ok &= negative_controls()
    print("ALL OK" if ok else "SOME FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
