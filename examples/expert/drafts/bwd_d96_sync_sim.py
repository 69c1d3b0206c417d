"""Randomised interleaving model of mha_bwd_d96.cu's synchronisation (CPU only).

``python examples/expert/drafts/bwd_d96_sync_sim.py [runs]``

The d128 draft's simulation (bwd_sync_sim.py; all use bwd_model.BwdSyncSim and deskcheck.py's
barriers and driver) changed where the d96 kernel changes:
* kStages is read from mha_bwd_d96.cu (3: the ring's phase flips at a stage count that does not
  divide the even tile counts, so the producer's and consumers' (stage, parity) pairs are
  exercised across the wrap); a stage is 8 copies (Q and dO as three 4 KB boxes each, LSE, Dr:
  25,088 tx bytes), kv_full 6 boxes of 8 KB (K and V, three each);
* G5 and the dQ staging/reduce run only in warpgroup it & 1 (the d64 draft's split); only that
  warpgroup is a reader of the dS^T buffer, and only it passes its staging barriers; the other
  warpgroup waits for G3/G4 (wait<0>) and releases the stage;
* named barriers are counted per generation (deskcheck.NamedBarriers), so a warpgroup arriving
  twice in one generation is reported.

Checked on every run: no deadlock; every stage read sees all 8 parts of the tile it expects; no
copy lands in a stage still being read; no dS^T half is rewritten while a G5 may read it; G5 reads
both halves of the current iteration; kv_full passes only after all 6 boxes landed; no tx bytes
left on a barrier. Negative controls, each must be caught: one dS^T buffer, releasing the stage
before G3/G4 retire, the producer waiting with the wrong parity, and "arrive_only" (the non-G5
warpgroup only arrives at the dS^T barrier).
"""

from __future__ import annotations

import pathlib
import random
import re
import sys
import time

from bwd_model import BwdSyncSim, sync_main

_SRC = (pathlib.Path(__file__).parent.parent / "mha_bwd_d96.cu").read_text()


class Sim(BwdSyncSim):
    STAGES = int(re.search(r"constexpr int kStages = (\d+);", _SRC).group(1))
    PARTS = (
        *((f"{name}{x}", 4096) for name in ("Q", "dO") for x in range(3)),
        ("LSE", 256),
        ("Dr", 256),
    )
    KV_BOXES = 6  # d96: K and V, three [128][32] boxes each
    KV_BOX_BYTES = 8192

    def __init__(self, n_q: int, rng: random.Random, stagger_kt: int | None, bug: str = "") -> None:
        super().__init__(n_q, rng, bug)
        self.q_off = (2 * stagger_kt) % n_q if stagger_kt is not None else 0

    def g5_runs(self, g: int, it: int) -> bool:
        return (it & 1) == g  # d96: the G5 warpgroup of this tile


def main(argv: list[str]) -> int:
    t0 = time.time()
    assert sum(nb for _, nb in Sim.PARTS) == 25088, "stage tx != the kernel's kQStageTx"
    n_qs = [2, 4, 6, 8, 10]  # S % 128 == 0: n_q even
    rc = sync_main(argv, Sim, n_qs, ("one_ds_buffer", "early_release", "parity", "arrive_only"))
    print(f"{'FAILED' if rc else 'ALL OK'} ({time.time() - t0:.1f} s)")
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
