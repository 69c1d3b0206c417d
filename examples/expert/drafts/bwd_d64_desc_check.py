"""Desk check of examples/expert/mha_bwd_d64.cu's shared-memory operands (CPU only).

``python examples/expert/drafts/bwd_d64_desc_check.py``

The d128 draft's check (bwd_desc_check.py; both take the dS^T stores, the RS fragment check and
the dQ layout check from bwd_model.py) on the model of examples/expert/desc_check.py (imported
through deskcheck.py): TMA boxes land row after row and every byte address goes through
the 128B swizzle; wgmma decodes the 64-bit descriptor and reads elements at the PTX ISA canonical
K-major / MN-major addresses, swizzled the same way.

What the d64 kernel changes and this script checks, for every element that every k-step reads:
* one TMA box per tile (K, V [128][64]; Q, dO [64][64]), at the kernel's smem offsets for
  stage 0 and the last stage (kStages is read from the .cu);
* G1 S^T = K_g Q^T and G2 dP^T = V_g dO^T: m64n64k16 SS, 4 k-steps of +32 B in the row;
* G3 dV += P^T dO and G4 dK += dS^T Q: m64n64k16 RS, B MN-major with N = 64 (one atom column,
  LBO unused: the check passes a poisoned LBO to prove it), 4 k-steps of +2048 B;
* G5 dQ = dS K: A = dS MN-major from the dS^T buffer (both warpgroups' stores replayed with the
  kernel's addresses), B = the whole K tile MN-major, 8 k-steps of +2048 B;
* the dQ staging (one warpgroup, the whole [64][64] fp32 tile) -> TMA box {64, 64} of the 2-D map
  {64, B*S*H} -> dQacc fragment layout -> post kernel's inverse map, every (query, d) once;
* the shared-memory plan: offsets 1024-aligned, regions disjoint, total within 227 KB;
* negative controls: wrong variants that the model must reject.
"""

from __future__ import annotations

import itertools
import pathlib
import re
import sys

from bwd_model import check_dq_layout as _check_dq_layout
from bwd_model import check_rs_fragments, store_ds_t
from deskcheck import Smem, dc, make_desc128, tma_box64, wrong_reads

# Kernel constants (mha_bwd_d64.cu), the two that vary read from the source itself.
_SRC = (pathlib.Path(__file__).parent.parent / "mha_bwd_d64.cu").read_text()
STAGES = int(re.search(r"constexpr int kStages = (\d+);", _SRC).group(1))
D = int(re.search(r"constexpr int kD = (\d+);", _SRC).group(1))
assert D == 64
K_TILE = 128 * 128  # one box
Q_TILE = 64 * 128  # one box
DS_BYTES = 128 * 128
DQ_TILE = 64 * 64 * 4
BASE = 3 * 1024  # any 1024-aligned base
OFF_K = 0
OFF_V = OFF_K + K_TILE
OFF_Q = OFF_V + K_TILE
OFF_DO = OFF_Q + STAGES * Q_TILE
OFF_DS = OFF_DO + STAGES * Q_TILE
OFF_DQ = OFF_DS + 2 * DS_BYTES
OFF_LSE = OFF_DQ + 2 * DQ_TILE
OFF_DR = OFF_LSE + STAGES * 256
OFF_BAR = OFF_DR + STAGES * 256
SMEM_BYTES = OFF_BAR + 8 * (1 + 2 * STAGES) + 1024


def check_smem_plan() -> int:
    regions = [("K", OFF_K, K_TILE), ("V", OFF_V, K_TILE)]
    regions += [(f"Q{s}", OFF_Q + s * Q_TILE, Q_TILE) for s in range(STAGES)]
    regions += [(f"dO{s}", OFF_DO + s * Q_TILE, Q_TILE) for s in range(STAGES)]
    regions += [(f"dS{b}", OFF_DS + b * DS_BYTES, DS_BYTES) for b in range(2)]
    regions += [(f"dQstage{g}", OFF_DQ + g * DQ_TILE, DQ_TILE) for g in range(2)]
    bad = sum(off % 1024 != 0 for _, off, _ in regions)
    spans = sorted((off, off + n) for _, off, n in regions)
    bad += sum(a[1] > b[0] for a, b in itertools.pairwise(spans))
    bad += spans[-1][1] != OFF_LSE or OFF_BAR % 8 != 0 or SMEM_BYTES > 232448
    print(
        f"{f'smem plan (kStages = {STAGES}): {SMEM_BYTES} B incl. 1 KB slack':>58}: "
        f"{'OK' if bad == 0 else f'{bad} problems'}"
    )
    return bad


def build_smem(stage: int, ds_xor_fn=None) -> Smem:
    smem: Smem = {}
    tma_box64(smem, BASE + OFF_K, "K", 128, 0)
    tma_box64(smem, BASE + OFF_V, "V", 128, 0)
    tma_box64(smem, BASE + OFF_Q + stage * Q_TILE, "Q", 64, 0)
    tma_box64(smem, BASE + OFF_DO + stage * Q_TILE, "dO", 64, 0)
    # dS^T stores of both consumer warpgroups, buffer 1 (buf = it & 1 = 1), exactly as the kernel.
    store_ds_t(smem, BASE + OFF_DS + 1 * DS_BYTES, ds_xor_fn)
    return smem


def check(
    name: str,
    *,
    stage: int = 0,
    smem: Smem | None = None,
    kstep: int = 32,
    mn_lbo: int = 0x3FFF0,  # poisoned: N = 64 must never use LBO
    mn_sbo: int = 1024,
    dq_b_off: int = 0,
    a_rows_off: int = 8192,
) -> int:
    smem = build_smem(stage) if smem is None else smem
    wrong = 0
    sq, sdo = BASE + OFF_Q + stage * Q_TILE, BASE + OFF_DO + stage * Q_TILE
    for g in range(2):
        # G1 / G2: A = K_g / V_g rows 64g.. (K-major), B = Q / dO stage (K-major), 4 k-steps
        for a_name, a_off, b_name, b_base in (("K", OFF_K, "Q", sq), ("V", OFF_V, "dO", sdo)):
            da = make_desc128(BASE + a_off + g * a_rows_off, 16, 1024)
            db = make_desc128(b_base, 16, 1024)
            for kk in range(4):
                a, b = dc.advance(da, kk * kstep), dc.advance(db, kk * kstep)
                wrong += wrong_reads(smem, a, 64, a_name, 64 * g, 16 * kk)
                wrong += wrong_reads(smem, b, 64, b_name, 0, 16 * kk)
        # G3 / G4: B = dO / Q MN-major (K = query rows, N = 64 d), one atom column
        for b_name, b_base in (("dO", sdo), ("Q", sq)):
            db = make_desc128(b_base, mn_lbo, mn_sbo)
            for s in range(4):
                b = dc.advance(db, 2048 * s)
                wrong += wrong_reads(smem, b, 64, b_name, 16 * s, 0, mn_major=True, k_is_row=True)
    # G5 (run by warpgroup it & 1; the operands do not depend on g): A = dS (M = 64 queries,
    # K = 128 keys) MN-major from the dS^T buffer, B = the K tile (K = keys, N = 64 d) MN-major.
    da = make_desc128(BASE + OFF_DS + 1 * DS_BYTES, mn_lbo, mn_sbo)
    db = make_desc128(BASE + OFF_K + dq_b_off, mn_lbo, mn_sbo)
    for s in range(8):
        a, b = dc.advance(da, 2048 * s), dc.advance(db, 2048 * s)
        wrong += wrong_reads(smem, a, 64, "dS", 0, 16 * s, mn_major=True)
        wrong += wrong_reads(smem, b, 64, "K", 16 * s, 0, mn_major=True, k_is_row=True)
    print(f"{name:>58}: {'OK' if wrong == 0 else f'{wrong} wrong element reads'}")
    return wrong


def check_dq_layout(tile_floats: int = 4096, post_tile_div: int = 1024) -> int:
    """Staging float4 (c, t) -> global fragment layout -> post kernel's inverse map: one
    warpgroup stages the whole [64][64] fp32 tile (bwd_model.check_dq_layout with one half)."""
    return _check_dq_layout(1, tile_floats, post_tile_div)


def main() -> int:
    failures = 0
    failures += check_smem_plan() != 0
    failures += check_rs_fragments() != 0
    failures += check("all five GEMMs, both warpgroups, ring stage 0") != 0
    failures += (
        check(f"all five GEMMs, both warpgroups, ring stage {STAGES - 1}", stage=STAGES - 1) != 0
    )
    failures += check_dq_layout() != 0
    print("negative controls (each must report wrong reads):")
    failures += check("K-major k-step 64 B instead of 32 B", kstep=64) == 0
    failures += check("A rows of warpgroup g at +16 KB (d128 box) not +8 KB", a_rows_off=16384) == 0
    failures += check("MN-major SBO 2048 instead of 1024", mn_sbo=2048) == 0
    failures += (
        check("dS^T stores without the swizzle XOR", smem=build_smem(0, ds_xor_fn=lambda t: 0)) == 0
    )
    failures += check("dQ B operand at K + 64 B (a half-atom d split)", dq_b_off=64) == 0
    print("negative control (must fail): dQacc tile of 8192 floats (the d128 layout)")
    failures += check_dq_layout(tile_floats=8192, post_tile_div=1024) == 0
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
