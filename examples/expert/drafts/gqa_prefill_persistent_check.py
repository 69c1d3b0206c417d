"""Desk check (CPU only) of examples/expert/gqa_prefill.cu, the persistent GQA prefill (task
PTX-H100-GQAPrefill; drafted here as gqa_prefill_persistent.cu, shipped after its first GPU run).

The kernel's unit arithmetic, ticket protocol and synchronisation are re-implemented below, and
every C++ line the model mirrors is asserted to be present verbatim in the kernel (an edit the
model does not follow fails here). Constants are read from the kernel's `constexpr`s. The plan
kernel (counting sort, host bound) and the tile code are the non-persistent kernel's, checked by
gqa_prefill_check.py; its plan model is imported from there.

a. Decomposition: for the task's 5 workloads and odd cases (q_len 1, 5, 129, 300 with
   kv_len - q_len 0 .. 871; single sequences with fewer units than SMs): unit u -> (item u / 32,
   head u % 32, KV head (u % 32) / 4) over the live units 0 .. 32 n_items - 1 writes every
   (sequence, query row, query head) exactly once; costs never increase with the unit index
   (heaviest first); the 4 heads of one (item, KV head) are 4 adjacent units; dead items only
   after the live ones.
b. Counter: the launch's CTAs draw tickets in random orders (first unit = blockIdx.x, then
   gridDim.x + atomicAdd, stop at the first unit >= n_units; atomicAdd and the reset's atomicExch
   are separate steps), 3 launches back to back on one counter: every live unit handed out once
   per launch, exactly one reset per launch, no draw after it, counter 0 at the end; the count
   argument of the header (n_units draws per launch, any grid) is asserted directly. The model
   leaves out the plan kernel's re-zeroing (the kernel's second guard), so the self-reset is
   checked on its own.
c. Barrier model: several CTAs (producer + 2 consumers each, TMA copies as asynchronous actors,
   one shared counter; the shared model of persistent_model.py over deskcheck.py's MBar /
   NamedBarriers / interleave, this kernel's slot, tags, rows and ticket draw in GqaUnits), in
   random interleavings, over problems with n_kv 1 .. 11 per unit and grids above and below the unit
   count, plus CTAs fed fixed unit sequences (n_kv = 1 runs, n_kv alternating 1 and long): no
   deadlock, each S GEMM reads the expected unit's Q and K tile, each P V the expected V tile, no
   TMA lands in a buffer a wgmma still reads, the slot holds the unit the producer published,
   ping-pong turns strictly alternate across units, no named-barrier generation is left open,
   every (sequence, row, head) written once. Planted bugs that must be caught: reset on the
   wrong ticket (off by one; on the host bound), end test on the host bound (dead items
   processed), ring phases reset per unit, q_full parity not carried, no q_empty wait, the
   non-persistent kernel's skipped last hand-over, no final sync.
d. Makespan model (132 SMs, list scheduling) of the earlier non-persistent decomposition against
   the persistent one, per workload.
Exits non-zero on any failure. Run: python3 examples/expert/drafts/gqa_prefill_persistent_check.py
"""

from __future__ import annotations

import heapq
import random
import sys
from pathlib import Path

from deskcheck import (
    CheckError,
    assert_mirrored,
    constexprs,
    negative_controls,
    require,
    run_checks,
)
from gqa_prefill_check import BM, GROUP, NKVH, NQH, WORKLOADS, plan, tile_n_kv
from persistent_model import SYNC_LINES, UnitSchedule, UnitWork, check_protocol_source, run_ctas

HERE = Path(__file__).resolve().parent
KERNEL = HERE.parent / "gqa_prefill.cu"
SRC = KERNEL.read_text()
NSM = 132

C = constexprs(SRC)
STAGES, EMPTY_ARRIVALS, UNITS_PER_ITEM = C["kStages"], C["kEmptyArrivals"], C["kUnitsPerItem"]

MIRRORED = [
    # plan: the tile count for the attention kernel
    "sched[kSchedItems] = min(cursor[0], max_items);",
    "sched[kSchedCounter] = 0;",
    # kernel entry
    "const int n_units = kUnitsPerItem * sched[kSchedItems];",
    "if (static_cast<int>(blockIdx.x) >= n_units) return;",
    # producer
    "int2 itm = items[unit / kUnitsPerItem];",
    "if (unit >= n_units) {",
    "slot[0] = -1;",
    "ptx::mbar_arrive(q_full);",
    "const int h = unit % kUnitsPerItem;",
    "const int kvh = h / kGroup;",
    "const int t = itm.y;",
    "const int n_kv = tile_n_kv(t, q_len, kv_len); // >= 1",
    "slot[0] = h; slot[1] = t; slot[2] = q_start; slot[3] = q_len; slot[4] = kv_len;",
    "const int q_tok = q_start + t * kBM;",
    "ptx::tma_load_3d(sQ, &tmQ, q_full, 0, h, q_tok);",
    "const int tok = kv_start + (n_kv - 1 - i) * kBN;",
    "ptx::tma_load_3d(dk, &tmK, &k_full[kst], 0, kvh, tok);",
    "const int ticket = atomicAdd(&sched[kSchedCounter], 1);",
    "if (ticket == n_units - 1) atomicExch(&sched[kSchedCounter], 0);",
    "unit = static_cast<int>(gridDim.x) + ticket;",
    "if (unit < n_units) { itm = items[unit / kUnitsPerItem];",
    # consumers
    "const int h = slot[0];",
    "if (h < 0) {",
    "const int t = slot[1]; const int q_start = slot[2]; const int q_len = slot[3];"
    " const int kv_len = slot[4];",
    "const int n_kv = tile_n_kv(t, q_len, kv_len); // >= 1",
    "const int row0 = t * kBM + row_t;",
    "const bool ok0 = row0 < q_len;",
    # host
    "const long long units_bound = max_items_ll * kUnitsPerItem;",
    "static_cast<unsigned>(units_bound < num_sms ? units_bound : static_cast<long long>(num_sms));",
]


def check_source() -> None:
    assert_mirrored(SRC, MIRRORED, "persistent GQA prefill")
    check_protocol_source(SRC)
    require(UNITS_PER_ITEM == NQH, "one query head per unit")
    require(C["kSchedItems"] != C["kSchedCounter"] and C["kSchedItems"] < C["kSchedInts"], "sched")
    require(C["kSmemBytes"] <= 232448, "shared memory")


# ----------------------------------------------------------------------------- problems
class Problem:
    """One call: the plan's items (imported model of the plan kernel), n_units, grid."""

    def __init__(self, qls, kls, nsm=NSM, grid=None):
        self.qls, self.kls = list(qls), list(kls)
        self.items, self.max_items = plan(self.qls, self.kls, 1)
        self.n_items = sum(1 for b, _t in self.items if b >= 0)  # = cursor[0]
        self.n_units = UNITS_PER_ITEM * self.n_items
        self.bound = UNITS_PER_ITEM * self.max_items
        self.grid = min(self.bound, nsm) if grid is None else grid
        self.q_start = [sum(self.qls[:b]) for b in range(len(self.qls))]

    def unit(self, u):
        """(b, t, h, kvh, n_kv) of unit u, as the producer decodes it (1a, 1e)."""
        b, t = self.items[u // UNITS_PER_ITEM]
        h = u % UNITS_PER_ITEM
        n_kv = tile_n_kv(t, self.qls[b], self.kls[b]) if b >= 0 else 0
        return b, t, h, h // GROUP, n_kv


def odd_problems():
    ds = [0, 1, 5, 127, 128, 129, 255, 256, 300, 511, 871]
    qls, kls = [], []
    for ql in (1, 5, 129, 300):
        for d in ds:
            qls.append(ql)
            kls.append(ql + d)
    return {
        "odd-all": (qls, kls),
        "one-q1": ([1], [1]),  # 1 item, 32 units < 132 SMs
        "one-q5-d871": ([5], [876]),
        "q129-d300": ([129], [429]),
        "q300x3": ([300, 300, 300], [300, 571, 1171]),
    }


# --------------------------------------------------------------------- a. decomposition
def check_decode(p: Problem, name: str) -> None:
    n_live = p.n_items
    require(all(b >= 0 for b, _t in p.items[:n_live]), f"{name}: dead item among the live ones")
    require(all(b < 0 for b, _t in p.items[n_live:]), f"{name}: live item after a dead one")
    written = set()
    costs = []
    for u in range(p.n_units):
        b, t, h, kvh, n_kv = p.unit(u)
        require(b >= 0, f"{name}: unit {u} < n_units is dead")
        require(kvh == h // GROUP and 0 <= h < NQH and 0 <= kvh < NKVH, "head range")
        costs.append(n_kv)
        for r in range(BM * t, min(BM * t + BM, p.qls[b])):
            key = (b, r, h)
            require(key not in written, f"{name}: {key} written twice")
            written.add(key)
        if u % GROUP == GROUP - 1:  # the 4 heads of one (item, KV head) are adjacent
            grp = [p.unit(v) for v in range(u - GROUP + 1, u + 1)]
            require(len({(x[0], x[1], x[3]) for x in grp}) == 1, f"{name}: group split at {u}")
    require(len(written) == sum(p.qls) * NQH, f"{name}: rows missing")
    require(costs == sorted(costs, reverse=True), f"{name}: not heaviest first")
    require(p.n_units <= p.bound, "host bound")


class Counter:
    """The ticket counter: atomicAdd, and the reset (a separate atomicExch) by the drawer of
    ticket n_units - 1 (or the planted wrong ticket)."""

    def __init__(self) -> None:
        self.value = 0
        self.resets = 0
        self.draws = 0
        self.draws_after_reset = 0

    def add(self) -> int:
        if self.resets:
            self.draws_after_reset += 1
        self.draws += 1
        ticket = self.value
        self.value += 1
        return ticket

    def exch0(self) -> None:
        self.value = 0
        self.resets += 1


def reset_ticket(p: Problem, bug: str | None) -> int:
    if bug == "reset-off-by-one":
        return p.n_units
    if bug == "reset-on-host-bound":
        return p.bound + p.grid - 1
    return p.n_units - 1


def end_bound(p: Problem, bug: str | None) -> int:
    return p.bound if bug == "end-on-host-bound" else p.n_units


def hand_out(p: Problem, counter: Counter, rng: random.Random, bug=None):
    """One launch, CTAs' draws in a random order, add and reset as separate steps."""
    units = [[] for _ in range(p.grid)]
    nxt = list(range(p.grid))
    pending_reset = set()
    live = [c for c in range(p.grid) if c < end_bound(p, bug)]  # 0.: CTAs without a unit leave
    while live or pending_reset:
        c = rng.choice(live + sorted(pending_reset) if pending_reset else live)
        if c in pending_reset:
            counter.exch0()
            pending_reset.discard(c)
            continue
        if nxt[c] >= end_bound(p, bug):
            live.remove(c)
            continue
        require(p.unit(nxt[c])[0] >= 0, f"CTA {c} processes dead unit {nxt[c]}")
        units[c].append(nxt[c])
        ticket = counter.add()
        if ticket == reset_ticket(p, bug):
            pending_reset.add(c)
        nxt[c] = p.grid + ticket
    return units


def check_hand_out(p: Problem, rng: random.Random, launches=3, bug=None):
    counter = Counter()
    for launch in range(launches):
        counter.resets = counter.draws = counter.draws_after_reset = 0
        per_cta = hand_out(p, counter, rng, bug)
        got = sorted(u for us in per_cta for u in us)
        require(got == list(range(p.n_units)), f"launch {launch}: units handed out wrong")
        require(counter.draws == p.n_units, f"launch {launch}: {counter.draws} draws")
        require(counter.resets == 1, f"launch {launch}: {counter.resets} counter resets")
        require(counter.draws_after_reset == 0, "a ticket was drawn after the reset")
        require(counter.value == 0, f"launch {launch}: counter left at {counter.value}")
    return per_cta


def check_decomposition() -> None:
    rng = random.Random(11)
    problems = {**WORKLOADS, **odd_problems()}
    lines = []
    for name, (qls, kls) in problems.items():
        p = Problem(qls, kls)
        check_decode(p, name)
        for grid in sorted({p.grid, 1, 7, p.n_units, p.n_units + 5}):
            q = Problem(qls, kls, grid=grid)
            # p's work list, which check_decode verified: the plan orders a bucket at random.
            q.items, q.max_items, q.n_items = p.items, p.max_items, p.n_items
            check_hand_out(q, rng)
        per_cta = check_hand_out(p, rng)
        n = sorted(len(u) for u in per_cta)
        lines.append(
            f"{name}: {p.n_items}/{p.max_items} items live, {p.n_units} units, grid {p.grid}, "
            f"units/CTA {n[0]}..{n[-1]}"
        )
    print("a+b. decomposition and counter ok (3 launches back to back per grid, random orders):")
    for line in lines:
        print("   " + line)


# ---------------------------------------------------------------------- c. barrier model
class GqaUnits(UnitSchedule):
    """This kernel's side of persistent_model's barrier model: the unit slot holds (h, t, q_start,
    q_len, kv_len), from which the consumers derive n_kv with tile_n_kv themselves; Q copies are
    tagged with (sequence, tile, head), K/V copies with (sequence, KV head, block); consumer g's
    epilogue writes (sequence, row, head) for its 64 rows below q_len. The producer stops at the
    first unit >= n_units and draws a ticket in two steps (atomicAdd, then the atomicExch reset
    by the drawer of ticket n_units - 1; other CTAs may draw in between). Planted here: the reset
    on the wrong ticket and the end test on the host bound (reset_ticket, end_bound)."""

    stages, empty_arrivals = STAGES, EMPTY_ARRIVALS
    p: Problem
    counter: Counter

    def at_end(self, unit: int) -> bool:
        return unit >= end_bound(self.p, self.bug)

    def next_unit(self):
        ticket = self.counter.add()
        yield True  # another CTA may draw between the add and the reset
        if ticket == reset_ticket(self.p, self.bug):
            self.counter.exch0()
        return self.p.grid + ticket

    def slot_of(self, unit: int) -> tuple[int, int, int, int, int]:
        """What the producer writes in the unit slot: h, t, q_start, q_len, kv_len."""
        p = self.p
        b, t, h, _kvh, _n_kv = p.unit(unit)
        return h, t, p.q_start[b], p.qls[b], p.kls[b]

    def publish(self, unit: int, pos: int) -> tuple[tuple, UnitWork]:
        b, t, h, kvh, n_kv = self.p.unit(unit)
        require(b >= 0, f"producer processes dead unit {unit}")
        return self.slot_of(unit), UnitWork(q_tag=(pos, b, t, h), kv_key=(pos, b, kvh), n_kv=n_kv)

    def receive(self, slot: object, unit: int, pos: int) -> UnitWork:
        b, _t, _h, kvh, _n_kv = self.p.unit(unit)
        require(slot == self.slot_of(unit), f"slot {slot}, want {self.slot_of(unit)}")
        h, t, _q_start, q_len, kv_len = slot
        n_kv = tile_n_kv(t, q_len, kv_len)  # the consumers' own n_kv, from the slot

        def rows(g: int) -> list[tuple[int, int, int]]:  # epilogue: rows below q_len
            return [(b, r, h) for r in range(BM * t + 64 * g, min(BM * t + 64 * g + 64, q_len))]

        return UnitWork(q_tag=(pos, b, t, h), kv_key=(pos, b, kvh), n_kv=n_kv, rows=rows)


def run_barrier_model(p, seed, bug=None, fixed=None):
    """All live CTAs of one launch (or one CTA per fixed unit sequence), random interleaving."""
    counter = Counter()
    if fixed is None:
        ctas = [c for c in range(p.grid) if c < end_bound(p, bug)]  # 0.: others leave at once
    else:
        ctas = range(len(fixed))
    units = GqaUnits(p, counter, bug)
    per_cta, log = run_ctas(units, ctas, seed, max_steps=3_000_000, fixed=fixed)
    if fixed is None:
        require(len(log) == len(set(log)), "a row written twice")
        require(len(log) == sum(p.qls) * NQH, "rows missing")
        require(counter.value == 0 and counter.resets == 1, "counter not reset exactly once")
        require(counter.draws_after_reset == 0, "draw after the reset")
    return per_cta


BARRIER_SHAPES = [
    # (q_lens, kv_lens, grid): n_kv per item in the comment
    ([129], [429], 5),  # 2 items, n_kv 4, 4; 64 units over 5 CTAs
    ([1, 5, 128], [1, 200, 128], 7),  # n_kv 2, 1, 1: n_kv = 1 runs
    ([1], [1], 40),  # 32 units, grid 40: 8 CTAs without a unit
    ([300], [1171], 3),  # n_kv 9, 10, 10 (d = 871)
    ([5, 129], [876, 129], 4),  # n_kv 7 then 1, 2
    ([64, 1], [1300, 1], 2),  # n_kv 11 and 1 on 2 CTAs
]


def check_barriers() -> None:
    runs = most = 0
    for qls, kls, grid in BARRIER_SHAPES:
        p = Problem(qls, kls, grid=grid)
        for seed in range(12):
            most = max(most, max(run_barrier_model(p, seed)))
            runs += 1
    # fixed sequences over the units of an item mix with n_kv 11 (item 0) .. 1 (last items)
    pf = Problem([64, 1, 5], [1300, 1, 200], grid=1)
    costs = [pf.unit(u)[4] for u in range(pf.n_units)]
    one = costs.index(1)
    long_ = 0
    fixed = [
        [one, one + 1, one + 2, one + 3],  # n_kv = 1 four times
        [long_, one, long_ + 1, one + 1, long_ + 2],  # long, 1, long, 1, long
        [one, long_ + 3, one + 4, 40, long_ + 4],
        [long_ + 5],
    ]
    for seed in range(30):
        run_barrier_model(pf, seed, fixed=fixed)
        runs += 1
    print(
        f"c. barrier model ok: {runs} random interleavings, {len(BARRIER_SHAPES)} shapes "
        f"(n_kv 1..11, up to {most} units per CTA, a grid above the unit count) + "
        f"{len(fixed)} fixed unit sequences (n_kv costs {sorted(set(costs))}): no deadlock, "
        "buffers/slot as expected, turns alternate across units, barriers balanced, "
        "rows written once, one reset per launch"
    )
    dead = Problem([1, 5, 128], [1, 200, 128], grid=7)
    require(dead.bound > dead.n_units, "the bug shape needs dead items")
    bugs = [
        "reset-off-by-one",
        "reset-on-host-bound",
        "end-on-host-bound",
        "ring-reset-per-unit",
        "q-parity-reset",
        "no-q-empty-wait",
        "skip-last-handover",
        "no-final-sync",
    ]

    def caught(bug: str, r: int) -> bool:
        try:
            if bug.startswith("reset") or bug.startswith("end"):
                check_hand_out(dead, random.Random(r), 2, bug)
                run_barrier_model(dead, r, bug)
            else:
                run_barrier_model(Problem([129], [429], grid=3), r, bug)
                run_barrier_model(pf, r, bug, fixed=fixed)
        except CheckError:
            return True
        return False

    require(negative_controls(bugs, 6, caught), "a negative control was not caught")


# ----------------------------------------------------------------------- d. makespan model
def check_schedule() -> None:
    """Time unit: one 128x128 K/V tile for both consumers. Non-persistent (shipped until
    2026-12-03): one CTA per (item, KV head, head group) in blockIdx order, handed to the first
    free SM (the block scheduler), cost a + hpc (b + n_kv), a = 1.2 (CTA start), b = 0.4 (head
    switch), hpc = 4 iff batch <= 4 else 2. Persistent: CTA start a once per SM, then units of
    cost b + n_kv claimed by the first free CTA in ticket order (the claim kStages tiles early
    does not change which CTA frees first)."""
    a, b = 1.2, 0.4
    print("d. makespan model (132 SMs; tile = 1, CTA start 1.2, head/unit switch 0.4):")
    for name, (qls, kls) in WORKLOADS.items():
        if name == "odd":
            continue
        p = Problem(qls, kls)
        costs = [tile_n_kv(t, qls[bb], kls[bb]) for bb, t in p.items[: p.n_items]]
        hpc = 4 if len(qls) <= 4 else 2
        heap = [0.0] * NSM
        for c in costs:
            for _ in range(NQH // hpc):
                heapq.heappush(heap, heapq.heappop(heap) + a + hpc * (b + c))
        shipped = max(heap)
        heap = [a] * NSM
        for c in costs:
            for _ in range(NQH):
                heapq.heappush(heap, heapq.heappop(heap) + b + c)
        persistent = max(heap)
        ideal = a + sum(NQH * (b + c) for c in costs) / NSM
        print(
            f"   {name:11s} non-persistent {shipped / ideal:.3f}, persistent "
            f"{persistent / ideal:.3f} of the perfect split; modelled gain "
            f"{shipped / persistent:.3f}x"
        )
        require(persistent <= shipped * 1.001, f"{name}: persistent slower in the model")


def checks() -> None:
    check_source()
    print(
        f"0. source: {KERNEL.name}: kStages={STAGES} kEmptyArrivals={EMPTY_ARRIVALS} "
        f"kUnitsPerItem={UNITS_PER_ITEM} kSmemBytes={C['kSmemBytes']}; "
        f"{len(MIRRORED) + len(SYNC_LINES)} mirrored lines present"
    )
    check_decomposition()
    check_barriers()
    check_schedule()


if __name__ == "__main__":
    random.seed(1)
    sys.exit(run_checks(checks))
