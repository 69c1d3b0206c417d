"""Desk checks for the non-persistent GQA prefill kernel (CPU only, numpy), which
examples/expert/gqa_prefill.cu held until 2026-12-03 (git history). Its plan, mask and tile
models (1-3) still hold for the persistent kernel that replaced it, whose schedule
gqa_prefill_persistent_check.py checks; 4 and 5 model the earlier CTA-per-item schedule. It stays
here because it imports this folder's deskcheck.py.

1. plan / work decomposition: the plan kernel's counting sort and the CTA -> (tile, heads) map,
   for the task's 5 workloads and odd cases: every (sequence, query row, query head) written
   exactly once, the host bound on the item count holds, costs sorted descending.
2. mask register mapping: the per-register test `8jj + e > off + row - 2q` equals
   `col - row > off` for all 256 consumer threads x 64 registers (contracts §2 layout).
3. numpy model of exactly the kernel's tiling and order (downward K/V tiles, mask on the first
   n_mask processed tiles only, FA2 Check_inf, base-2 online softmax, P V of the previous
   block, LSE = (m + log2 l) ln2), with garbage beyond the sequence (next sequence's rows and
   keys), against a dense bottom-right causal reference; plus the claim that tiles after the
   first n_mask need no mask for any valid row.
4. barrier model: producer + 2 consumers as generators over mbarriers (parity waits) and named
   barriers (ping-pong), random interleavings, several n_kv and heads per CTA: no deadlock, no
   double arrival on a named barrier generation, every consumed stage holds the expected tile,
   the Q buffer holds the expected head when read.
5. schedule model (list scheduling over 132 SMs) of the orders considered.
bf16, the mbarriers, the named barriers and the interleaving driver are deskcheck.py's.
Run: python3 examples/expert/drafts/gqa_prefill_check.py
"""

import heapq
import math
import random

import numpy as np
from deskcheck import MBar, NamedBarriers, bf16, interleave, online_softmax_block

BM = BN = 128
NQH, NKVH, GROUP = 32, 8, 4
WORKLOADS = {
    "b4-s4096": ([4096] * 4, [4096] * 4),
    "b16-mixed": ([512, 4096, 1024, 3072, 2048, 1536, 3584, 2560] * 2,) * 2,
    "b2-s8192": ([8192] * 2, [8192] * 2),
    "b8-chunked": ([1024] * 8, [8192] * 8),
    "b128-short": ([250, 517, 768, 1030] * 32,) * 2,
    # odd cases
    "odd": ([1, 5, 128, 129, 300, 64, 1], [1, 200, 128, 1000, 300, 191, 127]),
}


def tile_n_kv(t, ql, kl):
    i_max = min(BM * t + BM - 1, ql - 1)
    return (i_max + kl - ql) // BN + 1


def n_mask_of(t, ql, kl):
    n_kv = tile_n_kv(t, ql, kl)
    j_min = t + (kl - ql + 1) // BN
    return max(1, n_kv - j_min)


def plan(qls, kls, heads_per_cta, buckets=1024):
    batch = len(qls)
    max_items = (sum(qls) + 127 * batch) // BM
    hist = [0] * buckets
    tiles = []
    for b in range(batch):
        for t in range((qls[b] + BM - 1) // BM):
            c = min(tile_n_kv(t, qls[b], kls[b]), buckets - 1)
            hist[c] += 1
            tiles.append((b, t, c))
    cursor = [0] * buckets
    acc = 0
    for c in range(buckets - 1, -1, -1):  # descending exclusive scan
        cursor[c] = acc
        acc += hist[c]
    assert cursor[0] == len(tiles)
    items = [(-1, 0)] * max_items
    random.shuffle(tiles)  # atomics: arbitrary order inside a bucket
    for b, t, c in tiles:
        pos = cursor[c]
        cursor[c] += 1
        assert pos < max_items, "host bound violated"
        items[pos] = (b, t)
    assert cursor[0] == len(tiles)  # step 4 reads cursor[0]
    return items, max_items


def check_plan():
    for name, (qls, kls) in WORKLOADS.items():
        for hpc in (1, 2, 4):
            items, max_items = plan(qls, kls, hpc)
            G = GROUP // hpc
            per_item = NKVH * G
            written = {}
            costs = []
            for cta in range(max_items * per_item):
                item, sub = divmod(cta, per_item)
                b, t = items[item]
                if b < 0:
                    continue
                kvh, hg = divmod(sub, G)
                h0 = kvh * GROUP + hg * hpc
                if sub == 0:
                    costs.append(tile_n_kv(t, qls[b], kls[b]))
                for h in range(h0, h0 + hpc):
                    assert h // GROUP == kvh
                    for r in range(BM * t, min(BM * t + BM, qls[b])):
                        key = (b, r, h)
                        assert key not in written, key
                        written[key] = 1
            assert len(written) == sum(qls) * NQH, name
            assert costs == sorted(costs, reverse=True)
            # dead entries only at the end
            n_live = sum(1 for it in items if it[0] >= 0)
            assert all(it[0] >= 0 for it in items[:n_live])
        print(f"plan ok: {name}: {n_live} tiles of {max_items} slots")


def check_mask_mapping():
    for off in range(-300, 300):
        for g in range(2):
            for warp in range(4):
                for lane in range(32):
                    r0, q = 16 * warp + lane // 4, lane % 4
                    row_t = 64 * g + r0
                    lim0 = off + row_t - 2 * q
                    lim1 = lim0 + 8
                    for jj in range(16):
                        for e in range(2):
                            col = 8 * jj + 2 * q + e
                            assert (8 * jj + e > lim0) == (col - row_t > off)
                            assert (8 * jj + e > lim1) == (col - (row_t + 8) > off)
    print("mask mapping ok")


def model_tile(Qall, Kall, Vall, q_start, ql, k_start, kl, t, c):
    """Kernel's consumer math for one (tile, head); returns O rows, LSE rows (valid rows only)."""
    d = kl - ql
    n_kv = tile_n_kv(t, ql, kl)
    j_min = t + (d + 1) // BN
    n_mask = max(1, n_kv - j_min)
    Q = Qall[q_start + BM * t : q_start + BM * t + BM]  # garbage rows past the sequence
    rows = np.arange(BM)[:, None]
    cols = np.arange(BN)[None, :]
    m = np.full(BM, -np.inf)
    row_sum = np.zeros(BM)
    o = np.zeros((BM, Vall.shape[1]))
    sc = np.ones(BM)
    pending = None
    for jb in range(n_kv):
        j = n_kv - 1 - jb
        K = Kall[k_start + BN * j : k_start + BN * j + BN]
        V = Vall[k_start + BN * j : k_start + BN * j + BN]
        s = Q @ K.T  # G_S(jb)
        if jb > 0:
            # kernel order: O *= sc (factor of block jb-1), then O += P_{jb-1} V_{jb-1} (G_PV)
            o = o * sc[:, None] + bf16(pending[0]) @ pending[1]
        off = BN * (t - j) + d
        if jb < n_mask:
            s = np.where(cols - rows > off, -np.inf, s)
        else:  # claim: no valid row would be masked here
            valid = rows < ql
            assert not np.any((cols - rows > off) & valid)
        p, sc, m, row_sum = online_softmax_block(s, c, m, row_sum, sc, first=jb == 0)
        pending = (p, V)
    # tail: O *= sc (last block's factor; 1 if n_kv == 1), O += P_last V_last
    o = o * sc[:, None] + bf16(pending[0]) @ pending[1]
    nv = min(BM, ql - BM * t)
    assert np.all(row_sum[:nv] >= 1.0 - 1e-12)
    out = o[:nv] / row_sum[:nv, None]
    lse = (m[:nv] + np.log2(row_sum[:nv])) * math.log(2)
    return out, lse


def check_numerics():
    rng = np.random.default_rng(0)
    cases = [
        ([1, 5, 130, 256, 77], [1, 200, 300, 256, 77]),
        ([128, 129, 300], [128, 1000, 445]),
        ([64, 200], [191, 327]),
        ([250, 517], [250, 517]),
        ([1024], [1024 + 7 * 128 + 5]),
    ]
    D = 32  # the math does not depend on D; a small D keeps the model fast
    scale = 1 / math.sqrt(128)
    c = scale * math.log2(math.e)
    for qls, kls in cases:
        tq, tk = sum(qls), sum(kls)
        Q = bf16(rng.normal(0, 2, (tq + BM, D)))  # + BM: rows past the end (TMA zero fill)
        K = bf16(rng.normal(0, 2, (tk + BN, D)))
        V = bf16(rng.normal(0, 1, (tk + BN, D)))
        Q[tq:] = 0
        K[tk:] = 0
        V[tk:] = 0
        qs = np.cumsum([0, *qls])
        ks = np.cumsum([0, *kls])
        err_o = err_l = 0.0
        for b in range(len(qls)):
            ql, kl = qls[b], kls[b]
            qb, kb, vb = Q[qs[b] : qs[b] + ql], K[ks[b] : ks[b] + kl], V[ks[b] : ks[b] + kl]
            s = (qb @ kb.T) * scale
            mask = np.arange(kl)[None, :] > np.arange(ql)[:, None] + (kl - ql)
            s = np.where(mask, -np.inf, s)
            mref = s.max(axis=1, keepdims=True)
            pr = np.exp(s - mref)
            lref = pr.sum(axis=1)
            oref = (pr @ vb) / lref[:, None]
            lseref = mref[:, 0] + np.log(lref)
            for t in range((ql + BM - 1) // BM):
                out, lse = model_tile(Q, K, V, qs[b], ql, ks[b], kl, t, c)
                r = slice(BM * t, BM * t + out.shape[0])
                err_o = max(err_o, np.abs(out - oref[r]).max())
                err_l = max(err_l, np.abs(lse - lseref[r]).max())
        # P is rounded to bf16 as in the kernel (dO ~ 1e-3); scores are fp32 (dLSE ~ 1e-6)
        assert err_o < 1e-2 and err_l < 1e-5, (err_o, err_l)
        print(f"numerics ok: q_lens {qls} kv_lens {kls}: max|dO| {err_o:.2e} max|dLSE| {err_l:.1e}")


# ------------------------------------------------------------------------- 4. barrier model
def run_model(n_kv, hpc, stages=3, seed=0):
    rnd = random.Random(seed)
    q_full, q_empty = MBar(1), MBar(8)
    k_full = [MBar(1) for _ in range(stages)]
    k_empty = [MBar(8) for _ in range(stages)]
    v_full = [MBar(1) for _ in range(stages)]
    v_empty = [MBar(8) for _ in range(stages)]
    k_data, v_data = [None] * stages, [None] * stages
    q_data = [None]
    named = NamedBarriers()  # two members (the consumers) per barrier; a double arrival raises

    def nb_arrive(bid, who):
        named.arrive(bid, who, 2)

    def producer():
        kst = vst = 0
        kph = vph = 0
        for hi in range(hpc):
            while not q_empty.passes((hi & 1) ^ 1):
                yield
            q_data[0] = hi
            q_full.arrive()
            for i in range(n_kv):
                tile = n_kv - 1 - i
                while not k_empty[kst].passes(kph ^ 1):
                    yield
                k_data[kst] = (hi, tile)  # the model tags loads by head to check order
                k_full[kst].arrive()
                kst += 1
                if kst == stages:
                    kst, kph = 0, kph ^ 1
                while not v_empty[vst].passes(vph ^ 1):
                    yield
                v_data[vst] = (hi, tile)
                v_full[vst].arrive()
                vst += 1
                if vst == stages:
                    vst, vph = 0, vph ^ 1
                yield

    def consumer(g):
        kst = vst = 0
        kph = vph = 0

        def sync(bid):
            return named.sync(bid, g, 2)

        def arrive_warps(bar):
            for _ in range(4):
                bar.arrive()

        for hi in range(hpc):
            if g == 1:
                nb_arrive(1, g)
            while not q_full.passes(hi & 1):
                yield
            while not k_full[kst].passes(kph):
                yield
            yield from sync(1 + g)
            assert q_data[0] == hi and k_data[kst] == (hi, n_kv - 1)
            if not (g == 1 and n_kv == 1):
                nb_arrive(2 - g, g)
            yield
            arrive_warps(k_empty[kst])
            if n_kv == 1:
                arrive_warps(q_empty)
            kst += 1
            if kst == stages:
                kst, kph = 0, kph ^ 1
            for j in range(1, n_kv):
                while not k_full[kst].passes(kph):
                    yield
                yield from sync(1 + g)
                assert q_data[0] == hi and k_data[kst] == (hi, n_kv - 1 - j)
                while not v_full[vst].passes(vph):
                    yield
                assert v_data[vst] == (hi, n_kv - j)
                if not (g == 1 and j == n_kv - 1):
                    nb_arrive(2 - g, g)
                yield
                arrive_warps(k_empty[kst])
                if j == n_kv - 1:
                    arrive_warps(q_empty)
                kst += 1
                if kst == stages:
                    kst, kph = 0, kph ^ 1
                yield
                arrive_warps(v_empty[vst])
                vst += 1
                if vst == stages:
                    vst, vph = 0, vph ^ 1
            while not v_full[vst].passes(vph):
                yield
            assert v_data[vst] == (hi, 0)
            yield
            arrive_warps(v_empty[vst])
            vst += 1
            if vst == stages:
                vst, vph = 0, vph ^ 1

    agents = [producer(), consumer(0), consumer(1)]
    assert interleave(agents, rnd, max_steps=10**6), f"deadlock n_kv={n_kv} hpc={hpc}"
    assert named.balanced(), "unbalanced named barriers"


def check_barriers():
    for hpc in (1, 2, 4):
        for n_kv in (1, 2, 3, 4, 5, 7):
            for seed in range(30):
                run_model(n_kv, hpc, seed=seed)
    print("barrier model ok: n_kv 1..7, heads per CTA 1/2/4, 30 interleavings each")


def check_schedule():
    def tiles(ql, kl):
        return [tile_n_kv(t, ql, kl) for t in range((ql + BM - 1) // BM)]

    def sim(items, a=1.2, b=0.4, nsm=132):
        heap = [0.0] * nsm
        for nh, cost in items:
            heapq.heappush(heap, heapq.heappop(heap) + a + nh * (b + cost))
        return max(heap)

    print(
        "schedule model (time unit = one 128x128 K/V tile for both consumers; CTA start 1.2,"
        " head switch 0.4): makespan / perfect split"
    )
    for name, (qls, kls) in WORKLOADS.items():
        if name == "odd":
            continue
        out = []
        for hpc in (1, 2, 4):
            lst = [
                (hpc, c)
                for s in range(len(qls))
                for c in tiles(qls[s], kls[s])
                for _ in range(NKVH * GROUP // hpc)
            ]
            ideal = sum(nh * c for nh, c in lst) / 132
            lpt = sim(sorted(lst, key=lambda x: -x[1]))
            out.append(f"hpc{hpc} {lpt / ideal:.3f}")
        print(f"  {name}: " + ", ".join(out))


if __name__ == "__main__":
    random.seed(1)
    check_plan()
    check_mask_mapping()
    check_numerics()
    check_barriers()
    check_schedule()
