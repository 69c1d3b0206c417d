"""Randomised interleaving model of mha_bwd_causal_d128.cu's synchronisation (CPU only).

``python examples/expert/drafts/bwd_causal_sync_sim.py [runs]``

Copied from bwd_sync_sim.py (the non-causal d128 draft's simulation, left untouched). What the
causal kernel changes here is the trip count: CTA kt streams query tiles 2kt .. n_q - 1, i.e.
n_it = n_q - 2kt >= 2 tiles (producer and both consumers), without wrap-around, so the ring
phases end at a different place per CTA. The runs cover every kt of n_q = 2 .. 12 (n_it 2 .. 12,
odd and even, fewer and more tiles than stages) and check that each stage read holds tile
2kt + it. Negative controls add a producer/consumer trip-count mismatch (the producer running
the non-causal n_q tiles: the consumers exit with a copy in flight into freed smem, caught as a
copy nobody consumed, and a consumer running one tile too many: deadlock).

A second part is the CTA-order model behind kHeadGroup: greedy list scheduling of the CTAs in
launch order on 132 SMs (cost of CTA kt = n_q - 2kt tile-times plus a start cost of 1), for the
d128 draft's order (key tile fastest), key tile slowest, and the kernel's head groups.

Actors, each a list of steps executed in program order, one step at a time in a random global
interleaving (a step that cannot proceed, a wait, blocks its actor):
* the producer thread: kv_full arrive_expect_tx + 4 TMA loads; per query tile: wait q_empty[st]
  (parity ph ^ 1), arrive_expect_tx(q_full[st]), 6 copies (4 TMA boxes, LSE, Dr);
* every async copy is its own actor: it lands later, at a random moment, writing its bytes into
  the stage and signalling complete_tx;
* the two consumer warpgroups, with their 4 warps' q_empty arrivals as separate steps, and their
  wgmma groups modelled as "reads the stage / the dS^T buffer from issue until the wait that
  retires it";
* named barriers (kDsBar over 256 threads = both warpgroups; kStageBar + g over 128 threads) as
  rendezvous points, and mbarriers with the PTX phase rule: a phase completes when its pending
  arrivals and tx bytes reach 0, and try_wait.parity(P) passes iff the current phase's parity
  differs from P.

Checked on every run: no deadlock; every consumer read of a Q/dO/LSE/Dr stage sees the complete
tile it expects (no stale or partial data); no copy lands in a stage that a consumer warpgroup is
still reading; no dS^T half is rewritten while either warpgroup's G5 may read it; G5 reads both
halves of the current iteration; the tx counts match the bytes.
"""

from __future__ import annotations

import heapq
import random
import sys

STAGES = 2
Q_TX = 2 * 16384 + 2 * 256


class MBar:
    def __init__(self, count: int) -> None:
        self.count = count
        self.pending = count
        self.tx = 0
        self.phase = 0  # completed phases

    def _maybe_complete(self) -> None:
        if self.pending == 0 and self.tx == 0:
            self.phase += 1
            self.pending = self.count

    def arrive(self, expect_tx: int = 0) -> None:
        assert self.pending > 0
        self.tx += expect_tx
        self.pending -= 1
        self._maybe_complete()

    def complete_tx(self, nbytes: int) -> None:
        self.tx -= nbytes
        self._maybe_complete()

    def passes(self, parity: int) -> bool:
        return (self.phase & 1) != parity


class Sim:
    def __init__(self, n_q: int, rng: random.Random, kt: int, bug: str = "") -> None:
        self.rng = rng
        self.bug = bug
        self.n_q = n_q
        self.q_off = 2 * kt  # causal: first query tile
        self.n_it = n_q - 2 * kt  # causal: trip count (>= 2)
        self.landed = 0
        self.issued = 0
        self.kv_full = MBar(1)
        self.q_full = [MBar(1) for _ in range(STAGES)]
        self.q_empty = [MBar(8) for _ in range(STAGES)]
        # stage contents: per stage, set of (part, tile) landed since the last refill
        self.stage = [dict() for _ in range(STAGES)]
        self.readers = [set() for _ in range(STAGES)]  # warpgroups reading stage s
        self.ds = [[None, None] for _ in range(2)]  # ds[buf][half] = iteration written
        self.ds_readers = [set(), set()]  # warpgroups whose G5 may read buf
        self.kv_loaded = 0
        self.bar_wait: dict[str, set] = {}
        self.bar_gen: dict[str, int] = {}
        self.actors: list = []
        self.errors: list[str] = []

    # ---- named barriers: a rendezvous of `members`, generation-counted ----
    def bar_sync(self, name: str, me, members: int):
        gen = self.bar_gen.get(name, 0)
        self.bar_wait.setdefault(name, set()).add(me)
        if len(self.bar_wait[name]) == members:
            self.bar_gen[name] = gen + 1
            self.bar_wait[name] = set()
        while self.bar_gen.get(name, 0) == gen:
            yield False
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
        self.kv_full.complete_tx(16384)
        yield True

    def producer(self):
        self.kv_full.arrive(4 * 16384)
        for _ in range(4):
            self.actors.append(self.kv_copy())
        yield True
        st, ph, qt = 0, 0, self.q_off
        for _ in range(self.n_q if self.bug == "producer_n_q" else self.n_it):
            while not self.q_empty[st].passes(ph if self.bug == "parity" else ph ^ 1):
                yield False
            self.q_full[st].arrive(Q_TX)
            for part, nb in (
                ("Q0", 8192),
                ("Q1", 8192),
                ("dO0", 8192),
                ("dO1", 8192),
                ("LSE", 256),
                ("Dr", 256),
            ):
                self.actors.append(self.copy(st, part, qt, nb, self.q_full[st]))
            yield True
            st, ph = (st + 1, ph) if st + 1 < STAGES else (0, ph ^ 1)
            qt = qt + 1  # causal: no wrap

    def consumer(self, g: int):
        while not self.kv_full.passes(0):
            yield False
        if self.kv_loaded != 4:
            self.errors.append("kv_full passed before K/V landed")
        st, ph, qt = 0, 0, self.q_off
        for it in range(self.n_it + (1 if self.bug == "consumer_extra" else 0)):
            buf = 0 if self.bug == "one_ds_buffer" else it & 1
            while not self.q_full[st].passes(ph):
                yield False
            got = self.stage[st]
            if any(got.get(p) != qt for p in ("Q0", "Q1", "dO0", "dO1", "LSE", "Dr")):
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
            yield from self.bar_sync("ds", g, 2)
            # G5 issued: reads both halves of buf
            if self.ds[buf] != [it, it]:
                self.errors.append(f"WG{g} it {it}: G5 sees dS^T halves {self.ds[buf]}")
            self.ds_readers[buf].add(g)
            yield True
            # wait<1>: G3, G4 retired -> stage released by the 4 warps (separate steps)
            self.readers[st].discard(g)
            for _w in range(4 if self.bug != "early_release" else 0):
                self.q_empty[st].arrive()
                yield True
            st, ph = (st + 1, ph) if st + 1 < STAGES else (0, ph ^ 1)
            # wait<0>: G5 retired
            yield True
            if self.ds[buf] != [it, it]:
                self.errors.append(f"WG{g} it {it}: dS^T changed under G5: {self.ds[buf]}")
            self.ds_readers[buf].discard(g)
            # staging barriers (own warpgroup only: a 1-member rendezvous here)
            yield from self.bar_sync(f"stage{g}", g, 1)
            yield from self.bar_sync(f"stage{g}", g, 1)
            qt = qt + 1  # causal: no wrap

    def run(self) -> bool:
        self.actors = [self.producer(), self.consumer(0), self.consumer(1)]
        done = set()
        stall = 0
        while len(done) < len(self.actors):
            live = [a for a in self.actors if id(a) not in done]
            a = self.rng.choice(live)
            try:
                progressed = next(a)
            except StopIteration:
                done.add(id(a))
                progressed = True
            stall = 0 if progressed else stall + 1
            if stall > 20000:
                self.errors.append("deadlock")
                return False
        # Every copy the producer issued must have been consumed by the kernel's end (a copy
        # still landing after the consumers exit writes into freed shared memory).
        consumed = 6 * self.n_it
        if self.issued != consumed or self.landed != consumed:
            self.errors.append(f"issued {self.issued} copies, consumed {consumed}")
        for b in self.q_full + self.q_empty:
            if b.tx != 0:
                self.errors.append("tx bytes left on a barrier")
        return not self.errors


def pick(rng: random.Random) -> tuple[int, int]:
    """n_q (even: S % 128 == 0) and a key tile kt < n_q / 2."""
    n_q = rng.choice([2, 4, 6, 8, 10, 12])
    return n_q, rng.randrange(n_q // 2)


def makespan(costs: list[float], sms: int = 132, start: float = 1.0) -> float:
    free = [0.0] * sms
    heapq.heapify(free)
    for c in costs:
        t = heapq.heappop(free)
        heapq.heappush(free, t + c + start)
    return max(free)


def kernel_order(n_kt: int, bh: int, group: int) -> list[int]:
    """kt of each CTA in launch order, decoded exactly as the kernel decodes blockIdx.x."""
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


def schedule_model() -> bool:
    ok = True
    print("CTA order model: makespan / perfect split (132 SMs, start cost 1 tile-time)")
    for b, h, s in ((4, 16, 4096), (2, 16, 4096), (4, 16, 2048), (1, 12, 8192), (3, 5, 1024)):
        n_q, n_kt, bh = s // 64, s // 128, b * h
        cost = [n_q - 2 * kt for kt in range(n_kt)]
        ideal = sum(c + 1.0 for c in cost) * bh / 132
        rows = {
            "d128 order (kt fastest)": [cost[kt] for _ in range(bh) for kt in range(n_kt)],
            "kt slowest": [cost[kt] for kt in range(n_kt) for _ in range(bh)],
        }
        for grp in (2, 4, 8):
            rows[f"head groups of {grp}"] = [cost[kt] for kt in kernel_order(n_kt, bh, grp)]
        line = ", ".join(f"{k} {max(makespan(v), ideal) / ideal:.3f}" for k, v in rows.items())
        print(f"  B={b} H={h} S={s}: {line}")
        ok &= makespan(rows["head groups of 4"]) <= makespan(rows["d128 order (kt fastest)"])
    return ok


def main(argv: list[str]) -> int:
    runs = int(argv[0]) if argv else 300
    bad = 0
    for r in range(runs):
        rng = random.Random(r)
        n_q, kt = pick(rng)
        sim = Sim(n_q, rng, kt)
        if not sim.run():
            bad += 1
            if bad <= 3:
                print(f"run {r} (n_q {n_q}, kt {kt}): {sim.errors[:3]}")
    # Every (n_q, kt) pair, 5 runs each, so no trip count is left to chance.
    exhaustive = 0
    for n_q in (2, 4, 6, 8, 10, 12):
        for kt in range(n_q // 2):
            for r in range(5):
                sim = Sim(n_q, random.Random(1000 * n_q + 10 * kt + r), kt)
                exhaustive += 1
                if not sim.run():
                    bad += 1
                    if bad <= 3:
                        print(f"n_q {n_q} kt {kt} run {r}: {sim.errors[:3]}")
    print(f"{runs + exhaustive - bad}/{runs + exhaustive} random interleavings clean")
    # Negative controls: each deliberate bug must be caught in some run.
    caught_all = True
    for bug in ("one_ds_buffer", "early_release", "parity", "producer_n_q", "consumer_extra"):
        caught = 0
        for r in range(runs):
            rng = random.Random(r)
            n_q, kt = pick(rng)
            if bug == "producer_n_q" and kt == 0:
                kt = n_q // 2 - 1  # the mismatch needs kt > 0
            sim = Sim(n_q, rng, kt, bug)
            caught += not sim.run()
        print(f"negative control {bug}: caught in {caught}/{runs} runs")
        caught_all &= caught > 0
    sched_ok = schedule_model()
    return 1 if bad or not caught_all or not sched_ok else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
