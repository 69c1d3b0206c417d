"""Randomised interleaving model of mha_bwd_causal_d96.cu's synchronisation (CPU only).

``python examples/expert/drafts/bwd_causal_d96_sync_sim.py [runs]``

The causal d128 draft's simulation (bwd_causal_sync_sim.py: CTA kt streams query tiles
2kt .. n_q - 1, n_it = n_q - 2kt tiles, producer and consumers alike, no wrap; every copy the
producer issued must be consumed by the kernel's end) combined with the d96 draft's
(bwd_d96_sync_sim.py: kStages read from the .cu (3), 8 copies per stage (3 + 3 boxes of 4 KB,
LSE, Dr), kv_full 6 boxes of 8 KB, G5 and the dQ staging only in warpgroup it & 1). Both classes
are imported, not copied; this script only joins them.

Runs: 300 random ones plus 5 of every (n_q, kt) with n_q = 2 .. 12 (n_it 2 .. 12 against 3
stages: the ring's phases end anywhere). Each run checks what bwd_model.BwdSyncSim checks (no
deadlock, every stage read holds tile 2kt + it, no copy lands under a reader, the dS^T double
buffer, G5 sees both halves) plus the causal end check. Negative controls, each must be caught:
one dS^T buffer, early stage release, wrong producer parity, arrive_only (the non-G5 warpgroup only
arrives at the dS^T barrier), the producer running the non-causal n_q tiles, a consumer running one
tile too many.

The CTA order (blockIdx.x -> kt, head) is the causal d128 draft's: the script asserts that the
decode lines of the two .cu files are the same text, so bwd_causal_sync_sim.py's schedule model
(which decodes exactly those lines) applies unchanged and is not rerun here.
"""

from __future__ import annotations

import pathlib
import sys
import time

from bwd_d96_sync_sim import Sim as D96Sim
from bwd_model import CausalSyncSim, causal_sync_check

_DIR = pathlib.Path(__file__).parent.parent  # the shipped kernels, in ../


class Sim(CausalSyncSim):
    """The causal trip counts and end check (CausalSyncSim) with the d96 stages, copies and G5
    split (D96Sim's attributes and g5_runs)."""

    STAGES = D96Sim.STAGES
    PARTS = D96Sim.PARTS
    KV_BOXES = D96Sim.KV_BOXES
    KV_BOX_BYTES = D96Sim.KV_BOX_BYTES
    g5_runs = D96Sim.g5_runs


def block_decode(name: str) -> str:
    """The blockIdx.x -> (kt, b, h) lines of a causal draft."""
    src = (_DIR / name).read_text()
    start = src.index("  const int grp = static_cast<int>(blockIdx.x)")
    return src[start : src.index("  const int b = bh / H;", start)]


def main(argv: list[str]) -> int:
    t0 = time.time()
    runs = int(argv[0]) if argv else 300
    src = (_DIR / "mha_bwd_causal_d96.cu").read_text()
    assert f"constexpr int kStages = {Sim.STAGES};" in src, "kStages differs from the d96 draft's"
    assert Sim.g5_runs(Sim, 0, 2) and not Sim.g5_runs(Sim, 1, 2), "G5 split is not it & 1"

    bugs = (
        "one_ds_buffer",
        "early_release",
        "parity",
        "arrive_only",
        "producer_n_q",
        "consumer_extra",
    )
    sync_ok = causal_sync_check(Sim, runs, range(2, 13, 2), 5, bugs)
    same = block_decode("mha_bwd_causal_d96.cu") == block_decode("mha_bwd_causal_d128.cu")
    print(f"CTA block decode identical to mha_bwd_causal_d128.cu's: {'OK' if same else 'NO'}")
    rc = 1 if not sync_ok or not same else 0
    print(f"{'FAILED' if rc else 'ALL OK'} ({time.time() - t0:.1f} s)")
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
