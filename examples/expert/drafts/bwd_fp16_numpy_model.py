"""Numpy model of examples/expert/mha_bwd_d128_fp16.cu (CPU only): the d128 draft's tiling,
order and products (bwd_model.kernel_model with the d128 draft's G5), with the fp16 variant's
roundings: the Q, K, V, dO operand tiles converted bf16 -> fp16 in shared memory, and P^T and
dS^T packed to fp16 (instead of bf16) for G3/G4 and the dS^T buffer that G5 reads; fp32
accumulation, outputs rounded to bf16 as before.

``python examples/expert/drafts/bwd_fp16_numpy_model.py [--outliers S SEEDS]``

1. Normal inputs (kernels_ref.mha.make_bwd_inputs' distribution) at S = 256, 512, 1024, plain
   and staggered query order: every output within the task's allclose(atol = rtol = 1e-2).
2. The judge's outlier stage (0.1 % of Q, K, V, dO scaled x8-16), one head per seed, at
   S = 4096 (the task's S), seeds 0 and 1 by default: worst err/tol per output <= 1. NOT a
   guarantee over the judge's 64 heads: seed 1 is at dQ 0.97 and seed 3 (``--outliers 4096 4``)
   fails at dQ 1.49 (drafts/README.md, the fp16 section); dK and dV stay <= 0.46.
3. Negative control: the bf16 draft's roundings (bf16 operands, bf16 P^T/dS^T) on the first
   outlier seed must exceed 1 somewhere (so the outlier inputs do discriminate).
4. The in-place conversion's thread -> chunk map (cvt_bf16_to_f16_inplace in the kernel): for
   a Q/dO tile (16 KB, [64][128] bf16 in two [64][64] boxes) and the K+V region (2 x 32 KB,
   [128][128] each), the 256 converting threads' chunks cover every byte exactly once, and a
   warp's accesses are 512 consecutive bytes. Negative controls: a 128-thread stride (one
   consumer only) and a chunk count not divided by 256 are caught.

Prints the worst err/tol per output and exits 1 if any check fails.
"""

from __future__ import annotations

import sys

import numpy as np
from bwd_model import NAMES, compare, f16, kernel_model, make_inputs, reference, ring_order
from deskcheck import bf16

D = 128
THREADS = 256  # kConsumerThreads: both consumer warpgroups convert
CHUNK = 16  # bytes per LDS.128 / STS.128


def g5(dq_acc, ds_t, k_tile, qs, kt, it) -> None:
    """The d128 draft's G5: both warpgroups after the kDsBar barrier, d columns 64g.."""
    for g in range(2):
        cols = slice(64 * g, 64 * g + 64)
        dq_acc[qs, cols] += ds_t.T @ k_tile[:, cols]


def fp16_model(q, k, v, o, do, lse, stagger: bool = False):
    """mha_bwd_d128_fp16.cu: fp16 operand tiles, fp16 P^T / dS^T."""
    return kernel_model(
        q, k, v, o, do, lse, query_tiles=ring_order(stagger), g5=g5, rnd=f16, operand=f16
    )


def bf16_model(q, k, v, o, do, lse, stagger: bool = False):
    """mha_bwd_d128.cu (the negative control): bf16 operands, bf16 P^T / dS^T."""
    return kernel_model(q, k, v, o, do, lse, query_tiles=ring_order(stagger), g5=g5, rnd=bf16)


def worst(got, ref) -> list[tuple[str, float, int]]:
    return [(n, *compare(n, a, r, quiet=True)[1:]) for n, a, r in zip(NAMES, got, ref, strict=True)]


def fmt(rows) -> str:
    return "  ".join(f"{n} {w:5.2f} ({c:3d} over)" for n, w, c in rows)


def conversion_map(n_bytes: int, threads: int = THREADS, active: int = THREADS) -> np.ndarray:
    """Times each byte of an n_bytes region is converted by cvt_bf16_to_f16_inplace<n_bytes / 16>
    (thread c: chunks c + threads * i, i < n_chunks / threads) when threads 0 .. active-1 run."""
    n_chunks = n_bytes // CHUNK
    per = n_chunks // threads
    hits = np.zeros(n_bytes, np.int64)
    for c in range(active):
        for i in range(per):
            ch = c + threads * i
            hits[ch * CHUNK : ch * CHUNK + CHUNK] += 1
    return hits


def warp_contiguous(threads: int = THREADS) -> bool:
    """Each warp's i-th access: 32 consecutive chunks = 512 consecutive bytes."""
    for w in range(threads // 32):
        for i in range(8):  # up to the K/V tile's 8 chunks per thread
            addrs = [(32 * w + lane + threads * i) * CHUNK for lane in range(32)]
            if addrs != list(range(addrs[0], addrs[0] + 512, CHUNK)):
                return False
    return True


def check_conversion() -> bool:
    ok = True
    q_tile = 2 * 64 * 128  # kQTile: two [64][64] bf16 boxes
    k_tile = 2 * 128 * 128  # kKTile: two [128][64] bf16 boxes
    for name, n_bytes in (("Q/dO tile [64][128]", q_tile), ("K/V tile [128][128]", k_tile)):
        hits = conversion_map(n_bytes)
        good = bool(np.all(hits == 1))
        # Every element (2 bytes) is converted exactly once: the map is over whole chunks, so
        # this is the byte check; the swizzle only permutes positions inside the tile.
        print(f"conversion map {name}: {n_bytes // 2} elements, each once: {good}")
        ok &= good
    ok &= warp_contiguous()
    print(f"conversion: warp accesses 512 consecutive bytes: {warp_contiguous()}")
    # Negative controls: only one consumer's 128 threads converting (the 256 stride) leaves half
    # of the tile bf16; a chunk count that 256 does not divide leaves a tail.
    bad1 = conversion_map(q_tile, active=128)
    caught1 = not np.all(bad1 == 1)
    n_odd = q_tile + 64 * CHUNK  # 1088 chunks
    caught2 = (n_odd // CHUNK) % THREADS != 0 and not np.all(conversion_map(n_odd) == 1)
    print(f"conversion negative controls caught: 128 threads {caught1}, tail {caught2}")
    return ok and caught1 and caught2


def main(argv: list[str]) -> int:
    S_out, seeds = 4096, 2
    if argv and argv[0] == "--outliers":
        S_out = int(argv[1]) if len(argv) > 1 else S_out
        seeds = int(argv[2]) if len(argv) > 2 else seeds
    ok = check_conversion()

    for S in (256, 512, 1024):
        for stagger in (False, True):
            q, k, v, o, do, lse = make_inputs(S, D, seed=S, outliers=False)
            rows = worst(fp16_model(q, k, v, o, do, lse, stagger), reference(q, k, v, o, do, lse))
            good = all(w <= 1.0 for _, w, _ in rows)
            print(
                f"normal  S={S} stagger={stagger} fp16: {fmt(rows)} -> {'OK' if good else 'FAIL'}"
            )
            ok &= good

    for seed in range(seeds):
        q, k, v, o, do, lse = make_inputs(S_out, D, seed=seed, outliers=True)
        ref = reference(q, k, v, o, do, lse)
        rows = worst(fp16_model(q, k, v, o, do, lse), ref)
        good = all(w <= 1.0 for _, w, _ in rows)
        print(f"outlier S={S_out} seed={seed} fp16: {fmt(rows)} -> {'OK' if good else 'FAIL'}")
        ok &= good
        if seed == 0:  # negative control: the bf16 draft must fail on the same inputs
            rows = worst(bf16_model(q, k, v, o, do, lse), ref)
            caught = any(w > 1.0 for _, w, _ in rows)
            print(
                f"outlier S={S_out} seed={seed} bf16 (negative control): {fmt(rows)} -> "
                f"{'caught (> 1)' if caught else 'NOT caught'}"
            )
            ok &= caught
        sys.stdout.flush()

    print("ALL OK" if ok else "SOME FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
