"""Randomised interleaving model of mha_bwd_causal_d64.cu's synchronisation (CPU only).

``python examples/expert/drafts/bwd_causal_d64_sync_sim.py [runs]``

bwd_model.BwdSyncSim (the actors, barrier model and per-run checks of bwd_sync_sim.py) with both
of this kernel's parents' changes:
* d64 (as bwd_d64_sync_sim.py): kStages is read from mha_bwd_causal_d64.cu (4); a stage is 4
  copies (Q and dO one 8 KB box each, LSE, Dr), kv_full 2 boxes of 16 KB; G5 and the dQ
  staging/reduce run only in warpgroup it & 1, the other warpgroup waits for G3/G4 (wait<0>) and
  releases the stage; named barriers count arrivals per generation;
* causal (bwd_model.CausalSyncSim, as bwd_causal_sync_sim.py): CTA kt streams query tiles
  2kt .. n_q - 1 (n_it = n_q - 2kt, even) without wrap-around, so the 4-stage ring's phases end at
  a different place per CTA, and every copy the producer issued must be consumed by the end.

Runs: `runs` random (n_q, kt), plus 3 runs of every (n_q, kt) with n_q = 2 .. 18 (n_it 2 .. 18:
fewer and more tiles than stages, the ring ending at stage 0 or 2 with either parity). Each run
checks: no deadlock; each stage read holds tile 2kt + it; no copy lands under a reader; the dS^T
double buffer is never rewritten under a G5 and G5 sees both halves of its own tile; no named
barrier double arrival; every issued copy consumed.

Negative controls, each must be caught in some run: one dS^T buffer, early stage release, wrong
producer parity, arrive_only (the non-G5 warpgroup only arrives at the dS^T barrier),
producer_n_q (the producer runs the non-causal n_q tiles), consumer_extra (one tile too many).

Second part, the CTA-order model behind kHeadGroup (read from the .cu): greedy list scheduling
of the CTAs in launch order on 132 SMs (bwd_model.list_makespan; CTA kt costs n_q - 2kt
tile-times plus a start cost), blockIdx.x decoded exactly as the kernel decodes it
(bwd_model.causal_cta_order, every (kt, head) once). A d64 tile takes about half the d128 time
while a CTA's start (K/V load, epilogue) does not shrink as much, so start costs 1 and 2
tile-times are both shown; the kernel's order must not be worse than the d64 draft's (key tile
fastest) on the task's workload.
"""

from __future__ import annotations

import pathlib
import re
import sys
import time

from bwd_model import CausalSyncSim, causal_cta_order, causal_sync_check, list_makespan

_SRC = (pathlib.Path(__file__).parent.parent / "mha_bwd_causal_d64.cu").read_text()
HEAD_GROUP = int(re.search(r"constexpr int kHeadGroup = (\d+);", _SRC).group(1))
N_QS = tuple(range(2, 20, 2))  # S % 128 == 0: n_q even


class Sim(CausalSyncSim):
    STAGES = int(re.search(r"constexpr int kStages = (\d+);", _SRC).group(1))
    PARTS = (("Q", 8192), ("dO", 8192), ("LSE", 256), ("Dr", 256))
    KV_BOXES = 2  # d64: K and V, one 16 KB box each

    def g5_runs(self, g: int, it: int) -> bool:
        return (it & 1) == g  # d64: the G5 warpgroup of this tile


def schedule_model() -> bool:
    """Prints makespan / perfect split per CTA order (rows) and workload (columns), for start
    costs 1 | 2 tile-times; True if the kernel's order is no worse than the d64 draft's on the
    task's workload."""
    workloads = ((4, 16, 4096), (2, 16, 4096), (4, 16, 2048), (1, 12, 8192), (3, 5, 1024))
    names = ["d64 order (kt fastest)", "kt slowest"]
    names += [f"groups of {grp}" for grp in sorted({2, HEAD_GROUP, 8})]
    table: dict[str, list[str]] = {name: [] for name in names}
    ok = True
    for b, h, s in workloads:
        n_q, n_kt, bh = s // 64, s // 128, b * h
        cost = [n_q - 2 * kt for kt in range(n_kt)]
        orders = {
            names[0]: [cost[kt] for _ in range(bh) for kt in range(n_kt)],
            names[1]: [cost[kt] for kt in range(n_kt) for _ in range(bh)],
        }
        for grp in sorted({2, HEAD_GROUP, 8}):
            orders[f"groups of {grp}"] = [cost[kt] for kt in causal_cta_order(n_kt, bh, grp)]
        for name, costs in orders.items():
            ratios = []
            for start in (1.0, 2.0):
                ideal = sum(c + start for c in cost) * bh / 132
                ratios.append(max(list_makespan(costs, start=start), ideal) / ideal)
            table[name].append(f"{ratios[0]:.3f} | {ratios[1]:.3f}")
        if (b, h, s) == (4, 16, 4096):
            for start in (1.0, 2.0):
                mine = list_makespan(orders[f"groups of {HEAD_GROUP}"], start=start)
                ok &= mine <= list_makespan(orders[names[0]], start=start)
    print(
        f"CTA order model (kernel: groups of {HEAD_GROUP}): makespan / perfect split on 132 SMs, "
        "start cost 1 | 2 tile-times"
    )
    print(f"  {'order':<24}" + "".join(f"{f'B{b} H{h} S{s}':>16}" for b, h, s in workloads))
    for name, cells in table.items():
        print(f"  {name:<24}" + "".join(f"{c:>16}" for c in cells))
    print(f"  kernel order no worse than the d64 order at B4 H16 S4096: {'OK' if ok else 'NO'}")
    return ok


def main(argv: list[str]) -> int:
    t0 = time.time()
    runs = int(argv[0]) if argv else 300
    print(f"kStages = {Sim.STAGES} (from the .cu), n_q in {N_QS[0]}..{N_QS[-1]}")

    bugs = (
        "one_ds_buffer",
        "early_release",
        "parity",
        "arrive_only",
        "producer_n_q",
        "consumer_extra",
    )
    # Every (n_q, kt) pair 3 times beside the random runs.
    sync_ok = causal_sync_check(Sim, runs, N_QS, 3, bugs)
    sched_ok = schedule_model()
    ok = sync_ok and sched_ok
    print(f"{'ALL OK' if ok else 'SOME FAILED'} ({time.time() - t0:.1f} s)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
