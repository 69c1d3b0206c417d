"""What the backward drafts' desk checks share (a library, not a check: a helper in manifest.yaml).

The three backward drafts (mha_bwd_d128.cu, mha_bwd_causal_d128.cu, mha_bwd_d64.cu) run one
schedule: a CTA owns a key tile of 128 split between two consumer warpgroups of 64 keys, and
streams query tiles of 64 through a ring of stages. What differs per draft (the query tiles a
CTA visits, the causal mask, which warpgroup runs G5, the stage count and the box sizes) stays in
each draft's own scripts, which pass it to the models here:

* the numpy model (``bwd_*numpy_model.py``): inputs as kernels_ref.mha.make_bwd_inputs makes them,
  the float64 reference formulas of kernels_ref.mha.bwd_reference, the kernel's per-tile
  products and roundings (``kernel_model``), the comparison under the task's allclose(atol =
  rtol = 1e-2) and the ``--outliers`` study;
* the synchronisation model (``bwd_*sync_sim.py``): ``BwdSyncSim``, the producer, its async
  copies and the two consumer warpgroups as actors over the mbarriers and named barriers of
  deskcheck.py;
* the shared-memory checks (``bwd_*desc_check.py``): the dS^T stores of both warpgroups, the RS
  A fragments and the dQ staging -> dQacc -> post kernel layout.

mha_bwd_causal_d64.cu, the fourth backward draft, runs the same schedule; its scripts
(``bwd_causal_d64_*.py``) also use the causal models at the end of this module (tile order,
diagonal mask, causal trip counts, CTA order).
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Callable, Iterable, Iterator

import numpy as np
from deskcheck import (
    MBar,
    NamedBarriers,
    Smem,
    acc_coord,
    afrag_coord,
    bf16,
    interleave,
    negative_controls,
)

BN, BM = 128, 64  # keys per CTA (two warpgroups of 64), queries per tile
LOG2E = 1.4426950408889634
NAMES = ("dQ", "dK", "dV")


# ---------------------------------------------------------------------------------------------
# Numpy model
# ---------------------------------------------------------------------------------------------
def f16(x: np.ndarray) -> np.ndarray:
    """Round float32 to fp16 (nearest even), returned as float32 (the --outliers study)."""
    return np.asarray(x, np.float32).astype(np.float16).astype(np.float32)


def causal_mask(S: int) -> np.ndarray:
    """True where key j > query i (masked)."""
    return np.triu(np.ones((S, S), dtype=bool), k=1)


def make_inputs(S: int, D: int, seed: int, outliers: bool, causal: bool = False):
    """Q, K ~ N(0, 2), V, dO ~ N(0, 1), bf16 (optionally with the judge's outlier stage: 0.1 %
    scaled x8-16); O = bf16(forward O) and LSE from the (causal) forward."""
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
    if causal:
        s[causal_mask(S)] = -np.inf
    m = s.max(axis=1, keepdims=True)
    p = np.exp(s - m)
    row_sum = p.sum(axis=1, keepdims=True)
    o = bf16(((p / row_sum) @ v.astype(np.float64)).astype(np.float32))
    lse = (m + np.log(row_sum))[:, 0].astype(np.float32)
    return q, k, v, o, do, lse


def reference(q, k, v, o, do, lse, causal: bool = False):
    """float64 dQ, dK, dV (P = 0 above the diagonal when causal)."""
    q, k, v, o, do = (x.astype(np.float64) for x in (q, k, v, o, do))
    scale = 1.0 / np.sqrt(q.shape[1])
    s = q @ k.T * scale
    if causal:
        s[causal_mask(q.shape[0])] = -np.inf
    p = np.exp(s - lse.astype(np.float64)[:, None])
    dv = p.T @ do
    dp = do @ v.T
    ds = p * (dp - (do * o).sum(axis=1, keepdims=True))
    return ds @ k * scale, ds.T @ q * scale, dv


def ring_order(stagger: bool) -> Callable[[int, int], list[int]]:
    """The non-causal drafts' query tile order: CTA kt visits all n_q tiles, from tile 2kt
    (staggered) or 0, wrapping around."""

    def query_tiles(kt: int, n_q: int) -> list[int]:
        q_off = (2 * kt) % n_q if stagger else 0
        return [(q_off + it) % n_q for it in range(n_q)]

    return query_tiles


def kernel_model(
    q,
    k,
    v,
    o,
    do,
    lse,
    *,
    query_tiles: Callable[[int, int], Iterable[int]],
    g5: Callable,
    mask: Callable[[int, int], np.ndarray | None] | None = None,
    rnd=bf16,
    poison: bool = False,
    operand=None,
):
    """The kernel's tiling, order and roundings; returns dQ, dK, dV.

    Per CTA kt (keys kt*128 .. +127), per query tile qt of query_tiles(kt, n_q) (iteration it),
    per consumer warpgroup g (keys 64g.. of the tile):
      S^T = K_g Q^T (fp32 of bf16 inputs)       P^T = 2^(S^T c - LSE log2e)
      dP^T = V_g dO^T                           dS^T = P^T (dP^T - Dr)
      dV_g += rnd(P^T) dO                       dK_g += rnd(dS^T) Q
    with mask(g, it) (None, or [64 keys][64 queries], True = -inf before the exp); then
    g5(dq_acc, ds_t, k_tile, qs, kt, it) adds dS K into dQacc from the dS^T buffer ds_t (rnd values)
    as the kernel's G5 does. Finally dK = bf16(scale dK), dV = bf16(dV), dQ = bf16(scale dQacc);
    Dr = rowsum(dO O) in fp32. rnd: rounding of the wgmma A operands P^T and dS^T (bf16 in the
    kernels). poison: dK / dV start as NaN, so every key row must be written. operand: None, or
    the rounding of the Q, K, V, dO tiles as the wgmmas read them (mha_bwd_d128_fp16.cu converts
    them from bf16 to fp16 in shared memory: operand = f16); Dr keeps the unrounded dO and O.
    """
    S, D = q.shape
    n_q, n_kt = S // BM, S // BN
    scale = np.float32(1.0 / np.sqrt(D))
    c = np.float32(LOG2E / np.sqrt(D))
    dr = (do * o).sum(axis=1, dtype=np.float32)  # bwd_pre_kernel
    if operand is not None:  # the smem operand tiles after an in-place conversion
        q, k, v, do = (operand(x) for x in (q, k, v, do))
    dq_acc = np.zeros((S, D), np.float32)  # cudaMemsetAsync
    dk = np.full((S, D), np.nan if poison else 0.0, np.float32)
    dv = np.full((S, D), np.nan if poison else 0.0, np.float32)
    for kt in range(n_kt):  # one CTA
        acc_k = [np.zeros((64, D), np.float32) for _ in range(2)]
        acc_v = [np.zeros((64, D), np.float32) for _ in range(2)]
        for it, qt in enumerate(query_tiles(kt, n_q)):
            qs = slice(qt * BM, qt * BM + BM)
            Qi, dOi = q[qs], do[qs]
            nl = (-lse[qs] * np.float32(LOG2E)).astype(np.float32)
            ds_t = np.zeros((BN, BM), np.float32)  # the dS^T smem buffer (bf16 values)
            for g in range(2):
                ks = slice(kt * BN + 64 * g, kt * BN + 64 * g + 64)
                sT = (k[ks] @ Qi.T).astype(np.float32)  # G1
                m = mask(g, it) if mask is not None else None
                if m is not None:  # causal mask (-inf before the exp)
                    sT = np.where(m, np.float32(-np.inf), sT)
                dpT = (v[ks] @ dOi.T).astype(np.float32)  # G2
                pT = np.exp2(sT * c + nl[None, :]).astype(np.float32)
                acc_v[g] += rnd(pT) @ dOi  # G3
                dsT = (pT * (dpT - dr[qs][None, :])).astype(np.float32)
                acc_k[g] += rnd(dsT) @ Qi  # G4
                ds_t[64 * g : 64 * g + 64] = rnd(dsT)
            g5(dq_acc, ds_t, k[kt * BN : kt * BN + BN], qs, kt, it)
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


def compare_all(got, ref, quiet: bool = False) -> bool:
    """compare() of dQ, dK and dV (each printed unless quiet); True if all three pass."""
    ok = True
    for name, a, r in zip(NAMES, got, ref, strict=True):
        ok &= compare(name, a, r, quiet)[0]
    return ok


def outlier_study(S: int, seeds: int, D: int, model: Callable, causal: bool = False) -> None:
    """The judge's outlier stage (0.1 % of Q, K, V, dO scaled x8-16), one head per seed:
    worst err/tol and count of elements over tolerance, with P^T/dS^T rounded to bf16 (the
    kernel, and FA2/FA3/cuDNN-style kernels) and, for comparison, to fp16.
    model(q, k, v, o, do, lse, rnd) -> (dQ, dK, dV)."""
    for seed in range(seeds):
        q, k, v, o, do, lse = make_inputs(S, D, seed=seed, outliers=True, causal=causal)
        ref = reference(q, k, v, o, do, lse, causal)
        for label, rnd in (("bf16", bf16), ("fp16", f16)):
            got = model(q, k, v, o, do, lse, rnd)
            parts = []
            for name, a, r in zip(NAMES, got, ref, strict=True):
                _, worst, n_bad = compare(name, a, r, quiet=True)
                parts.append(f"{name} {worst:5.2f} ({n_bad:3d} over)")
            print(f"S={S} seed={seed} P,dS in {label}: " + "  ".join(parts), flush=True)


def numpy_main(argv: list[str], D: int, model: Callable) -> int:
    """main() of a non-causal draft's numpy model: ``[S ...]`` or ``--outliers S SEEDS``.
    model(q, k, v, o, do, lse, stagger, rnd=bf16) -> (dQ, dK, dV)."""
    if argv and argv[0] == "--outliers":
        S = int(argv[1]) if len(argv) > 1 else 1024
        seeds = int(argv[2]) if len(argv) > 2 else 2
        outlier_study(
            S, seeds, D, lambda q, k, v, o, do, lse, rnd: model(q, k, v, o, do, lse, False, rnd)
        )
        return 0
    sizes = [int(a) for a in argv] or [256, 512, 1024]
    ok = True
    for S in sizes:
        for stagger in (False, True):
            q, k, v, o, do, lse = make_inputs(S, D, seed=S, outliers=False)
            ref = reference(q, k, v, o, do, lse)
            got = model(q, k, v, o, do, lse, stagger)
            print(f"S={S} stagger={stagger}")
            ok &= compare_all(got, ref)
    print("ALL OK" if ok else "SOME FAILED")
    return 0 if ok else 1


# ---------------------------------------------------------------------------------------------
# Synchronisation model
# ---------------------------------------------------------------------------------------------
class BwdSyncSim:
    """Actors, each a list of steps executed in program order, one step at a time in a random
    global interleaving (deskcheck.interleave; a step that cannot proceed, a wait, blocks its
    actor): the producer thread, every async copy (it lands later, at a random moment, writing
    its bytes into the stage and signalling complete_tx), and the two consumer warpgroups, with
    their 4 warps' q_empty arrivals as separate steps and their wgmma groups modelled as "reads
    the stage / the dS^T buffer from issue until the wait that retires it".

    A draft's script subclasses it for what its kernel changes: the stage count and copies
    (STAGES, PARTS, KV_BOXES, KV_BOX_BYTES), the query tiles (q_off, n_it, next_tile), the trip
    counts and which warpgroup runs G5 (g5_runs). Bugs (negative controls) shared by all drafts:
    "one_ds_buffer", "early_release", "parity" and "arrive_only" (the warpgroup without G5 only
    arrives at the dS^T barrier)."""

    STAGES = 2
    PARTS: tuple[tuple[str, int], ...] = (
        ("Q0", 8192),
        ("Q1", 8192),
        ("dO0", 8192),
        ("dO1", 8192),
        ("LSE", 256),
        ("Dr", 256),
    )
    KV_BOXES = 4  # of KV_BOX_BYTES each
    KV_BOX_BYTES = 16384

    def __init__(self, n_q: int, rng: random.Random, bug: str = "") -> None:
        self.rng = rng
        self.bug = bug
        self.n_q = n_q
        self.q_off = 0  # first query tile
        self.n_it = n_q  # query tiles per CTA
        self.issued = self.landed = 0
        self.kv_full = MBar(1)
        self.q_full = [MBar(1) for _ in range(self.STAGES)]
        self.q_empty = [MBar(8) for _ in range(self.STAGES)]
        # stage contents: per stage, {part: tile} landed since the last refill
        self.stage: list[dict] = [dict() for _ in range(self.STAGES)]
        self.readers: list[set] = [set() for _ in range(self.STAGES)]  # warpgroups reading it
        self.ds = [[None, None] for _ in range(2)]  # ds[buf][half] = iteration written
        self.ds_readers: list[set] = [set(), set()]  # warpgroups whose G5 may read buf
        self.kv_loaded = 0
        self.actors: list = []
        self.errors: list[str] = []
        self.bars = NamedBarriers(self.errors.append)

    # ---- what a draft changes ----
    def next_tile(self, qt: int) -> int:
        return qt + 1 if qt + 1 < self.n_q else 0

    def producer_trips(self) -> int:
        return self.n_it

    def consumer_trips(self) -> int:
        return self.n_it

    def g5_runs(self, g: int, it: int) -> bool:
        return True

    def check_end(self) -> None:
        for b in self.q_full + self.q_empty:
            if b.tx != 0:
                self.errors.append("tx bytes left on a barrier")

    # ---- actors ----
    def bar_arrive(self, name: str, me, members: int):
        self.bars.arrive(name, me, members)
        yield True

    def copy(self, s: int, part: str, tile: int, nbytes: int, bar: MBar):
        self.issued += 1
        yield True  # issued; lands at a random later moment
        if self.readers[s]:
            self.errors.append(f"copy {part} of tile {tile} lands in stage {s} while read")
        self.stage[s][part] = tile
        self.landed += 1
        bar.complete_tx(nbytes)
        yield True

    def kv_copy(self):
        yield True
        self.kv_loaded += 1
        self.kv_full.complete_tx(self.KV_BOX_BYTES)
        yield True

    def producer(self):
        self.kv_full.arrive(self.KV_BOXES * self.KV_BOX_BYTES)
        for _ in range(self.KV_BOXES):
            self.actors.append(self.kv_copy())
        yield True
        st, ph, qt = 0, 0, self.q_off
        q_tx = sum(nb for _, nb in self.PARTS)
        for _ in range(self.producer_trips()):
            while not self.q_empty[st].passes(ph if self.bug == "parity" else ph ^ 1):
                yield False
            self.q_full[st].arrive(q_tx)
            for part, nb in self.PARTS:
                self.actors.append(self.copy(st, part, qt, nb, self.q_full[st]))
            yield True
            st, ph = (st + 1, ph) if st + 1 < self.STAGES else (0, ph ^ 1)
            qt = self.next_tile(qt)

    def consumer(self, g: int):
        while not self.kv_full.passes(0):
            yield False
        if self.kv_loaded != self.KV_BOXES:
            self.errors.append("kv_full passed before K/V landed")
        st, ph, qt = 0, 0, self.q_off
        for it in range(self.consumer_trips()):
            buf = 0 if self.bug == "one_ds_buffer" else it & 1
            while not self.q_full[st].passes(ph):
                yield False
            got = self.stage[st]
            if any(got.get(p) != qt for p, _ in self.PARTS):
                self.errors.append(f"WG{g} it {it}: stage {st} holds {got}, expected tile {qt}")
            self.readers[st].add(g)  # G1..G4 and the LSE/Dr loads read the stage
            if self.bug == "early_release":  # arrive right after the S^T / dP^T issue
                for _w in range(4):
                    self.q_empty[st].arrive()
            yield True
            # dS^T half store (after G2 retired); its buffer must not be read by any G5
            if self.ds_readers[buf]:
                self.errors.append(
                    f"WG{g} it {it}: dS^T buf {buf} rewritten while G5 of "
                    f"{self.ds_readers[buf]} may read it"
                )
            self.ds[buf][g] = it
            yield True
            do_dq = self.g5_runs(g, it)
            if not do_dq and self.bug == "arrive_only":
                yield from self.bar_arrive("ds", g, 2)
            else:
                yield from self.bars.sync("ds", g, 2)
            if do_dq:
                # G5 issued: reads both halves of buf
                if self.ds[buf] != [it, it]:
                    self.errors.append(f"WG{g} it {it}: G5 sees dS^T halves {self.ds[buf]}")
                self.ds_readers[buf].add(g)
                yield True
            # wait<1> (G5 warpgroup) or wait<0>: G3, G4 retired -> stage released by the 4 warps
            self.readers[st].discard(g)
            for _w in range(4 if self.bug != "early_release" else 0):
                self.q_empty[st].arrive()
                yield True
            st, ph = (st + 1, ph) if st + 1 < self.STAGES else (0, ph ^ 1)
            if do_dq:
                # wait<0>: G5 retired
                yield True
                if self.ds[buf] != [it, it]:
                    self.errors.append(f"WG{g} it {it}: dS^T changed under G5: {self.ds[buf]}")
                self.ds_readers[buf].discard(g)
                # staging barriers (own warpgroup only: a 1-member rendezvous here)
                yield from self.bars.sync(f"stage{g}", g, 1)
                yield from self.bars.sync(f"stage{g}", g, 1)
            qt = self.next_tile(qt)

    def run(self) -> bool:
        self.actors = [self.producer(), self.consumer(0), self.consumer(1)]
        if not interleave(self.actors, self.rng):
            self.errors.append("deadlock")
            return False
        self.check_end()
        return not self.errors


def count_failures(cases: Iterable[tuple[str, BwdSyncSim]], shown: int = 3) -> tuple[int, int]:
    """Runs every (label, sim) of `cases`, printing the first errors of the first `shown` failing
    runs; returns (runs, failing runs)."""
    total = bad = 0
    for label, sim in cases:
        total += 1
        if not sim.run():
            bad += 1
            if bad <= shown:
                print(f"{label}: {sim.errors[:3]}")
    return total, bad


def sync_main(argv: list[str], sim: type[BwdSyncSim], n_qs: list[int], bugs: Iterable[str]) -> int:
    """main() of a non-causal draft's simulation: ``[runs]`` random interleavings (n_q drawn from
    n_qs, query tiles plain or staggered by a random key tile), then each deliberate bug of `bugs`
    must be caught in some run. sim(n_q, rng, stagger_kt, bug)."""
    runs = int(argv[0]) if argv else 300

    def cases() -> Iterator[tuple[str, BwdSyncSim]]:
        for r in range(runs):
            rng = random.Random(r)
            n_q = rng.choice(n_qs)
            stagger = rng.choice([None, rng.randrange(4)])
            yield f"run {r} (n_q {n_q}, stagger {stagger})", sim(n_q, rng, stagger)

    total, bad = count_failures(cases())
    print(f"{total - bad}/{total} random interleavings clean")

    def failed(bug: str, r: int) -> bool:
        rng = random.Random(r)
        return not sim(rng.choice(n_qs), rng, None, bug).run()

    caught_all = negative_controls(bugs, runs, failed)
    return 1 if bad or not caught_all else 0


# ---------------------------------------------------------------------------------------------
# Shared-memory operands
# ---------------------------------------------------------------------------------------------
def store_ds_t(smem: Smem, ds: int, ds_xor_fn=None) -> None:
    """The dS^T stores of both consumer warpgroups into the buffer at `ds`, exactly as the
    kernels: row base + (byte column ^ (lane/4) << 4), the m64n64 accumulator map and the packing
    df[s][k] = pack(dp[8s+2k], dp[8s+2k+1]). ds_xor_fn(t) replaces the XOR (negative controls)."""
    for g in range(2):
        for t in range(128):
            lane = t % 32
            r0 = 16 * (t // 32) + lane // 4
            q4 = lane % 4
            ds_row0 = (64 * g + r0) * 128
            ds_row1 = ds_row0 + 8 * 128
            ds_xor = (lane // 4) << 4 if ds_xor_fn is None else ds_xor_fn(t)
            for s in range(4):
                col0 = (32 * s + 4 * q4) ^ ds_xor
                col1 = (32 * s + 16 + 4 * q4) ^ ds_xor
                for k, addr in (
                    (0, ds_row0 + col0),
                    (1, ds_row1 + col0),
                    (2, ds_row0 + col1),
                    (3, ds_row1 + col1),
                ):
                    # df[s][k] = pack(dp[8s + 2k], dp[8s + 2k + 1]): low half at the lower address
                    for half in range(2):
                        i = 8 * s + 2 * k + half
                        row, col = acc_coord(t, i)  # dS^T row = key within g, col = query
                        a = ds + addr + 2 * half
                        assert a not in smem, "two stores to one dS^T element"
                        smem[a] = ("dS", col, 64 * g + row)  # stored as dS[query][key]


def check_rs_fragments() -> int:
    """pf[s][k] = pack(acc[8s+2k], acc[8s+2k+1]) must be the register-A fragment of k-step s."""
    wrong = 0
    for t in range(128):
        for s in range(4):
            for k in range(4):
                for half in range(2):
                    row, col = acc_coord(t, 8 * s + 2 * k + half)
                    frow, fk = afrag_coord(t, k, half)
                    wrong += (row, col) != (frow, 16 * s + fk)
    print(
        f"{'RS A fragments from the m64n64 accumulator (P^T, dS^T)':>58}: "
        f"{'OK' if wrong == 0 else f'{wrong} wrong'}"
    )
    return wrong


def check_dq_layout(halves: int, tile_floats: int, post_tile_div: int, chunks: int = 8) -> int:
    """Staging float4 (c, t) -> global fragment layout -> post kernel's inverse map.

    The dQ tile of a query tile is `halves` [64][8 chunks] fp32 staging boxes (one per
    warpgroup's 8 chunks d columns; chunks = 8: [64][64], chunks = 12: the d96 drafts' [64][96],
    one box of 96 rows of the map), `tile_floats` floats in dQacc (2-D map {64, rows}); the post
    kernel decodes the float4 index idx as thread idx % 128, chunk (idx / 128) % chunks, half
    (idx / (128 chunks)) % halves and tile idx / post_tile_div. Every (query, d) must round-trip
    exactly once and every box row stay inside the map.
    """
    n_q, H, B = 4, 3, 2
    S = 64 * n_q
    rows_per_tile = tile_floats // 64
    box_rows = 8 * chunks  # rows of 64 floats in one staging box (64 for [64][64])
    seen: dict[tuple, int] = {}
    wrong = 0
    for b in range(B):
        for h in range(H):
            for qt in range(n_q):
                for g in range(halves):
                    # kernel: tensor-map row (64 floats) of this half, box of 64 rows
                    row0 = (b * H + h) * n_q * rows_per_tile + qt * rows_per_tile + g * box_rows
                    for t in range(128):
                        for c in range(chunks):
                            for e in range(4):
                                # staging byte (128c + t) * 16 + 4e, box row-major [64][64] fp32
                                sbyte = (128 * c + t) * 16 + 4 * e
                                gfloat = row0 * 64 + sbyte // 4
                                qrow, dcol = acc_coord(t, 4 * c + e)  # m64n64: row = q, col = d
                                truth = (b, qt * 64 + qrow, h, 8 * chunks * g + dcol)
                                # post kernel: idx = float4 index, element e of it
                                idx = gfloat // 4
                                assert gfloat % 4 == e
                                tt = idx % 128
                                cc = (idx // 128) % chunks
                                gg = (idx // (128 * chunks)) % halves
                                tile = idx // post_tile_div
                                qq = tile % n_q
                                bh = tile // n_q
                                hh, bb = bh % H, bh // H
                                r0 = 16 * (tt // 32) + (tt % 32) // 4
                                col = 8 * chunks * gg + 8 * cc + 2 * (tt % 4)
                                post = (bb, qq * 64 + r0 + 8 * (e // 2), hh, col + (e % 2))
                                wrong += post != truth
                                seen[truth] = seen.get(truth, 0) + 1
    full = B * S * H * 8 * chunks * halves
    max_row = (B * H * n_q - 1) * rows_per_tile + box_rows * (halves - 1) + box_rows - 1
    ok = wrong == 0 and len(seen) == full and all(v == 1 for v in seen.values())
    ok &= max_row < B * S * H * halves * chunks // 8
    print(
        f"{'dQ staging -> dQacc fragment layout -> post kernel':>58}: "
        f"{'OK' if ok else f'{wrong} wrong, {len(seen)}/{full} covered'}"
    )
    return 0 if ok else 1


# ---------------------------------------------------------------------------------------------
# Causal drafts: tile order, diagonal mask, synchronisation trip counts and CTA order
# (used by bwd_causal_d64_*.py; the d128 causal scripts keep their own copies of the same models)
# ---------------------------------------------------------------------------------------------
def causal_query_tiles(kt: int, n_q: int) -> range:
    """The causal drafts' query tile order: CTA kt visits tiles 2kt .. n_q - 1, no wrap."""
    return range(2 * kt, n_q)


def causal_mask_tile(g: int, it: int) -> np.ndarray:
    """The causal drafts' mask for consumer g at iteration it <= g, as a [64 keys][64 queries]
    array (True = masked), built from each thread's predicate on its S^T registers as the kernels
    evaluate it: register 4j+e masked iff 8j + (e & 1) < lim, lim0 = r0 + 64(g - it) - 2q4 for
    e < 2 and lim1 = lim0 + 8 for e >= 2. Asserts the register map covers the tile once."""
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


def check_causal_mask_claims(S: int, masks: dict) -> None:
    """Asserts the causal drafts' structural claims against the dense causal mask, for every
    (kt, qt, g): with it = qt - 2kt, masks[(g, it)] equals "key > query" where it <= g; a tile
    with it > g has no masked pair; a skipped tile (it < 0) is entirely masked."""
    full = causal_mask(S).T  # [key][query]: True where key > query
    for kt in range(S // BN):
        for qt in range(S // BM):
            for g in range(2):
                keys = slice(kt * BN + 64 * g, kt * BN + 64 * g + 64)
                tile = full[keys, qt * BM : qt * BM + BM]
                it = qt - 2 * kt
                if it < 0:
                    assert tile.all(), f"skipped tile kt {kt} qt {qt} has an unmasked pair"
                elif it <= g:
                    assert np.array_equal(masks[(g, it)], tile), f"mask wrong kt {kt} it {it} g {g}"
                else:
                    assert not tile.any(), f"unmasked tile kt {kt} it {it} g {g} needs a mask"


def causal_model_check(sizes: Iterable[int], D: int, masks: dict, model: Callable) -> bool:
    """A causal draft's numpy model on normal inputs of each size S: its masks against the dense
    causal mask for every (kt, qt, g) (check_causal_mask_claims), then its outputs against the
    float64 reference. True when every output is within tolerance at every size."""
    ok = True
    for S in sizes:
        check_causal_mask_claims(S, masks)
        q, k, v, o, do, lse = make_inputs(S, D, seed=S, outliers=False, causal=True)
        ref = reference(q, k, v, o, do, lse, causal=True)
        print(f"S={S} (mask claims asserted for every (kt, qt, g))")
        ok &= compare_all(model(q, k, v, o, do, lse), ref)
    return ok


class CausalSyncSim(BwdSyncSim):
    """BwdSyncSim with the causal trip counts: CTA kt streams query tiles 2kt .. n_q - 1
    (n_it = n_q - 2kt), producer and consumers alike, without wrap-around; at the end every copy
    the producer issued must have been consumed (one still landing after the consumers exit
    writes into freed shared memory). Extra bugs: "producer_n_q" (the producer runs the
    non-causal n_q tiles) and "consumer_extra" (a consumer runs one tile too many)."""

    def __init__(self, n_q: int, rng: random.Random, kt: int, bug: str = "") -> None:
        super().__init__(n_q, rng, bug)
        self.q_off = 2 * kt
        self.n_it = n_q - 2 * kt

    def next_tile(self, qt: int) -> int:
        return qt + 1

    def producer_trips(self) -> int:
        return self.n_q if self.bug == "producer_n_q" else self.n_it

    def consumer_trips(self) -> int:
        return self.n_it + (1 if self.bug == "consumer_extra" else 0)

    def check_end(self) -> None:
        consumed = len(self.PARTS) * self.n_it
        if self.issued != consumed or self.landed != consumed:
            self.errors.append(f"issued {self.issued} copies, consumed {consumed}")
        super().check_end()


def causal_sync_check(
    sim: type[CausalSyncSim], runs: int, n_qs: Iterable[int], repeats: int, bugs: Iterable[str]
) -> bool:
    """The causal drafts' synchronisation check: ``runs`` random interleavings of a random
    (n_q, kt), then every (n_q, kt) of ``n_qs`` (even: S % 128 == 0) ``repeats`` times so that no
    trip count is left to chance, then each deliberate bug of ``bugs`` must be caught in some of
    ``runs`` runs. Prints the counts; True when every run was clean and every bug caught."""
    n_qs = tuple(n_qs)

    def pick(rng: random.Random) -> tuple[int, int]:
        n_q = rng.choice(n_qs)
        return n_q, rng.randrange(n_q // 2)

    def cases() -> Iterator[tuple[str, BwdSyncSim]]:
        for r in range(runs):
            rng = random.Random(r)
            n_q, kt = pick(rng)
            yield f"run {r} (n_q {n_q}, kt {kt})", sim(n_q, rng, kt)
        for n_q in n_qs:
            for kt in range(n_q // 2):
                for r in range(repeats):
                    rng = random.Random(1000 * n_q + 10 * kt + r)
                    yield f"n_q {n_q} kt {kt} run {r}", sim(n_q, rng, kt)

    total, bad = count_failures(cases())
    print(f"{total - bad}/{total} random interleavings clean")

    def failed(bug: str, r: int) -> bool:
        rng = random.Random(r)
        n_q, kt = pick(rng)
        if bug == "producer_n_q" and kt == 0:
            kt = n_q // 2 - 1  # the mismatch needs kt > 0
        return not sim(n_q, rng, kt, bug).run()

    caught_all = negative_controls(tuple(bugs), runs, failed)
    return not bad and caught_all


def list_makespan(costs: Iterable[float], sms: int = 132, start: float = 1.0) -> float:
    """Greedy list scheduling of CTAs in launch order: each goes to the SM that frees first and
    occupies it for its cost plus `start`; returns the time the last SM finishes."""
    free = [0.0] * sms
    heapq.heapify(free)
    for c in costs:
        t = heapq.heappop(free)
        heapq.heappush(free, t + c + start)
    return max(free)


def causal_cta_order(n_kt: int, bh: int, group: int) -> list[int]:
    """kt of each CTA in launch order, blockIdx.x decoded exactly as the causal kernels do (groups
    of `group` heads, key tile slower than head inside a group); asserts that every (kt, head)
    occurs once."""
    out = []
    seen = set()
    for bid in range(n_kt * bh):
        grp = bid // (n_kt * group)
        gsize = min(group, bh - grp * group)
        in_grp = bid - grp * n_kt * group
        kt, head = in_grp // gsize, grp * group + in_grp % gsize
        assert 0 <= kt < n_kt and 0 <= head < bh and (kt, head) not in seen
        seen.add((kt, head))
        out.append(kt)
    assert len(seen) == n_kt * bh
    return out
