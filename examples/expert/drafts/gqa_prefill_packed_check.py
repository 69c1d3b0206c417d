"""Desk checks for the draft examples/expert/drafts/gqa_prefill_packed.cu (CPU only, numpy):
GQA heads packed into M (a 128-row tile = 32 tokens x the 4 query heads of one KV head) and
persistent CTAs with a dynamic (atomic counter) unit scheduler.

0. source constants: the constexprs the models use are read from the .cu (tile shape, stages,
   shared-memory layout and budget), and the C++ lines the models mirror occur verbatim.
1. plan / unit decomposition: the plan's counting sort over packed tiles (arbitrary order inside a
   bucket), the unit -> (item, KV head) map and the persistent hand-out (CTA c takes unit c, then
   gridDim.x + atomicAdd; CTAs race in random order): every (sequence, query token, query head)
   written exactly once, for the task's 5 workloads and odd cases; the host bound on the unit
   count holds; costs descending; n_mask in {1, 2}.
2. mask register mapping: the per-register test `8jj + e > off + tok - 2q` (row R) and
   `> off + tok - 2q + 2` (row R + 8) equals the per-row rule `col > off + R / 4` for all 256
   consumer threads x 64 registers (contracts §2 via deskcheck.acc_coord); both rows of a thread
   have the same head.
3. numpy model of exactly the packed tiling and order (downward K/V tiles, mask on the first
   n_mask processed tiles only, FA2 Check_inf, base-2 online softmax, P V of the previous block,
   bf16 P, LSE = (m + log2 l) ln2), with garbage rows (the next sequence's tokens, zero fill past
   the end) and garbage keys, against a dense bottom-right causal GQA reference; plus the claim
   that processed tiles after the first n_mask need no mask for any valid row.
4. barrier model of one persistent CTA: producer (with the unit slot, asynchronous TMA actors) and
   2 consumers over several units of different n_kv, random interleavings: no deadlock, the
   named ping-pong barriers (primed once, consumer 0's final sync) balanced with no double
   arrival, every consumed K/V stage holds the expected (unit, tile), Q holds the expected unit
   at every S GEMM, no TMA overwrites a buffer a consumer still reads, the slot holds the
   expected unit when read. Negative controls must be caught.
5. the packed Q TMA box {64, 4, 32}: its smem image (box order d, head, token; 128B swizzle) read
   through the kernel's K-major Q descriptors gives consumer g row m = (token (64g+m)/4, head
   (64g+m)%4) for all 8 k-steps (desc_check.py's model).
6. schedule model (list scheduling over 132 SMs, unit cost n_kv + a fixed overhead): static
   stride vs dynamic counter (and a static snake order for reference), with and without cost
   noise; the kernel's choice must match the model's; the packed tiling's work against the
   shipped 128-token tiling's.
Exits non-zero on any failure. Run: python3 examples/expert/drafts/gqa_prefill_packed_check.py
"""

from __future__ import annotations

import heapq
import math
import random
import sys
from pathlib import Path

import numpy as np
from deskcheck import (
    CheckError,
    MBar,
    NamedBarriers,
    acc_coord,
    assert_mirrored,
    bf16,
    constexprs,
    dc,
    interleave,
    make_desc128,
    negative_controls,
    online_softmax_block,
    require,
)

HERE = Path(__file__).resolve().parent
SRC_PATH = HERE / "gqa_prefill_packed.cu"
SRC = SRC_PATH.read_text()

NQH, NKVH, GROUP = 32, 8, 4
WORKLOADS = {
    "b4-s4096": ([4096] * 4, [4096] * 4),
    "b16-mixed": ([512, 4096, 1024, 3072, 2048, 1536, 3584, 2560] * 2,) * 2,
    "b2-s8192": ([8192] * 2, [8192] * 2),
    "b8-chunked": ([1024] * 8, [8192] * 8),
    "b128-short": ([250, 517, 768, 1030] * 32,) * 2,
    # odd cases: q_len 1, 5, 31..33, 129; d = 0, 1, 5, 127, 128, 195, 871
    "odd": (
        [1, 5, 128, 129, 300, 64, 1, 31, 32, 33, 0, 517],
        [1, 200, 128, 1000, 300, 191, 127, 31, 160, 161, 5, 645],
    ),
}


# ------------------------------------------------------------------------ 0. source constants


C = constexprs(SRC)
BM, BN, TOK = C["kBM"], C["kBN"], C["kTokPerTile"]
STAGES = C["kStages"]


def check_source() -> None:
    require((BM, BN, TOK, STAGES) == (128, 128, 32, 3), f"tile shape {BM, BN, TOK, STAGES}")
    require(C["kGroup"] == GROUP and C["kKvHeads"] == NKVH and C["kQoHeads"] == NQH, "heads")
    require(C["kOffSlot"] % 16 == 0, "slot alignment")
    require(C["kSmemBytes"] <= 232448, "shared memory budget")
    require(C["kSmemBytes"] == 7 * 32768 + 8 * (2 + 4 * STAGES) + 4 * 8 + 1024, "smem layout")
    assert_mirrored(
        SRC,
        [
            "const int i_max = min(kTokPerTile * t + kTokPerTile - 1, q_len - 1);",
            "return (i_max + (kv_len - q_len)) / kBN + 1;",
            "const int j_min = (kTokPerTile * t + dq_off + 1) / kBN;",
            "n_mask = max(1, n_kv - j_min);",
            "off_first = kTokPerTile * t + dq_off - kBN * (n_kv - 1);",
            "if (unit < num_units) it = items[unit >> 3];",
            "kvh = unit & 7;",
            "const int next = live ? static_cast<int>(gridDim.x) + atomicAdd(unit_counter, 1) : 0;",
            "(static_cast<long long>(total_q) + (kTokPerTile - 1LL) * batch_size) / kTokPerTile;",
            "const long long num_units_ll = max_items_ll * kKvHeads;",
            "const int n_t = (q_len + kTokPerTile - 1) / kTokPerTile;",
            "const unsigned grid = "
            "static_cast<unsigned>(num_units < num_sms ? num_units : num_sms);",
            "const int tok_t = static_cast<int>((64u * g + r0) / 4u);",
            "const int head_in_group = static_cast<int>(r0 % 4u);",
            "const int h = kGroup * kvh + head_in_group;",
            "const bool ok0 = tok0 < n_tok;",
            "const bool ok1 = tok1 < n_tok;",
            "__nv_bfloat16* o1 = o0 + 2 * tok_stride;",
            "if (j < n_mask) mask_tile(s_acc, tok_t, static_cast<int>(q), off_first + kBN * j);",
            "make_map(&tmQ, q, total_q, kQoHeads, kGroup, kTokPerTile)",
            "ptx::tma_load_3d(sQ, &tmQ, q_full, 0, kGroup * kvh, q_tok);",
        ],
        "source",
    )
    print(
        f"source ok: kBM {BM} = {TOK} tokens x {GROUP} heads, kBN {BN}, {STAGES} stages, "
        f"smem {C['kSmemBytes']} B (slot at {C['kOffSlot']})"
    )


# --------------------------------------------------------------------- 1. plan and units
def tile_n_kv(t: int, ql: int, kl: int) -> int:
    i_max = min(TOK * t + TOK - 1, ql - 1)
    return (i_max + kl - ql) // BN + 1


def n_mask_of(t: int, ql: int, kl: int) -> int:
    j_min = (TOK * t + kl - ql + 1) // BN
    return max(1, tile_n_kv(t, ql, kl) - j_min)


def plan(qls: list[int], kls: list[int], rng: random.Random, buckets: int = 1024):
    """The plan kernel: counting sort of all packed tiles by n_kv (descending)."""
    batch = len(qls)
    max_items = (sum(qls) + (TOK - 1) * batch) // TOK
    hist = [0] * buckets
    tiles = []
    for b in range(batch):
        for t in range((qls[b] + TOK - 1) // TOK):
            c = min(tile_n_kv(t, qls[b], kls[b]), buckets - 1)
            hist[c] += 1
            tiles.append((b, t, c))
    cursor, acc = [0] * buckets, 0
    for c in range(buckets - 1, -1, -1):
        cursor[c] = acc
        acc += hist[c]
    items = [(-1, 0)] * max_items
    rng.shuffle(tiles)  # atomics: arbitrary order inside a bucket
    for b, t, c in tiles:
        pos = cursor[c]
        cursor[c] += 1
        require(pos < max_items, "host bound on the item count violated")
        items[pos] = (b, t)
    require(cursor[0] == len(tiles), "cursor[0] is the tile count")
    return items, max_items


def hand_out(num_units: int, live: list[bool], nsm: int, rng: random.Random) -> list[list[int]]:
    """The persistent schedule: CTA c takes unit c, then grid + atomicAdd(counter, 1), in a random
    race between the CTAs; a CTA stops at its first dead unit. Returns each CTA's live units."""
    grid = min(num_units, nsm)
    counter = 0
    cur = list(range(grid))
    done_units: list[list[int]] = [[] for _ in range(grid)]
    active = set(range(grid))
    while active:
        cta = rng.choice(sorted(active))
        u = cur[cta]
        if not (u < num_units and live[u >> 3]):
            active.discard(cta)
            continue
        done_units[cta].append(u)
        cur[cta] = grid + counter
        counter += 1
        require(cur[cta] <= 2 * num_units, "hand-out index past the host's int bound")
    return done_units


ROW_TOK = np.arange(128) // GROUP  # packed tile row -> token in the tile
ROW_HEAD = np.arange(128) % GROUP  # packed tile row -> query head in the group


def check_plan() -> None:
    require(BM == TOK * GROUP and bool(np.all(ROW_HEAD < GROUP)), "packed rows")
    rng = random.Random(1)
    for name, (qls, kls) in WORKLOADS.items():
        items, max_items = plan(qls, kls, rng)
        num_units = NKVH * max_items
        require(2 * num_units <= 0x7FFFFFFF, "unit bound")
        live = [it[0] >= 0 for it in items]
        n_live = sum(live)
        require(all(live[:n_live]) and not any(live[n_live:]), "dead items only at the end")
        costs = [tile_n_kv(t, qls[b], kls[b]) for b, t in items[:n_live]]
        require(costs == sorted(costs, reverse=True), "costs descending")
        per_cta = hand_out(num_units, live, 132, rng)
        units = [u for lst in per_cta for u in lst]
        require(sorted(units) == list(range(NKVH * n_live)), "every live unit exactly once")
        written = np.zeros((sum(qls), NQH), dtype=np.int32)
        qs = np.cumsum([0, *qls])
        for u in units:
            b, t = items[u >> 3]
            kvh = u & 7
            ql, kl = qls[b], kls[b]
            n_kv, nm = tile_n_kv(t, ql, kl), n_mask_of(t, ql, kl)
            require(1 <= nm <= 2 and nm <= n_kv, f"n_mask {nm} n_kv {n_kv}")
            n_tok = ql - TOK * t  # the slot's valid-token count
            keep = n_tok > ROW_TOK  # packed row r = (token 32t + r/4, head 4 kvh + r%4)
            np.add.at(written, (qs[b] + TOK * t + ROW_TOK[keep], GROUP * kvh + ROW_HEAD[keep]), 1)
        require(bool(np.all(written == 1)), f"{name}: some (token, head) not written exactly once")
        busy = sum(1 for lst in per_cta if lst)
        print(
            f"plan ok: {name}: {n_live} packed tiles of {max_items} slots, {NKVH * n_live} units "
            f"on {min(num_units, 132)} CTAs ({busy} with work)"
        )


# --------------------------------------------------------------------- 2. mask registers
MASK_LINES = [
    "const int lim0 = off + tok - 2 * q;",
    "const int lim1 = lim0 + 2;",
    "if (8 * jj + 0 > lim0) s_acc[4 * jj + 0] = kNegInf;",
    "if (8 * jj + 1 > lim0) s_acc[4 * jj + 1] = kNegInf;",
    "if (8 * jj + 0 > lim1) s_acc[4 * jj + 2] = kNegInf;",
    "if (8 * jj + 1 > lim1) s_acc[4 * jj + 3] = kNegInf;",
    "const uint32_t r0 = 16u * warp + lane / 4u;",
    "const uint32_t q = lane % 4u;",
]


def mask_mismatches(row8_step: int) -> int:
    """Registers (over 256 threads x 64 registers x off in [-300, 300)) where the kernel's test
    with lim1 = lim0 + row8_step differs from the per-row rule."""
    offs = np.arange(-300, 300)
    bad = 0
    for g in range(2):
        for tt in range(128):
            warp, lane = tt // 32, tt % 32
            r0, q = 16 * warp + lane // 4, lane % 4
            tok = (64 * g + r0) // 4
            lim0 = offs + tok - 2 * q
            lim1 = lim0 + row8_step
            for i in range(64):
                row, col = acc_coord(tt, i)  # contracts §2
                R = 64 * g + row
                require(r0 % 4 == R % 4, "both rows of a thread hold one head")
                want = col > offs + R // 4  # 128j + col > 32t + R/4 + d
                jj, hh, e = i // 4, (i % 4) // 2, i % 2
                got = 8 * jj + e > (lim1 if hh else lim0)
                bad += int(np.sum(want != got))
    return bad


def check_mask_mapping() -> None:
    assert_mirrored(SRC, MASK_LINES, "mask")
    require(mask_mismatches(2) == 0, "mask register mapping differs from the per-row rule")
    wrong = mask_mismatches(8)  # negative control: the shipped kernel's 128-token-row step
    require(wrong > 0, "negative control lim1 = lim0 + 8 not caught")
    print(
        "mask mapping ok: 256 threads x 64 registers, off in [-300, 300); negative control "
        f"lim1 = lim0 + 8: {wrong} mismatches"
    )


# --------------------------------------------------------------------- 3. numerics
STATS = {"units": 0, "n_mask 2": 0, "valid rows fully masked in a tile": 0, "garbage rows": 0}


def model_unit(Q, K, V, q_start, ql, k_start, kl, t, kvh, c, d_head):
    """The consumers' math for one packed unit; returns O and LSE of its valid rows as
    {(token, head): (o, lse)}."""
    d = kl - ql
    n_kv = tile_n_kv(t, ql, kl)
    n_mask = n_mask_of(t, ql, kl)
    off_first = TOK * t + d - BN * (n_kv - 1)
    rows = np.arange(BM)
    toks = rows // GROUP  # token within the tile
    heads = GROUP * kvh + rows % GROUP
    # packed Q box: row r = token q_start + 32t + r/4 (next sequence / zero fill past the end)
    Qt = Q[q_start + TOK * t + toks, heads]  # [128, D]
    cols = np.arange(BN)[None, :]
    m = np.full(BM, -np.inf)
    row_sum = np.zeros(BM)
    o = np.zeros((BM, d_head))
    sc = np.ones(BM)
    pending = None
    valid = (toks < ql - TOK * t)[:, None]
    STATS["units"] += 1
    STATS["n_mask 2"] += n_mask == 2
    STATS["garbage rows"] += int(BM - valid.sum())
    for jb in range(n_kv):
        j = n_kv - 1 - jb
        Kt = K[k_start + BN * j : k_start + BN * j + BN, kvh]
        Vt = V[k_start + BN * j : k_start + BN * j + BN, kvh]
        s = Qt @ Kt.T
        if jb > 0:
            o = o * sc[:, None] + bf16(pending[0]) @ pending[1]
        off = off_first + BN * jb
        require(off == TOK * t + d - BN * j, "mask offset")
        masked = cols > off + toks[:, None]
        if jb < n_mask:
            s = np.where(masked, -np.inf, s)
            dead = masked.all(axis=1) & valid[:, 0]
            STATS["valid rows fully masked in a tile"] += int(np.sum(dead))
        else:
            require(not np.any(masked & valid), "a tile after the first n_mask needs the mask")
        p, sc, m, row_sum = online_softmax_block(s, c, m, row_sum, sc, first=jb == 0)
        pending = (p, Vt)
    o = o * sc[:, None] + bf16(pending[0]) @ pending[1]
    out = {}
    for r in range(BM):
        if toks[r] < ql - TOK * t:
            require(row_sum[r] >= 1.0 - 1e-12, "l >= 1")
            out[(TOK * t + toks[r], heads[r])] = (
                o[r] / row_sum[r],
                (m[r] + math.log2(row_sum[r])) * math.log(2),
            )
    return out


def check_numerics() -> None:
    rng = np.random.default_rng(0)
    nkvh = 2  # the model's KV heads (8 query heads); the math does not depend on it
    cases = [
        ([1, 5, 130, 33, 77], [1, 200, 300, 33, 77]),
        ([128, 129, 31, 32], [128, 1000, 31, 160]),
        ([64, 200], [191, 327]),
        ([250, 517], [250, 517]),
        ([256], [256 + 7 * 128 + 5]),
        ([1, 1, 2], [129, 5, 130]),
    ]
    D = 32
    scale = 1 / math.sqrt(128)
    c = scale * math.log2(math.e)
    for qls, kls in cases:
        tq, tk = sum(qls), sum(kls)
        Q = bf16(rng.normal(0, 2, (tq + TOK, GROUP * nkvh, D)))  # + TOK: zero fill past the end
        K = bf16(rng.normal(0, 2, (tk + BN, nkvh, D)))
        V = bf16(rng.normal(0, 1, (tk + BN, nkvh, D)))
        Q[tq:] = 0
        K[tk:] = 0
        V[tk:] = 0
        qs, ks = np.cumsum([0, *qls]), np.cumsum([0, *kls])
        err_o = err_l = 0.0
        count = 0
        for b in range(len(qls)):
            ql, kl = qls[b], kls[b]
            got = {}
            for t in range((ql + TOK - 1) // TOK):
                for kvh in range(nkvh):
                    part = model_unit(Q, K, V, qs[b], ql, ks[b], kl, t, kvh, c, D)
                    require(not set(part) & set(got), "row written twice")
                    got.update(part)
            require(len(got) == ql * GROUP * nkvh, "every (token, head) once")
            for h in range(GROUP * nkvh):
                qb = Q[qs[b] : qs[b] + ql, h]
                kb, vb = K[ks[b] : ks[b] + kl, h // GROUP], V[ks[b] : ks[b] + kl, h // GROUP]
                s = (qb @ kb.T) * scale
                s = np.where(np.arange(kl)[None, :] > np.arange(ql)[:, None] + kl - ql, -np.inf, s)
                mref = s.max(axis=1, keepdims=True)
                pr = np.exp(s - mref)
                lref = pr.sum(axis=1)
                oref = (pr @ vb) / lref[:, None]
                lseref = mref[:, 0] + np.log(lref)
                for i in range(ql):
                    o_i, l_i = got[(i, h)]
                    err_o = max(err_o, float(np.abs(o_i - oref[i]).max()))
                    err_l = max(err_l, abs(l_i - lseref[i]))
                    count += 1
        # P is rounded to bf16 as in the kernel (dO ~ 1e-3); scores are fp32 (dLSE ~ 1e-6)
        require(err_o < 1e-2 and err_l < 1e-5, f"numerics {qls} {kls}: {err_o} {err_l}")
        print(
            f"numerics ok: q_lens {qls} kv_lens {kls}: {count} (token, head) rows, "
            f"max|dO| {err_o:.2e} max|dLSE| {err_l:.1e}"
        )
    require(all(v > 0 for v in STATS.values()), f"a case class went unexercised: {STATS}")
    print("numerics exercised: " + ", ".join(f"{k} {v}" for k, v in STATS.items()))


# --------------------------------------------------------------------- 4. barrier model
class Hazard(CheckError):
    pass


def run_cta(units: list[tuple[int, int]], seed: int, bug: str | None = None) -> None:
    """One persistent CTA over `units` [(unit id, n_kv)], then the sentinel."""
    rnd = random.Random(seed)
    q_full, q_empty = MBar(1), MBar(8)
    k_full = [MBar(1) for _ in range(STAGES)]
    k_empty = [MBar(8) for _ in range(STAGES)]
    v_full = [MBar(1) for _ in range(STAGES)]
    v_empty = [MBar(8) for _ in range(STAGES)]
    k_data, v_data = [None] * STAGES, [None] * STAGES
    q_data = [None]
    slot = [None]
    slot_reads = [0, 0]
    # who reads what right now (wgmma operands): ("Q",), ("K", s), ("V", s) -> set of consumers
    holders: dict[tuple, set[int]] = {}
    named = NamedBarriers()
    actors: list = []

    def hold(key, g):
        holders.setdefault(key, set()).add(g)

    def drop(key, g):
        holders[key].discard(g)

    def tma(bar: MBar, key: tuple, store, value):
        # asynchronous copy: lands some steps later, then signals complete_tx
        for _ in range(rnd.randrange(0, 6)):
            yield
        if holders.get(key):
            raise Hazard(f"TMA overwrote {key} while consumer(s) {holders[key]} read it")
        store(value)
        bar.complete_tx(1)

    def set_k(s):
        return lambda v: k_data.__setitem__(s, v)

    def set_v(s):
        return lambda v: v_data.__setitem__(s, v)

    def producer():
        kst = vst = kph = vph = 0
        for k, (u, n_kv) in enumerate([*units, (None, 0)]):
            if bug != "slot_before_q_empty":
                yield ("wait", q_empty, (k & 1) ^ 1)
                if slot_reads != [k, k]:
                    raise Hazard(f"slot {k} written before every consumer read slot {k - 1}")
            slot[0] = (u, n_kv)
            if bug == "slot_before_q_empty":
                yield ("wait", q_empty, (k & 1) ^ 1)
            if n_kv == 0:
                q_full.arrive()  # the sentinel: no TMA
                return
            q_full.arrive(expect_tx=1)
            actors.append(tma(q_full, ("Q",), lambda v: q_data.__setitem__(0, v), u))
            yield
            for i in range(n_kv):
                tile = n_kv - 1 - i
                if bug != "ring_no_wait":
                    yield ("wait", k_empty[kst], kph ^ 1)
                k_full[kst].arrive(expect_tx=1)
                actors.append(tma(k_full[kst], ("K", kst), set_k(kst), (u, tile)))
                kst += 1
                if kst == STAGES:
                    kst, kph = 0, kph ^ 1
                yield ("wait", v_empty[vst], vph ^ 1)
                v_full[vst].arrive(expect_tx=1)
                actors.append(tma(v_full[vst], ("V", vst), set_v(vst), (u, tile)))
                vst += 1
                if vst == STAGES:
                    vst, vph = 0, vph ^ 1
                yield

    def consumer(g):
        kst = vst = kph = vph = 0

        def warps(bar):
            for _ in range(4):
                bar.arrive()

        def s_gemm(u, tile):
            nonlocal kst, kph
            yield ("wait", k_full[kst], kph)
            yield from named.sync(1 + g, g, 2)
            if q_data[0] != u:
                raise Hazard(f"consumer {g}: Q holds {q_data[0]}, expected unit {u}")
            if k_data[kst] != (u, tile):
                raise Hazard(f"consumer {g}: K stage holds {k_data[kst]}, expected {(u, tile)}")
            hold(("K", kst), g)

        if g == 1:
            named.arrive(1, g, 2)  # priming, once per CTA
        for k in range(len(units) + 1):
            if bug == "per_unit_priming" and g == 1 and k > 0:
                named.arrive(1, g, 2)
            yield ("wait", q_full, k & 1)
            u, n_kv = slot[0]
            slot_reads[g] += 1
            want = units[k] if k < len(units) else (None, 0)
            if (u, n_kv) != want:
                raise Hazard(f"consumer {g}: slot holds {(u, n_kv)}, expected {want}")
            if n_kv == 0:
                break
            hold(("Q",), g)
            # prologue: S of tile n_kv-1
            yield from s_gemm(u, n_kv - 1)
            named.arrive(2 - g, g, 2)
            yield  # wgmma in flight
            drop(("K", kst), g)
            warps(k_empty[kst])
            if n_kv == 1 or bug == "q_empty_early":
                drop(("Q",), g)
                warps(q_empty)
            kst += 1
            if kst == STAGES:
                kst, kph = 0, kph ^ 1
            for j in range(1, n_kv):
                yield from s_gemm(u, n_kv - 1 - j)
                yield ("wait", v_full[vst], vph)
                if v_data[vst] != (u, n_kv - j):
                    raise Hazard(f"consumer {g}: V holds {v_data[vst]}, expected {(u, n_kv - j)}")
                hold(("V", vst), g)
                named.arrive(2 - g, g, 2)
                yield
                drop(("K", kst), g)
                warps(k_empty[kst])
                if j == n_kv - 1 and bug != "q_empty_early":
                    drop(("Q",), g)
                    warps(q_empty)
                kst += 1
                if kst == STAGES:
                    kst, kph = 0, kph ^ 1
                yield  # softmax; P V_{j-1} retires
                drop(("V", vst), g)
                warps(v_empty[vst])
                vst += 1
                if vst == STAGES:
                    vst, vph = 0, vph ^ 1
            yield ("wait", v_full[vst], vph)
            if v_data[vst] != (u, 0):
                raise Hazard(f"consumer {g}: V holds {v_data[vst]}, expected {(u, 0)}")
            hold(("V", vst), g)
            yield
            drop(("V", vst), g)
            warps(v_empty[vst])
            vst += 1
            if vst == STAGES:
                vst, vph = 0, vph ^ 1
            yield  # epilogue
        if g == 0 and bug != "no_final_sync":
            yield from named.sync(1, g, 2)

    actors += [producer(), consumer(0), consumer(1)]
    if not interleave(actors, rnd, max_steps=10**6):
        raise Hazard(f"deadlock: units {units}")
    if not named.balanced():
        raise Hazard("named barriers left unbalanced")


def random_units(rng: random.Random) -> list[tuple[int, int]]:
    return [(1000 + i, rng.randint(1, 6)) for i in range(rng.randint(0, 5))]


def check_barriers() -> None:
    rng = random.Random(7)
    runs = 0
    fixed = [[], [(5, 1)], [(5, 1), (6, 1), (7, 1)], [(5, 7), (6, 1), (7, 2), (8, 5)]]
    for units in fixed:
        for seed in range(40):
            run_cta(units, seed)
            runs += 1
    for seed in range(300):
        run_cta(random_units(rng), 1000 + seed)
        runs += 1
    print(
        f"barrier model ok: {runs} runs (0..5 units per CTA, n_kv 1..7, random interleavings, "
        f"asynchronous TMA)"
    )

    def failed(bug: str, r: int) -> bool:
        units = [(10, 2), (11, 1), (12, 3)] if r % 2 == 0 else random_units(random.Random(r))
        if not units:
            units = [(10, 1)]
        try:
            run_cta(units, 5000 + r, bug)
        except CheckError:
            return True
        return False

    require(
        negative_controls(
            [
                "slot_before_q_empty",
                "ring_no_wait",
                "q_empty_early",
                "per_unit_priming",
                "no_final_sync",
            ],
            40,
            failed,
        ),
        "a negative control went unnoticed",
    )


# --------------------------------------------------------------------- 5. packed Q box
def check_q_box() -> None:
    """The {64, 4, 32} box lands densely (d fastest, then head, then token), 128B-swizzled; the
    kernel's Q descriptors (make_desc_kmajor_sw128(sQ + g * 8192), + (kk/4) * 16 KB +
    (kk%4) * 32 B per k-step) must read row m of consumer g as (token (64g+m)/4, head
    (64g+m)%4)."""
    assert_mirrored(
        SRC,
        [
            "const uint64_t dq = ptx::make_desc_kmajor_sw128(sQ + g * 8192u);",
            "const uint32_t off = static_cast<uint32_t>(kk / 4) * kBoxBytes + "
            "static_cast<uint32_t>(kk % 4) * 32u;",
            "ptx::tma_load_3d(sQ + kBoxBytes, &tmQ, q_full, 64, kGroup * kvh, q_tok);",
        ],
        "Q box",
    )
    base, box_bytes = 3 * 1024, C["kBoxBytes"]
    smem: dict[int, tuple] = {}
    for half in range(2):  # d 0..63, 64..127
        for tok in range(TOK):
            for h in range(GROUP):
                for e in range(64):
                    lin = half * box_bytes + ((tok * GROUP + h) * 64 + e) * 2
                    smem[dc.swizzle(base + lin, 128)] = ("Q", tok, h, 64 * half + e)
    wrong = 0
    for g in range(2):
        dq = make_desc128(base + g * 8192, 16, 1024)
        for kk in range(8):
            a = dc.advance(dq, (kk // 4) * box_bytes + (kk % 4) * 32)
            for k in range(16):
                for m in range(64):
                    R = 64 * g + m
                    wrong += dc.read_kmajor(smem, a, m, k) != ("Q", R // 4, R % 4, 16 * kk + k)
    require(wrong == 0, f"packed Q box: {wrong} wrong element reads")
    print("packed Q box ok: 2 consumers x 8 k-steps x 64 rows x 16 k, rows = (token, head)")


# --------------------------------------------------------------------- 6. schedule model
def unit_costs(qls, kls):
    return sorted(
        (
            tile_n_kv(t, ql, kl)
            for ql, kl in zip(qls, kls, strict=True)
            for t in range((ql + TOK - 1) // TOK)
            for _ in range(NKVH)
        ),
        reverse=True,
    )


def makespans(costs, nsm=132):
    stride = [0.0] * nsm
    snake = [0.0] * nsm
    for u, x in enumerate(costs):
        stride[u % nsm] += x
        k, r = divmod(u, nsm)
        snake[r if k % 2 == 0 else nsm - 1 - r] += x
    heap = [0.0] * nsm
    for x in costs:  # list scheduling: the next unit to the first free CTA
        heapq.heappush(heap, heapq.heappop(heap) + x)
    ideal = sum(costs) / nsm
    return max(stride) / ideal, max(snake) / ideal, max(heap) / ideal


def shipped_makespan(qls, kls, nsm=132, start=1.2, head=0.4, hpc=4):
    """gqa_prefill_check.py's model of the shipped kernel (128-token tiles, 4 heads per CTA)."""
    lst = sorted(
        (
            ((min(128 * t + 127, ql - 1) + kl - ql) // 128 + 1)
            for ql, kl in zip(qls, kls, strict=True)
            for t in range((ql + 127) // 128)
            for _ in range(NKVH)
        ),
        reverse=True,
    )
    heap = [0.0] * nsm
    for cost in lst:
        heapq.heappush(heap, heapq.heappop(heap) + start + hpc * (head + cost))
    return max(heap), sum(hpc * c for c in lst)


def check_schedule() -> None:
    nsm, over, start = 132, 0.5, 1.2
    print(
        f"schedule model: {nsm} SMs, time unit = one 128x128 K/V tile for both consumers, unit "
        f"cost n_kv + {over} (+-10 % uniform noise in the noisy column); makespan / perfect split"
    )
    print("  workload       units  stride  snake  dynamic | noisy: stride  snake  dynamic")
    worst_gap = 0.0
    rng = random.Random(3)
    rows = []
    for name, (qls, kls) in WORKLOADS.items():
        if name == "odd":
            continue
        nk = unit_costs(qls, kls)
        costs = [x + over for x in nk]
        st, sn, dy = makespans(costs, nsm)
        noisy = [x * (1 + rng.uniform(-0.1, 0.1)) for x in costs]
        nst, nsn, ndy = makespans(noisy, nsm)
        worst_gap = max(worst_gap, st / dy - 1)
        print(
            f"  {name:<12} {len(nk):>7}  {st:.3f}  {sn:.3f}  {dy:.3f}   |        {nst:.3f}  "
            f"{nsn:.3f}  {ndy:.3f}"
        )
        # packed vs shipped: tensor work (128-row x 128-key blocks) and modelled time
        packed_work = sum(nk)
        sh_time, sh_work = shipped_makespan(qls, kls, nsm)
        grid = min(len(nk), nsm)
        heap = [start] * grid
        for x in costs:
            heapq.heappush(heap, heapq.heappop(heap) + x)
        rows.append((name, packed_work / sh_work, max(heap) / sh_time))
    choice = "dynamic" if worst_gap > 0.02 else "static stride"
    print(f"  static stride is up to {100 * worst_gap:.1f} % slower than dynamic -> {choice}")
    dynamic_in_src = "atomicAdd(unit_counter, 1)" in SRC
    require(dynamic_in_src == (choice == "dynamic"), "the kernel's schedule is not the model's")
    print("  packed + persistent vs the shipped kernel's tiling (kHeadsPerCta 4, its model's CTA")
    print("  start 1.2, head switch 0.4; here CTA start 1.2 once, unit switch 0.5):")
    for name, work, time in rows:
        print(f"    {name:<12} tensor work {work:.3f}x, modelled time {time:.3f}x")


def main() -> int:
    checks = [
        check_source,
        check_plan,
        check_mask_mapping,
        check_numerics,
        check_barriers,
        check_q_box,
        check_schedule,
    ]
    for check in checks:
        try:
            check()
        except (CheckError, AssertionError, FloatingPointError) as e:
            print(f"FAILED in {check.__name__}: {e}")
            return 1
    print("ALL CHECKS OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
