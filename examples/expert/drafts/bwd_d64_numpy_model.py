"""Numpy model of examples/expert/drafts/mha_bwd_d64.cu's tiling, order and roundings (CPU only).

``python examples/expert/drafts/bwd_d64_numpy_model.py [S ...]``

Copied from bwd_numpy_model.py (the d128 draft's model, left untouched) with D = 64 and the d64
kernel's dQ split: per query tile ONE consumer warpgroup, g = it & 1, computes the whole
dQ_i = dS K_j over the 128 keys and all 64 d (the model asserts that each warpgroup does half of
the tiles and that the dS^T buffer it reads holds both halves of the current tile). The rest of
the description below is the d128 model's and applies unchanged:

Per (b, h): key tiles of 128 (one CTA), split into two consumer warpgroups of 64 keys; query
tiles of 64 streamed in the kernel's order (plain or staggered). Per tile and warpgroup, exactly
the kernel's products and roundings:
  S^T = K_g Q^T (fp32 of bf16 inputs)       P^T = 2^(S^T c - LSE log2e)
  dP^T = V_g dO^T                           dS^T = P^T (dP^T - Dr)
  dV_g += bf16(P^T) dO                      dK_g += bf16(dS^T) Q
  dQacc[:, :] += bf16(dS)[:, all 128 keys] K[:, :]   (d64: warpgroup it & 1, after the barrier)
then dK = bf16(scale dK), dV = bf16(dV), dQ = bf16(scale dQacc). Dr = rowsum(dO O) in fp32 from
the bf16 O input. The inputs follow kernels_ref.mha.make_bwd_inputs (Q, K ~ N(0, 2), V, dO ~
N(0, 1), bf16; O = bf16(forward O), LSE from the forward), optionally with the outlier stage.
The result is compared with the float64 reference formulas of kernels_ref.mha.bwd_reference under
the task's allclose(atol = rtol = 1e-2).

``--outliers S SEEDS`` runs the judge's outlier distribution instead and prints, per seed (one
head each), the worst err/tol with P^T and dS^T rounded to bf16 (the kernel) and to fp16.
"""

from __future__ import annotations

import sys

import numpy as np

D = 64  # d64
BN, BM = 128, 64
LOG2E = 1.4426950408889634


def bf16(x: np.ndarray) -> np.ndarray:
    """Round float32 to bf16 (nearest even), returned as float32."""
    x = np.asarray(x, dtype=np.float32)
    u = x.view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000
    return u.astype(np.uint32).view(np.float32)


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
    m = s.max(axis=1, keepdims=True)
    p = np.exp(s - m)
    row_sum = p.sum(axis=1, keepdims=True)
    o = bf16(((p / row_sum) @ v.astype(np.float64)).astype(np.float32))
    lse = (m + np.log(row_sum))[:, 0].astype(np.float32)
    return q, k, v, o, do, lse


def reference(q, k, v, o, do, lse):
    q, k, v, o, do = (x.astype(np.float64) for x in (q, k, v, o, do))
    scale = 1.0 / np.sqrt(D)
    p = np.exp(q @ k.T * scale - lse.astype(np.float64)[:, None])
    dv = p.T @ do
    dp = do @ v.T
    ds = p * (dp - (do * o).sum(axis=1, keepdims=True))
    return ds @ k * scale, ds.T @ q * scale, dv


def f16(x: np.ndarray) -> np.ndarray:
    """Round float32 to fp16 (nearest even), returned as float32 (the --outliers study)."""
    return np.asarray(x, np.float32).astype(np.float16).astype(np.float32)


def kernel_model(q, k, v, o, do, lse, stagger: bool, rnd=bf16):
    """rnd: rounding of the wgmma A operands P^T and dS^T (bf16 in the kernel)."""
    S = q.shape[0]
    n_q, n_kt = S // BM, S // BN
    scale = np.float32(1.0 / np.sqrt(D))
    c = np.float32(LOG2E / np.sqrt(D))
    dr = (do * o).sum(axis=1, dtype=np.float32)  # bwd_pre_kernel
    dq_acc = np.zeros((S, D), np.float32)  # cudaMemsetAsync
    dk = np.zeros((S, D), np.float32)
    dv = np.zeros((S, D), np.float32)
    for kt in range(n_kt):  # one CTA
        q_off = (2 * kt) % n_q if stagger else 0
        acc_k = [np.zeros((64, D), np.float32) for _ in range(2)]
        acc_v = [np.zeros((64, D), np.float32) for _ in range(2)]
        g5_count = [0, 0]
        for it in range(n_q):
            qt = (q_off + it) % n_q
            qs = slice(qt * BM, qt * BM + BM)
            Qi, dOi = q[qs], do[qs]
            nl = (-lse[qs] * np.float32(LOG2E)).astype(np.float32)
            ds_t = np.zeros((BN, BM), np.float32)  # the dS^T smem buffer (bf16 values)
            for g in range(2):
                ks = slice(kt * BN + 64 * g, kt * BN + 64 * g + 64)
                sT = (k[ks] @ Qi.T).astype(np.float32)  # G1
                dpT = (v[ks] @ dOi.T).astype(np.float32)  # G2
                pT = np.exp2(sT * c + nl[None, :]).astype(np.float32)
                acc_v[g] += rnd(pT) @ dOi  # G3
                dsT = (pT * (dpT - dr[qs][None, :])).astype(np.float32)
                acc_k[g] += rnd(dsT) @ Qi  # G4
                ds_t[64 * g : 64 * g + 64] = rnd(dsT)
            g5 = it & 1  # d64: the warpgroup that runs G5 on this tile (after kDsBar)
            g5_count[g5] += 1
            dq_acc[qs, :] += ds_t.T @ k[kt * BN : kt * BN + BN, :]
        assert g5_count == [n_q // 2, n_q // 2], "G5 not split evenly between the warpgroups"
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
    """The judge's outlier stage (0.1 % of Q, K, V, dO scaled x8-16), one head per seed:
    worst err/tol and count of elements over tolerance, with P^T/dS^T rounded to bf16 (this
    kernel, and FA2/FA3/cuDNN-style kernels) and, for comparison, to fp16."""
    for seed in range(seeds):
        q, k, v, o, do, lse = make_inputs(S, seed=seed, outliers=True)
        ref = reference(q, k, v, o, do, lse)
        for label, rnd in (("bf16", bf16), ("fp16", f16)):
            got = kernel_model(q, k, v, o, do, lse, False, rnd)
            parts = []
            for name, a, r in zip(("dQ", "dK", "dV"), got, ref, strict=True):
                _, worst, n_bad = compare(name, a, r, quiet=True)
                parts.append(f"{name} {worst:5.2f} ({n_bad:3d} over)")
            print(f"S={S} seed={seed} P,dS in {label}: " + "  ".join(parts), flush=True)


def main(argv: list[str]) -> int:
    if argv and argv[0] == "--outliers":
        S = int(argv[1]) if len(argv) > 1 else 1024
        outlier_study(S, int(argv[2]) if len(argv) > 2 else 2)
        return 0
    sizes = [int(a) for a in argv] or [256, 512, 1024]
    ok = True
    for S in sizes:
        for stagger in (False, True):
            q, k, v, o, do, lse = make_inputs(S, seed=S, outliers=False)
            ref = reference(q, k, v, o, do, lse)
            got = kernel_model(q, k, v, o, do, lse, stagger)
            print(f"S={S} stagger={stagger}")
            for name, a, r in zip(("dQ", "dK", "dV"), got, ref, strict=True):
                ok &= compare(name, a, r)[0]
    print("ALL OK" if ok else "SOME FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
