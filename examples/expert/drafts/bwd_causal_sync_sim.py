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

import sys

from bwd_model import CausalSyncSim, causal_cta_order, causal_sync_check, list_makespan


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
            rows[f"head groups of {grp}"] = [cost[kt] for kt in causal_cta_order(n_kt, bh, grp)]
        line = ", ".join(f"{k} {max(list_makespan(v), ideal) / ideal:.3f}" for k, v in rows.items())
        print(f"  B={b} H={h} S={s}: {line}")
        grouped, d128 = rows["head groups of 4"], rows["d128 order (kt fastest)"]
        ok &= list_makespan(grouped) <= list_makespan(d128)
    return ok


def main(argv: list[str]) -> int:
    runs = int(argv[0]) if argv else 300
    bugs = ("one_ds_buffer", "early_release", "parity", "producer_n_q", "consumer_extra")
    # n_q 2 .. 12: n_it 2 .. 12, odd and even, fewer and more tiles than stages.
    sync_ok = causal_sync_check(CausalSyncSim, runs, range(2, 13, 2), 5, bugs)
    sched_ok = schedule_model()
    return 0 if sync_ok and sched_ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
