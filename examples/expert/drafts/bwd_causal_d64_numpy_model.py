"""Numpy model of examples/expert/mha_bwd_causal_d64.cu (CPU only).

``python examples/expert/drafts/bwd_causal_d64_numpy_model.py [S ...]``

The causal d64 kernel is the d64 draft (one box per tile, G5 by warpgroup it & 1 over the whole
[64 q][64 d] tile) with the causal d128 draft's changes (query tiles 2kt .. S/64 - 1, the
diagonal mask on iterations it <= g). This model is bwd_model.kernel_model with both:
* inputs: O and LSE from the CAUSAL forward (query i attends keys j <= i), as
  kernels_ref.mha.make_bwd_inputs(causal=True) makes them; the reference is the float64 dense
  causal backward (P = 0 above the diagonal), D = 64;
* per key tile kt (one CTA) the query tiles run from 2kt to S/64 - 1 in that order; the mask is
  applied exactly where the kernel applies it (it <= g), built from every thread's register
  predicate (bwd_model.causal_mask_tile), masked scores set to -inf before the exp;
* G5 (dQ_i += dS K_j over the 128 keys and all 64 d) by warpgroup it & 1, reading the dS^T buffer
  after both halves are stored.

Asserted on the way:
* source tie: the .cu's mask block, trip count, tile order and G5 choice are the lines this model
  assumes (parsed from mha_bwd_causal_d64.cu);
* the mask claims, for every (kt, qt, g): the predicate equals "key > query" on the it <= g tiles,
  the it > g tiles have no masked pair, every skipped tile (qt < 2kt) is fully masked;
* G5 split: each warpgroup runs G5 on exactly n_it / 2 tiles of every CTA (n_it = S/64 - 2kt is
  even), and the G5 of it = 0 reads an all-zero warpgroup-1 half (the fully masked tile).

Negative controls (each must fail the comparison, with the zero-half assertion off, or the
source tie): the fully masked (1, 0)
tile left unmasked; the diagonal masked with key >= query; the CTA starting one key tile early
(qt from 2kt - 2, the mask still at it <= g); a source whose mask compares with <= instead of <.

``--outliers S SEEDS`` runs the judge's outlier distribution (one head per seed) and prints the
worst err/tol with P^T / dS^T rounded to bf16 (the kernel) and to fp16. ``--heads S FIRST COUNT``
prints the worst err/tol per output for COUNT plain heads (seeds FIRST..), a study of the
bf16-P^T tail (``--heads 4096 100 16``: seed 109 puts one dV element of key 0 at 1.11).
"""

from __future__ import annotations

import pathlib
import re
import sys
import time
from collections import Counter

import numpy as np
from bwd_model import (
    BM,
    BN,
    causal_mask_tile,
    causal_model_check,
    causal_query_tiles,
    compare,
    compare_all,
    make_inputs,
    outlier_study,
    reference,
)
from bwd_model import kernel_model as bwd_kernel_model
from deskcheck import bf16

D = 64
_SRC = (pathlib.Path(__file__).parent.parent / "mha_bwd_causal_d64.cu").read_text()
_MASKS = {(g, it): causal_mask_tile(g, it) for g in range(2) for it in range(2) if it <= g}
_FIRST_TILE = {"q_off": lambda kt: 2 * kt}  # patched by a negative control
# The zero-half assertion is switched off in the negative controls, so that they show what the
# numerical comparison alone catches (the unmasked (1, 0) tile trips the assertion first).
_ZERO_HALF_ASSERT = {"on": True}


def source_tie(src: str) -> list[str]:
    """What the model assumes about the kernel's source; returns the lines that do not hold."""
    problems = []
    masks = set(
        re.findall(r"if \(8 \* j \+ (\d) < (lim[01])\) s_acc\[4 \* j \+ (\d)\] = kNegInf;", src)
    )
    want = {("0", "lim0", "0"), ("1", "lim0", "1"), ("0", "lim1", "2"), ("1", "lim1", "3")}
    if masks != want:
        problems.append(f"mask predicates {sorted(masks)} != {sorted(want)}")
    required = {
        "mask only on it <= g": "if (it <= static_cast<int>(g)) {",
        "lim0": "static_cast<int>(r0) + 64 * (static_cast<int>(g) - it)"
        " - 2 * static_cast<int>(q4);",
        "lim1": "const int lim1 = lim0 + 8;",
        "first tile": "const int q_off = 2 * kt;",
        "trip count": "const int n_it = n_q - q_off;",
        "G5 warpgroup": "const bool do_dq = static_cast<uint32_t>(it & 1) == g;",
    }
    for what, line in required.items():
        if line not in src:
            problems.append(f"{what}: '{line}' not found")
    counts = {
        "producer and consumer loops over n_it": ("for (int it = 0; it < n_it; ++it)", 2),
        "no wrap, producer and consumer": ("++qt;  // causal: no wrap", 2),
    }
    for what, (line, n) in counts.items():
        if src.count(line) != n:
            problems.append(f"{what}: '{line}' found {src.count(line)} times, not {n}")
    return problems


def kernel_model(q, k, v, o, do, lse, rnd=bf16):
    """rnd: rounding of the wgmma A operands P^T and dS^T (bf16 in the kernel)."""
    g5_count: Counter = Counter()  # (CTA, warpgroup) -> query tiles whose G5 it runs

    def query_tiles(kt: int, n_q: int) -> range:
        first = _FIRST_TILE["q_off"](kt)
        if first == 2 * kt:
            assert list(range(first, n_q)) == list(causal_query_tiles(kt, n_q))
        return range(first, n_q)  # causal: from the diagonal, no wrap

    def mask(g: int, it: int) -> np.ndarray | None:
        return _MASKS[(g, it)] if it <= g else None

    def g5(dq_acc, ds_t, k_tile, qs, kt, it) -> None:
        g5_count[kt, it & 1] += 1  # d64: the warpgroup that runs G5 on this tile (after kDsBar)
        if it == 0 and _ZERO_HALF_ASSERT["on"]:
            assert not ds_t[64:].any(), "G5 of it = 0 reads a non-zero warpgroup-1 half"
        dq_acc[qs, :] += ds_t.T @ k_tile

    out = bwd_kernel_model(
        q, k, v, o, do, lse, query_tiles=query_tiles, g5=g5, mask=mask, rnd=rnd, poison=True
    )
    n_q, n_kt = q.shape[0] // BM, q.shape[0] // BN
    for kt in range(n_kt):
        n_it = n_q - _FIRST_TILE["q_off"](kt)
        assert n_it % 2 == 0 and g5_count[kt, 0] == g5_count[kt, 1] == n_it // 2, (
            f"G5 not split evenly between the warpgroups of CTA {kt}"
        )
    return out


def negative_controls() -> bool:
    """Wrong variants the model must reject (each should fail the comparison)."""
    S = 256
    q, k, v, o, do, lse = make_inputs(S, D, seed=7, outliers=False, causal=True)
    ref = reference(q, k, v, o, do, lse, causal=True)
    caught = True
    saved = dict(_MASKS)
    diag_ge = np.triu(np.ones((64, 64), bool), k=0).T  # key >= query
    variants = {
        "no mask on the fully masked (g=1, it=0) tile": ({(1, 0): np.zeros((64, 64), bool)}, None),
        "diagonal mask key >= query (drops the diagonal)": (
            {(0, 0): diag_ge, (1, 1): diag_ge},
            None,
        ),
        "CTA starts one key tile early (qt from 2kt - 2)": ({}, lambda kt: max(0, 2 * kt - 2)),
    }
    for label, (patch, first) in variants.items():
        _MASKS.update(patch)
        if first is not None:
            _FIRST_TILE["q_off"] = first
        _ZERO_HALF_ASSERT["on"] = False
        try:
            got = kernel_model(q, k, v, o, do, lse)
            ok = compare_all(got, ref, quiet=True)
        finally:
            _MASKS.clear()
            _MASKS.update(saved)
            _FIRST_TILE["q_off"] = lambda kt: 2 * kt
            _ZERO_HALF_ASSERT["on"] = True
        print(f"negative control '{label}': {'NOT caught' if ok else 'caught'}")
        caught &= not ok
    bad_src = _SRC.replace("if (8 * j + 1 < lim1)", "if (8 * j + 1 <= lim1)")
    assert bad_src != _SRC
    tie = source_tie(bad_src)
    print(f"negative control 'source mask with <= lim1': {'caught' if tie else 'NOT caught'}")
    caught &= bool(tie)
    return caught


def main(argv: list[str]) -> int:
    if argv and argv[0] == "--outliers":
        S = int(argv[1]) if len(argv) > 1 else 1024
        outlier_study(S, int(argv[2]) if len(argv) > 2 else 2, D, kernel_model, causal=True)
        return 0
    if argv and argv[0] == "--heads":  # a study, not a check: prints, exits 0
        S, first, count = (int(a) for a in argv[1:4])
        for seed in range(first, first + count):
            q, k, v, o, do, lse = make_inputs(S, D, seed=seed, outliers=False, causal=True)
            ref = reference(q, k, v, o, do, lse, causal=True)
            got = kernel_model(q, k, v, o, do, lse)
            parts = []
            for name, a, r in zip(("dQ", "dK", "dV"), got, ref, strict=True):
                _, worst, n_bad = compare(name, a, r, quiet=True)
                parts.append(f"{name} {worst:5.2f} ({n_bad} over)")
            print(f"S={S} seed={seed}: " + "  ".join(parts), flush=True)
        return 0
    t0 = time.time()
    problems = source_tie(_SRC)
    print(f"source tie (mask block, tile order, trip count, G5 warpgroup): {problems or 'OK'}")
    ok = not problems
    sizes = [int(a) for a in argv] or [128, 256, 384, 512, 1024]
    ok &= causal_model_check(sizes, D, _MASKS, kernel_model)  # G5 split asserted
    ok &= negative_controls()
    print(f"{'ALL OK' if ok else 'SOME FAILED'} ({time.time() - t0:.1f} s)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
