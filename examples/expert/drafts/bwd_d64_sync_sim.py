"""Randomised interleaving model of mha_bwd_d64.cu's synchronisation (CPU only).

``python examples/expert/drafts/bwd_d64_sync_sim.py [runs]``

Copied from bwd_sync_sim.py (the d128 draft's simulation, left untouched) and changed where the
d64 kernel changes:
* kStages is read from mha_bwd_d64.cu (4); a stage is 4 copies (Q and dO one 8 KB box each, LSE,
  Dr), kv_full 2 boxes of 16 KB;
* G5 and the dQ staging/reduce run only in warpgroup it & 1; only that warpgroup is a reader of
  the dS^T buffer, and only it passes its staging barriers; the other warpgroup waits for G3/G4
  (wait<0>) and releases the stage;
* named barriers are modelled as the hardware counts them (arrivals per generation, a
  generation completes at the expected count), so a warpgroup arriving twice in one generation
  is reported. Negative control "arrive_only": the non-G5 warpgroup only ARRIVES at the dS^T
  barrier (bar.arrive instead of bar.sync), which lets it run a tile ahead and arrive twice.

The d128 description follows and applies otherwise unchanged:

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

import pathlib
import random
import re
import sys

_SRC = (pathlib.Path(__file__).parent / "mha_bwd_d64.cu").read_text()
STAGES = int(re.search(r"constexpr int kStages = (\d+);", _SRC).group(1))
Q_TX = 2 * 8192 + 2 * 256
PARTS = (("Q", 8192), ("dO", 8192), ("LSE", 256), ("Dr", 256))


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
    def __init__(self, n_q: int, rng: random.Random, stagger_kt: int | None, bug: str = "") -> None:
        self.rng = rng
        self.bug = bug
        self.n_q = n_q
        self.q_off = (2 * stagger_kt) % n_q if stagger_kt is not None else 0
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

    # ---- named barriers: arrivals counted per generation, as the hardware counts them ----
    def _bar_arrive(self, name: str, me, members: int) -> int:
        gen = self.bar_gen.get(name, 0)
        arrived = self.bar_wait.setdefault(name, [])
        if me in arrived:
            self.errors.append(f"{me} arrived twice in generation {gen} of barrier {name}")
        arrived.append(me)
        if len(arrived) == members:
            self.bar_gen[name] = gen + 1
            self.bar_wait[name] = []
        return gen

    def bar_sync(self, name: str, me, members: int):
        gen = self._bar_arrive(name, me, members)
        while self.bar_gen.get(name, 0) == gen:
            yield False
        yield True

    def bar_arrive(self, name: str, me, members: int):
        self._bar_arrive(name, me, members)
        yield True

    def copy(self, s: int, part: str, tile: int, nbytes: int, bar: MBar):
        yield True  # issued; lands at a random later moment
        if self.readers[s]:
            self.errors.append(f"copy {part} of tile {tile} lands in stage {s} while read")
        self.stage[s][part] = tile
        bar.complete_tx(nbytes)
        yield True

    def kv_copy(self):
        yield True
        self.kv_loaded += 1
        self.kv_full.complete_tx(16384)
        yield True

    def producer(self):
        self.kv_full.arrive(2 * 16384)  # d64: K and V, one box each
        for _ in range(2):
            self.actors.append(self.kv_copy())
        yield True
        st, ph, qt = 0, 0, self.q_off
        for _ in range(self.n_q):
            while not self.q_empty[st].passes(ph if self.bug == "parity" else ph ^ 1):
                yield False
            self.q_full[st].arrive(Q_TX)
            for part, nb in PARTS:
                self.actors.append(self.copy(st, part, qt, nb, self.q_full[st]))
            yield True
            st, ph = (st + 1, ph) if st + 1 < STAGES else (0, ph ^ 1)
            qt = qt + 1 if qt + 1 < self.n_q else 0

    def consumer(self, g: int):
        while not self.kv_full.passes(0):
            yield False
        if self.kv_loaded != 2:
            self.errors.append("kv_full passed before K/V landed")
        st, ph, qt = 0, 0, self.q_off
        for it in range(self.n_q):
            buf = 0 if self.bug == "one_ds_buffer" else it & 1
            while not self.q_full[st].passes(ph):
                yield False
            got = self.stage[st]
            if any(got.get(p) != qt for p, _ in PARTS):
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
            do_dq = (it & 1) == g  # d64: the G5 warpgroup of this tile
            if not do_dq and self.bug == "arrive_only":
                yield from self.bar_arrive("ds", g, 2)
            else:
                yield from self.bar_sync("ds", g, 2)
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
            st, ph = (st + 1, ph) if st + 1 < STAGES else (0, ph ^ 1)
            if do_dq:
                # wait<0>: G5 retired
                yield True
                if self.ds[buf] != [it, it]:
                    self.errors.append(f"WG{g} it {it}: dS^T changed under G5: {self.ds[buf]}")
                self.ds_readers[buf].discard(g)
                # staging barriers (own warpgroup only: a 1-member rendezvous here)
                yield from self.bar_sync(f"stage{g}", g, 1)
                yield from self.bar_sync(f"stage{g}", g, 1)
            qt = qt + 1 if qt + 1 < self.n_q else 0

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
        for b in self.q_full + self.q_empty:
            assert b.tx == 0
        return not self.errors


def main(argv: list[str]) -> int:
    runs = int(argv[0]) if argv else 300
    bad = 0
    for r in range(runs):
        rng = random.Random(r)
        n_q = rng.choice([2, 4, 6, 8, 10])  # S % 128 == 0: n_q even
        stagger = rng.choice([None, rng.randrange(4)])
        sim = Sim(n_q, rng, stagger)
        if not sim.run():
            bad += 1
            if bad <= 3:
                print(f"run {r} (n_q {n_q}, stagger {stagger}): {sim.errors[:3]}")
    print(f"{runs - bad}/{runs} random interleavings clean")
    # Negative controls: each deliberate bug must be caught in some run.
    caught_all = True
    for bug in ("one_ds_buffer", "early_release", "parity", "arrive_only"):
        caught = 0
        for r in range(runs):
            rng = random.Random(r)
            n_q = rng.choice([2, 4, 6, 8, 10])
            sim = Sim(n_q, rng, None, bug)
            caught += not sim.run()
        print(f"negative control {bug}: caught in {caught}/{runs} runs")
        caught_all &= caught > 0
    return 1 if bad or not caught_all else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
