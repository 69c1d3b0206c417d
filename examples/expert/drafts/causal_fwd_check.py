"""Desk check (CPU only) of the causal attention forward kernels' tiling and mask.

Checks ../mha_fwd_causal_d64.cu (192-row query tiles, 128-key tiles, per-warpgroup diagonal)
and ../mha_fwd_causal_d96.cu (128 x 128 tiles). The causal d128 kernel is persistent since the
twenty-second session; causal_persistent_check.py checks its work list and barriers. The tile
constants are read from the `constexpr` definitions of each source; the kernels' index
arithmetic is re-implemented below, one Python line per mirrored C++ line, and every mirrored
C++ line is asserted to be present verbatim in its source (so an edit of the kernel that this
model does not follow fails here).

For every S checked (4096, the task's workload, and a sweep of small S that reaches the
kernels' edge cases: 64-row tiles, the d64 half key tile), it asserts:
  * the scores the mask keeps, over all K/V tiles each warpgroup processes, are exactly
    {(i, j): j <= i} for every query row i, each pair once, and every kept score is the key the
    column's TMA box really loaded (the d64 half tile re-loads keys it must discard);
  * no K/V tile the producer loads is fully masked for the whole CTA, no tile a warpgroup
    processes is fully masked for that warpgroup, and the first tile a warpgroup processes (the
    one that seeds its running max) keeps a score in every row (finite max, no -inf - -inf);
  * producer and consumers agree on the tile in each ring stage and phase, and every load gets
    one release from every active warpgroup (d64's skipped tiles included), one of them after a
    real wait on the load's full barrier;
  * (d96) the ping-pong named barriers stay balanced for every trip count;
  * the query-tile hand-out order covers every (batch, head, query tile) once, heaviest first.
Negative controls: the same check with the diagonal condition off by one either way, and with
the trip count one short, must FAIL. The script exits non-zero if a real check fails or a
negative control passes.
"""

from __future__ import annotations

import itertools
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
from deskcheck import CheckError, assert_mirrored, constexprs, require

HERE = Path(__file__).resolve().parent
KERNELS = {
    "d64": HERE.parent / "mha_fwd_causal_d64.cu",
    "d96": HERE.parent / "mha_fwd_causal_d96.cu",
}
S_TASK, B_TASK, H_TASK = 4096, 4, 16


# ------------------------------------------------------------------------------------ sources


# ------------------------------------------------------------------ accumulator layout, mask
# contracts §2 (m64nNk16 fp32 accumulator): thread t = 32 warp + lane of a warpgroup holds, in
# register 4jj + 2h + e, row r0 + 8h and column 8jj + 2q + e, with r0 = 16 warp + lane / 4 and
# q = lane % 4. Mirrors, in every kernel:
#   const uint32_t r0 = 16u * warp + lane / 4u;
#   const uint32_t q = lane % 4u;
_t = np.arange(128)
WARP, LANE = _t // 32, _t % 32
R0 = 16 * WARP + LANE // 4
Q = LANE % 4
_i = np.arange(64)
JJ, HH, EE = _i // 4, (_i % 4) // 2, _i % 2
ROW = R0[:, None] + 8 * HH[None, :]  # [thread, register] -> warpgroup row 0..63
COL = 8 * JJ[None, :] + 2 * Q[:, None] + EE[None, :]  # -> tile column 0..127
assert np.bincount((ROW * 128 + COL).ravel(), minlength=64 * 128).tolist() == [1] * (64 * 128)

MASK_LINES = [
    "const int lim0 = row0 - 2 * q;",
    "const int lim1 = lim0 + 8;",
    "if (8 * jj + 0 > lim0) s_acc[4 * jj + 0] = kNegInf;",
    "if (8 * jj + 1 > lim0) s_acc[4 * jj + 1] = kNegInf;",
    "if (8 * jj + 0 > lim1) s_acc[4 * jj + 2] = kNegInf;",
    "if (8 * jj + 1 > lim1) s_acc[4 * jj + 3] = kNegInf;",
    "const uint32_t r0 = 16u * warp + lane / 4u;",
    "const uint32_t q = lane % 4u;",
]


def mask_diagonal_kept(row0_offset: int, slack: int = 0) -> np.ndarray:
    """[thread, register] True where mask_diagonal(s_acc, row0_offset + r0, q) keeps the score.

    Mirrors mask_diagonal (identical in the three kernels): lim0 = row0 - 2 * q, lim1 = lim0 + 8,
    register 4jj + 2h + e is set to -inf iff 8 * jj + e > lim_h. `slack` is the negative
    control: the real kernel is slack 0; +1 keeps key i + 1, -1 drops key i.
    """
    row0 = row0_offset + R0  # the caller's row0 argument, per thread
    lim0 = row0 - 2 * Q
    lim1 = lim0 + 8
    lim = np.where(HH[None, :] == 0, lim0[:, None], lim1[:, None])
    return ~(8 * JJ[None, :] + EE[None, :] > lim + slack)


# ----------------------------------------------------------------------------- kernel models
# A model returns, for one CTA, the producer's loads and each active warpgroup's processing:
#   loads: list of (logical key tile, token of box/col 0, token of col 64) per load i
#   wgs:   list of dicts: q0 (first query row), skip (leading loads released unread),
#          tiles (K/V tile per processed block), mask_row0 (row0 offset passed to
#          mask_diagonal on block 0; later blocks are unmasked)
# plus the cost (sum of processed 64 x 128 blocks) for the hand-out order check.

D64_LINES = [
    # num_full_tiles / num_q_tiles
    "return (units % 3 == 1) ? (units >= 4 ? units / 3 - 1 : 0) : units / 3;",
    "return n3 + (units - 3 * n3 + 1) / 2;",
    # host
    "const int units = S / 64;",
    "const int n_full = num_full_tiles(units);",
    "const dim3 grid(num_q_tiles(units), H, B);",
    # step 0
    "const int h = blockIdx.y;",
    "const int b = blockIdx.z;",
    "const int n_q = static_cast<int>(gridDim.x);",
    "const int x = n_q - 1 - static_cast<int>(blockIdx.x);",
    "const int n_small = n_q - n_full;",
    "const int q_start = x < n_small ? 128 * x : 128 * n_small + kBM * (x - n_small);",
    "const int n_active = x < n_small ? min(2, S / 64) : kConsumers;",
    "const int kt_hi = (q_start + 64 * n_active - 1) / kBN;",
    "const int n_kv = kt_hi + 1;",
    # step 2, producer
    "for (int i = 0; i < n_kv; ++i) {",
    "int tok0 = (kt_hi - i) * kBN;",
    "int tok1 = tok0 + kBoxRows < S ? tok0 + kBoxRows : tok0;",
    # step 3, consumer set-up
    "if (static_cast<int>(g) >= n_active) return;",
    "const int a = q_start + 64 * static_cast<int>(g);",
    "const int kt_g = a / kBN;",
    "const int n_g = kt_g + 1;",
    "const int n_skip = n_kv - n_g;",
    "for (int i = 0; i < n_skip; ++i) {",
    # step 4, 5
    "mask_diagonal(s_acc, (a - kt_g * kBN) + static_cast<int>(r0), static_cast<int>(q));",
    "for (int j = 1; j < n_g; ++j) {",
    # epilogue
    "const int row0 = q_start + static_cast<int>(g * 64u + r0);",
]


def d64_grid(c: dict[str, int], S: int) -> tuple[int, int]:
    units = S // 64  # const int units = S / 64;
    # num_full_tiles(units)
    n_full = (units // 3 - 1 if units >= 4 else 0) if units % 3 == 1 else units // 3
    n3 = n_full
    n_q = n3 + (units - 3 * n3 + 1) // 2  # num_q_tiles(units)
    return n_q, n_full


def d64_cta(c: dict[str, int], S: int, bx: int, bug: str | None) -> dict:
    kBM, kBN, kBoxRows, kConsumers = c["kBM"], c["kBN"], c["kBoxRows"], c["kConsumers"]
    n_q, n_full = d64_grid(c, S)
    x = n_q - 1 - bx
    n_small = n_q - n_full
    q_start = 128 * x if x < n_small else 128 * n_small + kBM * (x - n_small)
    n_active = min(2, S // 64) if x < n_small else kConsumers
    kt_hi = (q_start + 64 * n_active - 1) // kBN
    n_kv = kt_hi + 1
    loads = []
    for i in range(n_kv):  # producer: for (int i = 0; i < n_kv; ++i)
        tok0 = (kt_hi - i) * kBN
        tok1 = tok0 + kBoxRows if tok0 + kBoxRows < S else tok0
        loads.append((kt_hi - i, tok0, tok1))
    wgs = []
    for g in range(kConsumers):
        if g >= n_active:  # idle warpgroup returns
            continue
        a = q_start + 64 * g
        kt_g = a // kBN
        n_g = kt_g + 1 - (1 if bug == "trip-1" else 0)
        n_skip = n_kv - n_g if bug != "trip-1" else n_kv - (kt_g + 1)
        # block j (prologue j = 0, loop j = 1 .. n_g - 1) is K/V tile kt_g - j
        wgs.append(
            dict(q0=a, skip=n_skip, tiles=[kt_g - j for j in range(n_g)], mask_row0=a - kt_g * kBN)
        )
    return dict(loads=loads, wgs=wgs, n_active=n_active, q_start=q_start, pingpong=False)


SQUARE_LINES = [
    "const int h = blockIdx.y;",
    "const int b = blockIdx.z;",
    "const int n_q = static_cast<int>(gridDim.x);",
    "const int q_tile = n_q - 1 - static_cast<int>(blockIdx.x);",
    "const int n_kv = q_tile + 1;",
    "for (int i = 0; i < n_kv; ++i) {",
    "const int tok = kv_tok0 + (q_tile - i) * kBN;",
    "mask_diagonal(s_acc, static_cast<int>(64u * g + r0), static_cast<int>(q));",
    "for (int j = 1; j < n_kv; ++j) {",
    "const int row0 = q_tile * kBM + static_cast<int>(g * 64u + r0);",
    "const dim3 grid(S / kBM, H, B);",
    # ping-pong
    "if (g == 1) ptx::named_bar_arrive(kTurnBar + 0, 256);",
    "ptx::named_bar_sync(kTurnBar + g, 256);",
    "if (!(g == 1 && n_kv == 1)) ptx::named_bar_arrive(kTurnBar + (1 - g), 256);",
    "if (!(g == 1 && j == n_kv - 1)) ptx::named_bar_arrive(kTurnBar + (1 - g), 256);",
]


def square_grid(c: dict[str, int], S: int) -> tuple[int, int]:
    return S // c["kBM"], 0  # const dim3 grid(S / kBM, H, B);


def square_cta(c: dict[str, int], S: int, bx: int, bug: str | None) -> dict:
    kBM, kBN = c["kBM"], c["kBN"]
    n_q = S // kBM
    q_tile = n_q - 1 - bx
    n_kv = q_tile + 1 - (1 if bug == "trip-1" else 0)
    loads = [(q_tile - i, (q_tile - i) * kBN, (q_tile - i) * kBN + 64) for i in range(n_kv)]
    wgs = [
        dict(
            q0=q_tile * kBM + 64 * g,
            skip=0,
            tiles=[q_tile - j for j in range(n_kv)],
            mask_row0=64 * g,
        )
        for g in range(2)
    ]
    return dict(loads=loads, wgs=wgs, n_active=2, q_start=q_tile * kBM, pingpong=True)


MODELS: dict[str, tuple[list[str], Callable, Callable]] = {
    "d64": (D64_LINES, d64_grid, d64_cta),
    "d96": (SQUARE_LINES, square_grid, square_cta),
}


# ------------------------------------------------------------------------------------ checks
def check_pingpong(n_kv: int) -> None:
    """Named barriers 1 and 2 (kTurnBar = 1): syncs and arrivals per CTA must match."""
    syncs = {1: n_kv, 2: n_kv}  # consumer g syncs bar 1 + g once per block (prologue + loop)
    arrives = {1: 1, 2: 0}  # g == 1 primes bar 1
    for g in (0, 1):
        other = 1 + (1 - g)
        arrives[other] += 0 if (g == 1 and n_kv == 1) else 1  # prologue
        arrives[other] += sum(1 for j in range(1, n_kv) if not (g == 1 and j == n_kv - 1))
    require(syncs == arrives, f"ping-pong unbalanced at n_kv={n_kv}: {syncs} vs {arrives}")


def check_cta(c: dict[str, int], S: int, cta: dict, slack: int, counts: np.ndarray) -> int:
    """Accumulate the kept (i, j) pairs of one CTA into counts[S, S]; return its block count."""
    kBN, kStages = c["kBN"], c["kStages"]
    loads, wgs = cta["loads"], cta["wgs"]
    n_kv = len(loads)
    for _tile, tok0, tok1 in loads:  # every box inside this batch's S tokens
        require(0 <= tok0 <= S - 64 and 0 <= tok1 <= S - 64, f"box outside the batch: {tok0}")
    released = np.zeros(n_kv, dtype=int)
    waited = np.zeros(n_kv, dtype=bool)
    load_kept = np.zeros(n_kv, dtype=bool)
    blocks = 0
    for wg in wgs:
        # ring bookkeeping: kst/kph advance once per released stage, skipped or processed
        kst, kph = 0, 0
        # A skipped load is released before the warpgroup waits on anything, so its arrival
        # lands in whatever phase the empty barrier is in: that is the load's own phase only if
        # the stage was never refilled before, i.e. load index < kStages.
        require(wg["skip"] <= kStages, f"{wg['skip']} skipped loads, more than {kStages} stages")
        for i in range(wg["skip"]):
            require((kst, kph) == (i % kStages, i // kStages % 2), "skip stage mismatch")
            released[i] += 1
            kst, kph = (0, kph ^ 1) if kst + 1 == kStages else (kst + 1, kph)
        for j, tile in enumerate(wg["tiles"]):
            i = wg["skip"] + j  # the producer's load index of this stage
            require(i < n_kv, f"warpgroup consumes load {i} of {n_kv}")
            require((kst, kph) == (i % kStages, i // kStages % 2), "stage/phase mismatch")
            require(loads[i][0] == tile, f"stage holds tile {loads[i][0]}, block wants {tile}")
            released[i] += 1
            waited[i] = True
            kst, kph = (0, kph ^ 1) if kst + 1 == kStages else (kst + 1, kph)
            # scores: row q0 + r of the warpgroup, column col of the tile
            if j == 0:
                kept = mask_diagonal_kept(wg["mask_row0"], slack)
            else:
                kept = np.ones_like(ROW, dtype=bool)
            qi = wg["q0"] + ROW
            kj_logical = tile * kBN + COL
            _, tok0, tok1 = loads[i]
            kj_loaded = np.where(COL < 64, tok0 + COL, tok1 + COL - 64)
            require(kept.any(), f"warpgroup at row {wg['q0']} processes fully masked tile {tile}")
            if j == 0:
                rows_with_key = np.zeros(64, dtype=bool)
                rows_with_key[ROW[kept]] = True
                require(rows_with_key.all(), f"first block of row {wg['q0']}: a row has no key")
            require(
                bool((kj_logical[kept] == kj_loaded[kept]).all()),
                "a kept score is not the key its box loaded",
            )
            load_kept[i] |= kept.any()
            np.add.at(counts, (qi[kept], kj_loaded[kept]), 1)
            blocks += 1
    require(bool((released == len(wgs)).all()), f"releases per load {released}, want {len(wgs)}")
    require(bool(waited.all()), "a load is released by every warpgroup without a full wait")
    require(bool(load_kept.all()), "the producer loads a tile fully masked for the CTA")
    if cta["pingpong"]:
        check_pingpong(n_kv)
    return blocks


def check_kernel(name: str, S: int, slack: int = 0, bug: str | None = None) -> dict:
    src = KERNELS[name].read_text()
    c = constexprs(src)
    lines, grid, cta_model = MODELS[name]
    assert_mirrored(src, lines, name)
    assert_mirrored(src, MASK_LINES, name)
    n_q, _ = grid(c, S)
    counts = np.zeros((S, S), dtype=np.int32)
    costs = []
    loads = 0
    for bx in range(n_q):
        cta = cta_model(c, S, bx, bug)
        costs.append(check_cta(c, S, cta, slack, counts))
        loads += len(cta["loads"])
    want = np.tril(np.ones((S, S), dtype=np.int32))
    bad = np.argwhere(counts != want)
    require(
        len(bad) == 0,
        f"kept set != {{j <= i}}: {len(bad)} wrong pairs, first (i, j) = {bad[:3].tolist()}",
    )
    # hand-out order: blocks (x, y, z) of grid (n_q, H, B), x fastest
    seen = {}
    for z in range(B_TASK):
        for y in range(H_TASK):
            for bx in range(n_q):
                q0 = cta_model(c, S, bx, bug)["q_start"]
                seen[(z, y, q0)] = seen.get((z, y, q0), 0) + 1
    require(len(seen) == B_TASK * H_TASK * n_q and set(seen.values()) == {1}, "hand-out order")
    starts = sorted(cta_model(c, S, bx, bug)["q_start"] for bx in range(n_q))
    sizes = [64 * cta_model(c, S, bx, bug)["n_active"] for bx in range(n_q)]
    require(sum(sizes) == S, "query tiles do not cover S rows")
    require(starts == sorted(set(starts)), "two CTAs start at the same row")
    require(all(a >= b for a, b in itertools.pairwise(costs)), f"not heaviest first: {costs}")
    pairs = S * (S + 1) // 2
    return dict(
        n_q=n_q,
        blocks=sum(costs),
        coverage=sum(costs) * 64 * c["kBN"] / pairs,
        loads=loads,
        costs=costs,
    )


def main() -> int:
    ok = True
    sweep = {
        "d64": [*range(64, 1025, 64), S_TASK],
        "d96": [*range(128, 1025, 128), S_TASK],
    }
    for name, path in KERNELS.items():
        c = constexprs(path.read_text())
        print(
            f"{name}: {path.name}: kBM={c['kBM']} kBN={c['kBN']} kStages={c['kStages']} "
            f"kThreads={c['kThreads']}"
        )
        try:
            for S in sweep[name]:
                r = check_kernel(name, S)
            print(
                f"  real check PASSED for S in {sweep[name][0]}..{sweep[name][-2]} and {S_TASK}; "
                f"at S={S_TASK}: {r['n_q']} query tiles/head, {r['loads']} K/V tile loads/head, "
                f"{r['blocks']} 64x{c['kBN']} blocks/head, FLOP coverage {r['coverage']:.4f}"
            )
            print(f"  cost per CTA in hand-out order (64x{c['kBN']} blocks): {r['costs']}")
        except CheckError as e:
            ok = False
            print(f"  real check FAILED: {e}")
        for label, slack, bug in [
            ("diagonal j <= i + 1 (off by one)", 1, None),
            ("diagonal j < i (off by one)", -1, None),
            ("trip count one short", 0, "trip-1"),
        ]:
            try:
                check_kernel(name, S_TASK, slack, bug)
                ok = False
                print(f"  negative control '{label}': PASSED (wrong: the check cannot see it)")
            except CheckError as e:
                print(f"  negative control '{label}': FAILED as it must ({e})")
    print("ALL CHECKS OK" if ok else "CHECKS FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
