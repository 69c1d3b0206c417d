"""Randomised interleaving model of mha_bwd_d128.cu's synchronisation (CPU only).

``python examples/expert/drafts/bwd_sync_sim.py [runs]``

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

The actors are bwd_model.BwdSyncSim's (shared with the other backward drafts), the barriers and
the driver deskcheck.py's; this script sets the query tile order.
"""

from __future__ import annotations

import random
import sys

from bwd_model import BwdSyncSim, sync_main


class Sim(BwdSyncSim):
    def __init__(self, n_q: int, rng: random.Random, stagger_kt: int | None, bug: str = "") -> None:
        super().__init__(n_q, rng, bug)
        self.q_off = (2 * stagger_kt) % n_q if stagger_kt is not None else 0


def main(argv: list[str]) -> int:
    n_qs = [2, 3, 4, 5, 8]
    return sync_main(argv, Sim, n_qs, ("one_ds_buffer", "early_release", "parity"))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
