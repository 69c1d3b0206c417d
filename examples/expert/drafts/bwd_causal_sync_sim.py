"""Randomised interleaving model of mha_bwd_causal_d128.cu's synchronisation (CPU only).

``python examples/expert/drafts/bwd_causal_sync_sim.py [runs]``

The non-causal d128 draft's simulation (bwd_sync_sim.py; both use bwd_model.BwdSyncSim and
deskcheck.py's barriers and driver). What the causal kernel changes here is the trip count: CTA kt
streams query tiles 2kt .. n_q - 1, i.e. n_it = n_q - 2kt >= 2 tiles (producer and both consumers),
without wrap-around, so the ring phases end at a different place per CTA. The runs cover every kt of
n_q = 2 .. 12 (n_it 2 .. 12, odd and even, fewer and more tiles than stages) and check that each
stage read holds tile 2kt + it. Negative controls add a producer/consumer trip-count mismatch (the
producer running the non-causal n_q tiles: the consumers exit with a copy in flight into freed smem,
caught as a copy nobody consumed, and a consumer running one tile too many: deadlock).

A second part is the CTA-order model behind kHeadGroup: greedy list scheduling of the CTAs in
launch order on 132 SMs (cost of CTA kt = n_q - 2kt tile-times plus a start cost of 1), for the
d128 draft's order (key tile fastest), key tile slowest, and the kernel's head groups.

The actors, the barrier model and what every run checks are bwd_sync_sim.py's (its description
applies); this script adds that every copy the producer issued is consumed by the kernel's end.
"""

from __future__ import annotations

import heapq
import random
import sys
from collections.abc import Iterator

from bwd_model import BwdSyncSim, count_failures
from deskcheck import negative_controls


class Sim(BwdSyncSim):
    def __init__(self, n_q: int, rng: random.Random, kt: int, bug: str = "") -> None:
        super().__init__(n_q, rng, bug)
        self.q_off = 2 * kt  # causal: first query tile
        self.n_it = n_q - 2 * kt  # causal: trip count (>= 2)

    def next_tile(self, qt: int) -> int:
        return qt + 1  # causal: no wrap

    def producer_trips(self) -> int:
        return self.n_q if self.bug == "producer_n_q" else self.n_it

    def consumer_trips(self) -> int:
        return self.n_it + (1 if self.bug == "consumer_extra" else 0)

    def check_end(self) -> None:
        # Every copy the producer issued must have been consumed by the kernel's end (a copy
        # still landing after the consumers exit writes into freed shared memory).
        consumed = len(self.PARTS) * self.n_it
        if self.issued != consumed or self.landed != consumed:
            self.errors.append(f"issued {self.issued} copies, consumed {consumed}")
        super().check_end()


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

    def cases() -> Iterator[tuple[str, BwdSyncSim]]:
        for r in range(runs):
            rng = random.Random(r)
            n_q, kt = pick(rng)
            yield f"run {r} (n_q {n_q}, kt {kt})", Sim(n_q, rng, kt)
        # Every (n_q, kt) pair, 5 runs each, so no trip count is left to chance.
        for n_q in (2, 4, 6, 8, 10, 12):
            for kt in range(n_q // 2):
                for r in range(5):
                    yield (
                        f"n_q {n_q} kt {kt} run {r}",
                        Sim(n_q, random.Random(1000 * n_q + 10 * kt + r), kt),
                    )

    total, bad = count_failures(cases())
    print(f"{total - bad}/{total} random interleavings clean")

    # Negative controls: each deliberate bug must be caught in some run.
    def failed(bug: str, r: int) -> bool:
        rng = random.Random(r)
        n_q, kt = pick(rng)
        if bug == "producer_n_q" and kt == 0:
            kt = n_q // 2 - 1  # the mismatch needs kt > 0
        return not Sim(n_q, rng, kt, bug).run()

    bugs = ("one_ds_buffer", "early_release", "parity", "producer_n_q", "consumer_extra")
    caught_all = negative_controls(bugs, runs, failed)
    sched_ok = schedule_model()
    return 1 if bad or not caught_all or not sched_ok else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
