"""Numpy model of examples/expert/drafts/mha_bwd_causal_d128.cu (CPU only).

``python examples/expert/drafts/bwd_causal_numpy_model.py [S ...]``

Copied from bwd_numpy_model.py (the non-causal d128 draft's model, left untouched) and changed
where the causal kernel changes:
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

D = 128
BN, BM = 128, 64
LOG2E = 1.4426950408889634


def bf16(x: np.ndarray) -> np.ndarray:
    """Round float32 to bf16 (nearest even), returned as float32."""
    x = np.asarray(x, dtype=np.float32)
    u = x.view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000
    return u.astype(np.uint32).view(np.float32)


def f16(x: np.ndarray) -> np.ndarray:
    """Round float32 to fp16 (nearest even), returned as float32 (the --outliers study)."""
    return np.asarray(x, np.float32).astype(np.float16).astype(np.float32)


def causal_mask(S: int) -> np.ndarray:
    """True where key j > query i (masked)."""
    return np.triu(np.ones((S, S), dtype=bool), k=1)


def make_inputs(S: int, seed: int, outliers: bool):
    rng = np.random.default_rng(seed)

    def draw(std):
        x = rng.standard_normal((S, D)).astype(np.float32) * std
        if outliers:
            n = max(1, round(x.size * 1e-3))
            idx = np.unique(rng.integers(0, x.size, n))
            x.reshape(-1)[idx] *= rng.uniform(8.0, 16.0, idx.size).astype(np.float32)
        return bf16(x)

    q, k, v, do = draw(np.sqrt(2.0)), draw(np.sqrt(2.0)), draw(1.0), draw(1.0)
    scale = 1.0 / np.sqrt(D)
    s = (q.astype(np.float64) @ k.T.astype(np.float64)) * scale
    s[causal_mask(S)] = -np.inf
    m = s.max(axis=1, keepdims=True)
    p = np.exp(s - m)
    row_sum = p.sum(axis=1, keepdims=True)
    o = bf16(((p / row_sum) @ v.astype(np.float64)).astype(np.float32))
    lse = (m + np.log(row_sum))[:, 0].astype(np.float32)  # the causal LSE
    return q, k, v, o, do, lse


def reference(q, k, v, o, do, lse):
    q, k, v, o, do = (x.astype(np.float64) for x in (q, k, v, o, do))
    S = q.shape[0]
    scale = 1.0 / np.sqrt(D)
    s = q @ k.T * scale
    s[causal_mask(S)] = -np.inf
    p = np.exp(s - lse.astype(np.float64)[:, None])
    dv = p.T @ do
    dp = do @ v.T
    ds = p * (dp - (do * o).sum(axis=1, keepdims=True))
    return ds @ k * scale, ds.T @ q * scale, dv


def acc_coord(t: int, i: int) -> tuple[int, int]:
    """contracts §2: (row, col) of f32 accumulator register i of thread t (m64nN)."""
    w, lane = t // 32, t % 32
    return 16 * w + lane // 4 + 8 * ((i // 2) % 2), 8 * (i // 4) + 2 * (lane % 4) + (i % 2)


def kernel_mask_tile(g: int, it: int) -> np.ndarray:
    """The kernel's mask for consumer g at iteration it <= g, as a [64 keys][64 queries] array,
    built from each thread's predicate on its registers (the kernel's lim0 / lim1 code)."""
    m = np.zeros((64, 64), dtype=bool)
    seen = np.zeros((64, 64), dtype=int)
    for t in range(128):
        lane = t % 32
        r0, q4 = 16 * (t // 32) + lane // 4, lane % 4
        lim0 = r0 + 64 * (g - it) - 2 * q4
        lim1 = lim0 + 8
        for j in range(8):
            for e, lim in ((0, lim0), (1, lim0), (2, lim1), (3, lim1)):
                row, col = acc_coord(t, 4 * j + e)
                m[row, col] = 8 * j + (e % 2) < lim
                seen[row, col] += 1
    assert np.all(seen == 1), "register map does not cover the tile once"
    return m


_MASKS = {(g, it): kernel_mask_tile(g, it) for g in range(2) for it in range(2) if it <= g}


def check_mask_claims(S: int) -> None:
    """Asserts the structural claims of the header against the dense causal mask."""
    full = causal_mask(S).T  # [key][query]: True where key > query
    n_q = S // BM
    for kt in range(S // BN):
        for qt in range(n_q):
            for g in range(2):
                keys = slice(kt * BN + 64 * g, kt * BN + 64 * g + 64)
                tile = full[keys, qt * BM : qt * BM + BM]
                it = qt - 2 * kt
                if it < 0:
                    assert tile.all(), f"skipped tile kt {kt} qt {qt} has an unmasked pair"
                elif it <= g:
                    assert np.array_equal(_MASKS[(g, it)], tile), (
                        f"mask wrong kt {kt} it {it} g {g}"
                    )
                else:
                    assert not tile.any(), f"unmasked tile kt {kt} it {it} g {g} needs a mask"


def kernel_model(q, k, v, o, do, lse, rnd=bf16):
    """rnd: rounding of the wgmma A operands P^T and dS^T (bf16 in the kernel)."""
    S = q.shape[0]
    n_q, n_kt = S // BM, S // BN
    scale = np.float32(1.0 / np.sqrt(D))
    c = np.float32(LOG2E / np.sqrt(D))
    dr = (do * o).sum(axis=1, dtype=np.float32)  # bwd_pre_kernel
    dq_acc = np.zeros((S, D), np.float32)  # cudaMemsetAsync
    dk = np.full((S, D), np.nan, np.float32)  # poison: every key row must be written
    dv = np.full((S, D), np.nan, np.float32)
    for kt in range(n_kt):  # one CTA
        acc_k = [np.zeros((64, D), np.float32) for _ in range(2)]
        acc_v = [np.zeros((64, D), np.float32) for _ in range(2)]
        for it in range(n_q - 2 * kt):  # causal: from the diagonal, no wrap
            qt = 2 * kt + it
            qs = slice(qt * BM, qt * BM + BM)
            Qi, dOi = q[qs], do[qs]
            nl = (-lse[qs] * np.float32(LOG2E)).astype(np.float32)
            ds_t = np.zeros((BN, BM), np.float32)  # the dS^T smem buffer (bf16 values)
            for g in range(2):
                ks = slice(kt * BN + 64 * g, kt * BN + 64 * g + 64)
                sT = (k[ks] @ Qi.T).astype(np.float32)  # G1
                if it <= g:  # causal mask (-inf before the exp)
                    sT = np.where(_MASKS[(g, it)], np.float32(-np.inf), sT)
                dpT = (v[ks] @ dOi.T).astype(np.float32)  # G2
                pT = np.exp2(sT * c + nl[None, :]).astype(np.float32)
                acc_v[g] += rnd(pT) @ dOi  # G3
                dsT = (pT * (dpT - dr[qs][None, :])).astype(np.float32)
                acc_k[g] += rnd(dsT) @ Qi  # G4
                ds_t[64 * g : 64 * g + 64] = rnd(dsT)
            for g in range(2):  # G5, after the kDsBar barrier
                cols = slice(64 * g, 64 * g + 64)
                dq_acc[qs, cols] += ds_t.T @ k[kt * BN : kt * BN + BN, cols]
        for g in range(2):
            ks = slice(kt * BN + 64 * g, kt * BN + 64 * g + 64)
            dk[ks] = bf16(acc_k[g] * scale)
            dv[ks] = bf16(acc_v[g])
    return bf16(dq_acc * scale), dk, dv


def compare(name: str, got: np.ndarray, ref: np.ndarray, quiet: bool = False) -> tuple:
    err = np.abs(got - ref)
    tol = 1e-2 + 1e-2 * np.abs(ref)
    ok = bool(np.all(err <= tol)) and bool(np.all(np.isfinite(got)))
    if not quiet:
        print(
            f"    {name}: max|err| {err.max():.2e}, max err/tol {np.max(err / tol):.3f}, "
            f"max|ref| {np.abs(ref).max():.2e} -> {'OK' if ok else 'FAIL'}"
        )
    return ok, float(np.max(err / tol)), int(np.sum(err > tol))


def outlier_study(S: int, seeds: int) -> None:
    for seed in range(seeds):
        q, k, v, o, do, lse = make_inputs(S, seed=seed, outliers=True)
        ref = reference(q, k, v, o, do, lse)
        for label, rnd in (("bf16", bf16), ("fp16", f16)):
            got = kernel_model(q, k, v, o, do, lse, rnd)
            parts = []
            for name, a, r in zip(("dQ", "dK", "dV"), got, ref, strict=True):
                _, worst, n_bad = compare(name, a, r, quiet=True)
                parts.append(f"{name} {worst:5.2f} ({n_bad:3d} over)")
            print(f"S={S} seed={seed} P,dS in {label}: " + "  ".join(parts), flush=True)


def negative_controls() -> bool:
    """Wrong variants the model must reject (each should fail the comparison)."""
    S = 256
    q, k, v, o, do, lse = make_inputs(S, seed=7, outliers=False)
    ref = reference(q, k, v, o, do, lse)
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
        ok = all(compare(n, a, r, quiet=True)[0] for n, a, r in zip("QKV", got, ref, strict=True))
        print(f"negative control '{label}': {'NOT caught' if ok else 'caught'}")
        caught &= not ok
    return caught


def main(argv: list[str]) -> int:
    if argv and argv[0] == "--outliers":
        S = int(argv[1]) if len(argv) > 1 else 1024
        outlier_study(S, int(argv[2]) if len(argv) > 2 else 2)
        return 0
    sizes = [int(a) for a in argv] or [128, 256, 384, 512, 1024]
    ok = True
    for S in sizes:
        check_mask_claims(S)
        q, k, v, o, do, lse = make_inputs(S, seed=S, outliers=False)
        ref = reference(q, k, v, o, do, lse)
        got = kernel_model(q, k, v, o, do, lse)
        print(f"S={S} (mask claims asserted for every (kt, qt, g))")
        for name, a, r in zip(("dQ", "dK", "dV"), got, ref, strict=True):
            ok &= compare(name, a, r)[0]
    ok &= negative_controls()
    print("ALL OK" if ok else "SOME FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
