"""The barrier model of the persistent FA3-style forward kernels (a helper, not a check:
manifest.yaml lists it as a helper). causal_persistent_check.py (../mha_fwd_causal_d128.cu) and
gqa_prefill_persistent_check.py (../gqa_prefill.cu) both import it.

Both kernels share one synchronisation protocol, which ``cta_actors`` models as generator actors
for deskcheck.py's ``interleave`` (over its ``MBar`` and ``NamedBarriers``). One CTA is:

* a producer: it takes its first unit, then per unit it waits q_empty (the parity of its unit
  count, flipped) and applies the kernel's end test (at the end: -1 in the unit slot, a q_full
  arrival without a copy, done); otherwise it writes the unit slot, loads Q on q_full, loads the
  unit's n_kv K and V tiles through two rings of ``stages`` stages (k_full/k_empty and
  v_full/v_empty, ring counters and phases carried across units, tiles loaded from the last
  block down: the i-th K/V tile of a unit is block n_kv - 1 - i), then draws its next unit;
* two consumer warpgroups g = 0, 1: each waits q_full (the parity of its own unit count) and reads
  the slot, then runs the ping-pong schedule. Consumer 1 primes turn barrier 0 once per CTA; per
  K/V block a consumer syncs on its turn barrier before its S GEMM and arrives on the other's
  right after issuing it; wgmma_wait<1> retires S GEMM j (K stage j released, q_empty after the
  unit's last S GEMM), wgmma_wait<0> retires P V j - 1 (V stage released); a tail P V for the
  last block; then the epilogue writes the consumer's 64 rows. On the end marker consumer 0 takes
  one last turn (the final sync that completes consumer 1's open hand-over arrival);
* TMA copies: actors that land after a random delay, tagging their buffer with what they carry.
  Every wgmma reads the tag it expects, and no copy may land in a buffer a wgmma still reads.

What differs between the kernels is a ``UnitSchedule``: how the producer walks the work list
(first unit, end test, ticket draw and counter reset, with their planted bugs), what it writes in
the unit slot, and what a unit's copies carry, how the consumers derive n_kv from the slot and
which rows their epilogue writes (``UnitWork``). The synchronisation bugs planted here
(``SYNC_BUGS``) are the same for both kernels.

The model assumes: one producer and two consumers per CTA, ``empty_arrivals`` split evenly over
the consumers' warps (one arrival per warp on k_empty, v_empty and q_empty), one expect_tx unit per
copy, and a unit slot that the producer rewrites only after q_empty (both consumers have read it).
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable, Generator, Hashable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from deskcheck import CheckError, MBar, NamedBarriers, assert_mirrored, flat, interleave, require

END = -1  # the unit slot's end marker (written by a producer at the end of the work list)

# Synchronisation bugs this model plants itself (a UnitSchedule plants its kernel's own)
SYNC_BUGS = (
    "no-q-empty-wait",  # the producer rewrites the slot and Q without waiting for q_empty
    "ring-reset-per-unit",  # the consumers restart their ring stages and phases at every unit
    "q-parity-reset",  # the consumers wait q_full with parity 0 instead of their unit count's
    "skip-last-handover",  # consumer 1 skips its hand-over arrival on a unit's last block
    "no-final-sync",  # consumer 0 leaves without the final turn
)

# The kernels' C++ lines this model mirrors (the same in both kernels): the default first unit,
# the producer's q_empty wait and K/V loop over the two rings, the consumers' priming, q_full
# wait, turns, q_empty and k_empty/v_empty arrivals and the final sync.
SYNC_LINES = (
    "int unit = static_cast<int>(blockIdx.x);",
    "ptx::mbar_wait(q_empty, (it & 1u) ^ 1u);",
    "for (int i = 0; i < n_kv; ++i) {",
    "ptx::mbar_wait(&k_empty[kst], kph ^ 1u);",
    "ptx::mbar_wait(&v_empty[vst], vph ^ 1u);",
    "if (g == 1) ptx::named_bar_arrive(kTurnBar + 0, 256);",
    "ptx::mbar_wait(q_full, it & 1u);",
    "if (g == 0) ptx::named_bar_sync(kTurnBar + 0, 256);",
    "ptx::named_bar_sync(kTurnBar + g, 256);",
    "if (n_kv == 1) ptx::mbar_arrive(q_empty);",
    "for (int j = 1; j < n_kv; ++j) {",
    "if (j == n_kv - 1) ptx::mbar_arrive(q_empty);",
    "if (j + 1 < n_kv) ptx::mbar_wait(&k_full[kst], kph);",
    "if (warp_leader) ptx::mbar_arrive(&v_empty[vst]);",
)


def check_protocol_source(src: str) -> None:
    """The protocol as this model has it, in a kernel's source ``src``: every line of
    ``SYNC_LINES`` present, exactly the two unconditional hand-over arrives (prologue and loop,
    none skipped), and the K and V ring counters each advanced at their three places."""
    assert_mirrored(src, SYNC_LINES, "persistent protocol")
    source = flat(src)
    arrives = source.count("ptx::named_bar_arrive(kTurnBar + (1 - g), 256);")
    require(arrives == 2, f"{arrives} hand-over arrives, want 2 (prologue and loop)")
    require("if (!(g == 1" not in source, "a skipped hand-over is back in the source")
    require(source.count("if (++kst == kStages) { kst = 0; kph ^= 1u; }") == 3, "kst advances")
    require(source.count("if (++vst == kStages) { vst = 0; vph ^= 1u; }") == 3, "vst advances")


Step = bool | tuple[str, MBar, int]  # what an actor yields to deskcheck.interleave
Actor = Generator[Step, None, None]


def _nothing_written(g: int) -> Iterable[Hashable]:
    return ()


@dataclass(frozen=True)
class UnitWork:
    """One unit as the producer or a consumer sees it.

    ``q_tag`` is what the Q copy carries (every S GEMM of the unit must read it); K/V tile i of
    the unit (the i-th loaded, block n_kv - 1 - i) carries ``kv_key + (n_kv - 1 - i,)``. Tags
    start with the unit's position in the CTA's sequence, so a unit met twice still differs.
    ``rows(g)`` is what consumer g's epilogue writes (the consumers' view only)."""

    q_tag: Hashable
    kv_key: tuple
    n_kv: int
    rows: Callable[[int], Iterable[Hashable]] = _nothing_written

    def kv_tag(self, i: int) -> tuple:
        return (*self.kv_key, self.n_kv - 1 - i)


class UnitSchedule:
    """A kernel's side of the barrier model, shared by the CTAs of one launch (subclassed by each
    check, which sets ``stages`` and ``empty_arrivals`` from the kernel's constexprs). ``p`` is
    the check's problem, ``counter`` its model of the launch's ticket counter (both read only by
    the subclass's hooks); ``bug`` is the run's planted bug (None: the kernel as written), read
    by the model for ``SYNC_BUGS`` and by the subclass for its own bugs."""

    stages: int  # kStages: the K and V rings' depth
    empty_arrivals: int  # kEmptyArrivals: arrivals that free a stage or Q (both consumers)

    def __init__(self, p: Any, counter: Any, bug: str | None = None) -> None:
        self.p, self.counter, self.bug = p, counter, bug

    def first_unit(self, cid: int) -> int:
        """The producer's first unit (blockIdx.x)."""
        return cid

    def at_end(self, unit: int) -> bool:
        """The producer's end test on the unit it holds."""
        raise NotImplementedError

    def next_unit(self) -> Generator[Step, None, int]:
        """The producer's ticket draw, as actor steps (other actors may run between them);
        returns the next unit."""
        raise NotImplementedError

    def publish(self, unit: int, pos: int) -> tuple[object, UnitWork]:
        """The producer's decode of `unit` (the `pos`-th of its CTA): what it writes in the unit
        slot, and the unit's Q and K/V copies."""
        raise NotImplementedError

    def receive(self, slot: object, unit: int, pos: int) -> UnitWork:
        """A consumer's view of the slot value `slot`, which the producer wrote for `unit` (the
        `pos`-th of the CTA): check the slot, derive n_kv and the tags as the consumer does."""
        raise NotImplementedError


def cta_actors(
    units: UnitSchedule,
    cid: int,
    actors: list[Actor],
    log: list,
    rng: random.Random,
    fixed_units: Sequence[int] | None = None,
) -> Callable[[], int]:
    """Appends the producer and the 2 consumers of CTA `cid` to `actors` (the producer appends
    its TMA copies as it issues them); the epilogues append the rows they write to `log`. With
    `fixed_units` the producer walks that sequence instead of drawing tickets. Returns the check
    to run once every actor has ended, which returns the number of units the CTA processed."""
    stages, bug = units.stages, units.bug
    warps = units.empty_arrivals // 2  # arrivals per consumer warpgroup (one per warp)
    q_full, q_empty = MBar(1), MBar(units.empty_arrivals)
    k_full = [MBar(1) for _ in range(stages)]
    k_empty = [MBar(units.empty_arrivals) for _ in range(stages)]
    v_full = [MBar(1) for _ in range(stages)]
    v_empty = [MBar(units.empty_arrivals) for _ in range(stages)]
    data: dict = {}  # buffer -> tag of what TMA wrote there
    readers: dict = {}  # buffer -> wgmma groups in flight reading it
    slot: list[object] = [None]
    named = NamedBarriers()
    published: list[int] = []  # units in the order the producer published them
    blocks: list[int] = []  # their n_kv, as the producer loaded them
    turns: list[int] = []  # consumer whose turn each named-barrier turn was

    def advance(st: int, ph: int) -> tuple[int, int]:
        """if (++st == kStages) { st = 0; ph ^= 1u; }"""
        return (0, ph ^ 1) if st + 1 == stages else (st + 1, ph)

    def tma(buf: Hashable, tag: Hashable, bar: MBar) -> Actor:
        for _ in range(rng.randrange(4)):
            yield True
        require(not readers.get(buf), f"CTA {cid}: TMA into {buf} while a wgmma reads it")
        data[buf] = tag
        bar.complete_tx(1)
        yield True

    def read(buf: Hashable, want: Hashable, what: str) -> None:
        have = data.get(buf)
        require(have == want, f"CTA {cid} {what}: {buf} holds {have}, want {want}")
        readers[buf] = readers.get(buf, 0) + 1

    def retire(buf: Hashable, want: Hashable, what: str) -> None:
        require(data.get(buf) == want, f"CTA {cid} {what}: {buf} overwritten while read")
        readers[buf] -= 1

    def producer() -> Actor:
        kst = vst = kph = vph = 0
        idx = 0  # position in fixed_units
        unit = units.first_unit(cid) if fixed_units is None else fixed_units[0]
        it = 0
        while True:
            if bug != "no-q-empty-wait":
                yield ("wait", q_empty, (it & 1) ^ 1)
            end = units.at_end(unit) if fixed_units is None else idx >= len(fixed_units)
            if end:
                slot[0] = END
                q_full.arrive()
                return
            pos = len(published)
            slot[0], work = units.publish(unit, pos)
            published.append(unit)
            blocks.append(work.n_kv)
            q_full.arrive(expect_tx=1)
            actors.append(tma("Q", work.q_tag, q_full))
            yield True
            for i in range(work.n_kv):
                yield ("wait", k_empty[kst], kph ^ 1)
                k_full[kst].arrive(expect_tx=1)
                actors.append(tma(("K", kst), work.kv_tag(i), k_full[kst]))
                kst, kph = advance(kst, kph)
                yield ("wait", v_empty[vst], vph ^ 1)
                v_full[vst].arrive(expect_tx=1)
                actors.append(tma(("V", vst), work.kv_tag(i), v_full[vst]))
                vst, vph = advance(vst, vph)
                yield True
            if fixed_units is None:
                unit = yield from units.next_unit()
            else:
                idx += 1
                unit = fixed_units[idx] if idx < len(fixed_units) else END
            it += 1

    def consumer(g: int) -> Actor:
        kst = vst = kph = vph = 0
        mine, other = 1 + g, 2 - g  # kTurnBar + g, kTurnBar + (1 - g)

        def arrive_warps(bar: MBar) -> None:
            for _ in range(warps):
                bar.arrive()

        def turn() -> Actor:
            yield from named.sync(mine, g, 2)
            turns.append(g)

        def hand_over(last_block: bool) -> None:
            if not (bug == "skip-last-handover" and g == 1 and last_block):
                named.arrive(other, g, 2)

        if g == 1:
            named.arrive(1, g, 2)  # priming, once per CTA
        it = reads = 0
        while True:
            yield ("wait", q_full, (0 if bug == "q-parity-reset" else it) & 1)
            s = slot[0]
            if s is None:
                raise CheckError(f"CTA {cid}: consumer {g} read an unwritten slot")
            if s == END:
                require(reads == len(published), f"CTA {cid}: consumer {g} ends early")
                if g == 0 and bug != "no-final-sync":
                    yield from turn()
                return
            require(reads < len(published), f"CTA {cid}: consumer {g} read a stale slot {s}")
            pos = reads
            work = units.receive(s, published[reads], pos)
            reads += 1
            n_kv = work.n_kv
            if bug == "ring-reset-per-unit":
                kst = vst = kph = vph = 0
            # prologue: S GEMM of block 0
            yield ("wait", k_full[kst], kph)
            yield from turn()
            read("Q", work.q_tag, "S GEMM")
            read(("K", kst), work.kv_tag(0), "S GEMM")
            hand_over(n_kv == 1)
            yield True
            retire("Q", work.q_tag, "S GEMM")
            retire(("K", kst), work.kv_tag(0), "S GEMM")
            arrive_warps(k_empty[kst])
            if n_kv == 1:
                arrive_warps(q_empty)
            kst, kph = advance(kst, kph)
            yield True
            for j in range(1, n_kv):  # S GEMM of block j, P V of block j - 1
                yield ("wait", k_full[kst], kph)
                yield from turn()
                read("Q", work.q_tag, "S GEMM")
                read(("K", kst), work.kv_tag(j), "S GEMM")
                yield ("wait", v_full[vst], vph)
                read(("V", vst), work.kv_tag(j - 1), "P V")
                hand_over(j == n_kv - 1)
                yield True
                retire("Q", work.q_tag, "S GEMM")  # wgmma_wait<1>: G_S(j) retired
                retire(("K", kst), work.kv_tag(j), "S GEMM")
                arrive_warps(k_empty[kst])
                if j == n_kv - 1:
                    arrive_warps(q_empty)
                kst, kph = advance(kst, kph)
                yield True  # softmax
                if j + 1 < n_kv:
                    yield ("wait", k_full[kst], kph)
                retire(("V", vst), work.kv_tag(j - 1), "P V")  # wgmma_wait<0>: G_PV(j-1) retired
                arrive_warps(v_empty[vst])
                vst, vph = advance(vst, vph)
                yield True
            # tail: P V of the last block
            yield ("wait", v_full[vst], vph)
            read(("V", vst), work.kv_tag(n_kv - 1), "P V (tail)")
            yield True
            retire(("V", vst), work.kv_tag(n_kv - 1), "P V (tail)")
            arrive_warps(v_empty[vst])
            vst, vph = advance(vst, vph)
            log.extend(work.rows(g))  # epilogue: this consumer's 64 rows of the unit
            yield True
            it += 1

    actors += [producer(), consumer(0), consumer(1)]

    def final() -> int:
        require(named.balanced(), f"CTA {cid}: a named-barrier generation is left open")
        alternating = all(a != b for a, b in itertools.pairwise(turns))
        require(alternating, f"CTA {cid}: turns {turns[:12]}..")
        require(not turns or turns[0] == 0, f"CTA {cid}: consumer 1 issued first")
        want = sum(blocks)
        require(len(turns) == 2 * want + 1, f"CTA {cid}: {len(turns)} turns for {want} blocks")
        return len(published)

    return final


def run_ctas(
    units: UnitSchedule,
    cids: Iterable[int],
    seed: int,
    max_steps: int,
    fixed: Sequence[Sequence[int]] | None = None,
) -> tuple[list[int], list]:
    """The CTAs `cids` of one launch (CTA c walking `fixed[c]` when given) in one random
    interleaving (`seed`: TMA delays and the actors' order). Raises CheckError on a deadlock or
    a failed check; returns the units each CTA processed and the rows the epilogues wrote."""
    rng = random.Random(seed)
    actors: list[Actor] = []
    log: list = []
    finals = []
    for cid in cids:
        seq = None if fixed is None else fixed[cid]
        finals.append(cta_actors(units, cid, actors, log, rng, seq))
    if not interleave(actors, rng, max_steps=max_steps):
        raise CheckError(f"deadlock (seed {seed})")
    return [f() for f in finals], log
