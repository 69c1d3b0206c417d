"""Randomised interleaving model of mha_bwd_d64.cu's synchronisation (CPU only).

``python examples/expert/drafts/bwd_d64_sync_sim.py [runs]``

The d128 draft's simulation (bwd_sync_sim.py; both use bwd_model.BwdSyncSim and deskcheck.py's
barriers and driver) changed where the d64 kernel changes:
* kStages is read from mha_bwd_d64.cu (4); a stage is 4 copies (Q and dO one 8 KB box each, LSE,
  Dr), kv_full 2 boxes of 16 KB;
* G5 and the dQ staging/reduce run only in warpgroup it & 1; only that warpgroup is a reader of
  the dS^T buffer, and only it passes its staging barriers; the other warpgroup waits for G3/G4
  (wait<0>) and releases the stage;
* named barriers are modelled as the hardware counts them (deskcheck.NamedBarriers: arrivals per
  generation, a generation completes at the expected count), so a warpgroup arriving twice in
  one generation is reported. Negative control "arrive_only": the non-G5 warpgroup only
  ARRIVES at the dS^T barrier (bar.arrive instead of bar.sync), which lets it run a tile ahead
  and arrive twice.

The actors, the barrier model and what every run checks are bwd_sync_sim.py's (its description
applies otherwise unchanged).
"""

from __future__ import annotations

import pathlib
import random
import re
import sys

from bwd_model import BwdSyncSim, sync_main

_SRC = (pathlib.Path(__file__).parent.parent / "mha_bwd_d64.cu").read_text()


class Sim(BwdSyncSim):
    STAGES = int(re.search(r"constexpr int kStages = (\d+);", _SRC).group(1))
    PARTS = (("Q", 8192), ("dO", 8192), ("LSE", 256), ("Dr", 256))
    KV_BOXES = 2  # d64: K and V, one box each

    def __init__(self, n_q: int, rng: random.Random, stagger_kt: int | None, bug: str = "") -> None:
        super().__init__(n_q, rng, bug)
        self.q_off = (2 * stagger_kt) % n_q if stagger_kt is not None else 0

    def g5_runs(self, g: int, it: int) -> bool:
        return (it & 1) == g  # d64: the G5 warpgroup of this tile


def main(argv: list[str]) -> int:
    n_qs = [2, 4, 6, 8, 10]  # S % 128 == 0: n_q even
    return sync_main(argv, Sim, n_qs, ("one_ds_buffer", "early_release", "parity", "arrive_only"))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
