"""Desk check of examples/expert/mha_bwd_d96.cu's shared-memory operands (CPU only).

``python examples/expert/drafts/bwd_d96_desc_check.py``

The d128 and d64 drafts' check (bwd_desc_check.py, bwd_d64_desc_check.py; the dS^T stores, the RS
fragment check and the dQ layout check come from bwd_model.py) on the model of
examples/expert/desc_check.py (imported through deskcheck.py), which also checked the
GPU-verified 64B-swizzle layout of ../mha_fwd_d96.cu: TMA boxes land row after row and every
byte address goes through the swizzle; wgmma decodes the 64-bit descriptor (its own layout type,
so the 128B dS^T operand and the 64B K operand of G5 are decoded independently) and reads
elements at the PTX ISA canonical K-major / MN-major addresses.

What the d96 kernel changes and this script checks, for every element that every k-step reads:
* three TMA boxes per tile, [rows][32] bf16 with the 64B swizzle (K, V 128 rows = 8 KB each; Q,
  dO 64 rows = 4 KB each), at the kernel's smem offsets for ring stage 0 and the last stage
  (kStages and kD are read from the .cu);
* G1 S^T = K_g Q^T and G2 dP^T = V_g dO^T: m64n64k16 SS, K-major 64B (SBO 512), 6 k-steps: box
  kk/2 (+8 KB in K/V, +4 KB in Q/dO) + 32 B x (kk % 2); warpgroup g's rows at +4 KB;
* G3 dV += P^T dO and G4 dK += dS^T Q: m64n96k16 RS, B MN-major 64B with N = 96 = three atoms
  (LBO = one 4 KB box, SBO 512), 4 k-steps of +1024 B;
* G5 dQ = dS K: A = dS MN-major 128B from the dS^T buffer (both warpgroups' stores replayed with
  the kernel's addresses), B = the K tile MN-major 64B (LBO = one 8 KB box, SBO 512), N = 96,
  8 k-steps of (+2048 B, +1024 B);
* the dQ staging (one warpgroup, the whole [64][96] fp32 tile, 12 float4 chunks per thread) ->
  TMA box {64, 96} of the 2-D map {64, B*S*H*3/2} -> dQacc fragment layout -> post kernel's
  inverse map, every (query, d) once, no box row outside the map;
* the shared-memory plan (offsets 1024-aligned, regions disjoint, total within 227 KB, kStages + 1
  over it) and the tx bytes of a stage and of kv_full against the boxes the producer issues;
* negative controls: wrong variants that the model must reject;
* that mha_bwd_causal_d96.cu has this layout, these descriptors and this wgmma issue code byte for
  byte (its causal changes lie elsewhere), so this check covers it too.
"""

from __future__ import annotations

import itertools
import pathlib
import re
import sys
import time

from bwd_model import check_dq_layout as _check_dq_layout
from bwd_model import check_rs_fragments, store_ds_t
from deskcheck import Smem, dc, make_desc64, make_desc128, tma_box_sw64, wrong_reads

# Kernel constants (mha_bwd_d96.cu), the two that vary read from the source itself.
_SRC = (pathlib.Path(__file__).parent.parent / "mha_bwd_d96.cu").read_text()
STAGES = int(re.search(r"constexpr int kStages = (\d+);", _SRC).group(1))
D = int(re.search(r"constexpr int kD = (\d+);", _SRC).group(1))
assert D == 96
ROW = 64  # bytes per box row (32 bf16)
N_BOX = D // 32  # 3
K_BOX = 128 * ROW  # 8 KB
Q_BOX = 64 * ROW  # 4 KB
K_TILE = N_BOX * K_BOX
Q_TILE = N_BOX * Q_BOX
DS_BYTES = 128 * 128
DQ_TILE = 64 * D * 4
BASE = 5 * 1024  # any 1024-aligned base


def plan(stages: int) -> dict[str, int]:
    """The kernel's kOff* constants for `stages` ring stages."""
    off = {"K": 0, "V": K_TILE, "Q": 2 * K_TILE}
    off["dO"] = off["Q"] + stages * Q_TILE
    off["DS"] = off["dO"] + stages * Q_TILE
    off["DQ"] = off["DS"] + 2 * DS_BYTES
    off["LSE"] = off["DQ"] + 2 * DQ_TILE
    off["DR"] = off["LSE"] + stages * 256
    off["BAR"] = off["DR"] + stages * 256
    off["SMEM"] = off["BAR"] + 8 * (1 + 2 * stages) + 1024
    return off


OFF = plan(STAGES)


def check_smem_plan() -> int:
    o = OFF
    regions = [(f"K{x}", o["K"] + x * K_BOX, K_BOX) for x in range(N_BOX)]
    regions += [(f"V{x}", o["V"] + x * K_BOX, K_BOX) for x in range(N_BOX)]
    for s in range(STAGES):
        regions += [(f"Q{s}.{x}", o["Q"] + s * Q_TILE + x * Q_BOX, Q_BOX) for x in range(N_BOX)]
        regions += [(f"dO{s}.{x}", o["dO"] + s * Q_TILE + x * Q_BOX, Q_BOX) for x in range(N_BOX)]
    regions += [(f"dS{b}", o["DS"] + b * DS_BYTES, DS_BYTES) for b in range(2)]
    regions += [(f"dQstage{g}", o["DQ"] + g * DQ_TILE, DQ_TILE) for g in range(2)]
    bad = sum(off % 1024 != 0 for _, off, _ in regions)
    spans = sorted((off, off + n) for _, off, n in regions)
    bad += sum(a[1] > b[0] for a, b in itertools.pairwise(spans))
    bad += spans[-1][1] != o["LSE"] or o["BAR"] % 8 != 0 or o["SMEM"] > 232448
    bad += plan(STAGES + 1)["SMEM"] <= 232448  # the header's claim: one more stage does not fit
    # tx bytes: kQStageTx = 2 kQTile + 2 x 256 against the boxes and copies the producer issues
    stage_tx = 2 * Q_TILE + 2 * 256
    issued = 2 * N_BOX * Q_BOX + 2 * 256  # 3 Q boxes + 3 dO boxes + LSE + Dr
    tx_bad = stage_tx != issued or stage_tx != 25088
    tx_bad += 2 * K_TILE != 2 * N_BOX * K_BOX or 2 * K_TILE != 49152
    tx_bad += N_BOX * 32 != D  # the box at d0 = 64 ends at d = 95: no out-of-bounds part
    total = o["SMEM"]
    print(
        f"{f'smem plan (kStages = {STAGES}): {total} B incl. 1 KB slack':>58}: "
        f"{'OK' if bad == 0 else f'{bad} problems'}"
    )
    print(
        f"{'tx bytes: stage 25,088 (6 x 4 KB + 2 x 256), kv_full 49,152':>58}: "
        f"{'OK' if tx_bad == 0 else 'WRONG'}"
    )
    return bad + tx_bad


def build_smem(stage: int, ds_xor_fn=None) -> Smem:
    smem: Smem = {}
    for x in range(N_BOX):
        tma_box_sw64(smem, BASE + OFF["K"] + x * K_BOX, "K", 128, 32 * x)
        tma_box_sw64(smem, BASE + OFF["V"] + x * K_BOX, "V", 128, 32 * x)
        tma_box_sw64(smem, BASE + OFF["Q"] + stage * Q_TILE + x * Q_BOX, "Q", 64, 32 * x)
        tma_box_sw64(smem, BASE + OFF["dO"] + stage * Q_TILE + x * Q_BOX, "dO", 64, 32 * x)
    # dS^T stores of both consumer warpgroups, buffer 1 (buf = it & 1 = 1), exactly as the kernel.
    store_ds_t(smem, BASE + OFF["DS"] + 1 * DS_BYTES, ds_xor_fn)
    return smem


def check(
    name: str,
    *,
    stage: int = 0,
    smem: Smem | None = None,
    kmajor_step=lambda kk, box: (kk // 2) * box + (kk % 2) * 32,
    k_sbo: int = 512,
    a_rows_off: int = 64 * ROW,
    q_lbo: int = Q_BOX,
    dq_b_lbo: int = K_BOX,
    dq_b_step: int = 16 * ROW,
    desc_g1=make_desc64,
) -> int:
    smem = build_smem(stage) if smem is None else smem
    wrong = 0
    sq = BASE + OFF["Q"] + stage * Q_TILE
    sdo = BASE + OFF["dO"] + stage * Q_TILE
    for g in range(2):
        # G1 / G2: A = K_g / V_g rows 64g.. (K-major), B = Q / dO stage (K-major), 6 k-steps
        for a_name, a_off, b_name, b_base in (("K", OFF["K"], "Q", sq), ("V", OFF["V"], "dO", sdo)):
            da = desc_g1(BASE + a_off + g * a_rows_off, 16, k_sbo)
            db = desc_g1(b_base, 16, k_sbo)
            for kk in range(D // 16):
                a = dc.advance(da, kmajor_step(kk, K_BOX))
                b = dc.advance(db, kmajor_step(kk, Q_BOX))
                wrong += wrong_reads(smem, a, 64, a_name, 64 * g, 16 * kk)
                wrong += wrong_reads(smem, b, 64, b_name, 0, 16 * kk)
        # G3 / G4: B = dO / Q MN-major (K = query rows, N = 96 d = 3 atoms, LBO = one box)
        for b_name, b_base in (("dO", sdo), ("Q", sq)):
            db = make_desc64(b_base, q_lbo, 512)
            for s in range(4):
                b = dc.advance(db, 16 * ROW * s)
                wrong += wrong_reads(smem, b, D, b_name, 16 * s, 0, mn_major=True, k_is_row=True)
    # G5 (run by warpgroup it & 1; the operands do not depend on g): A = dS (M = 64 queries,
    # K = 128 keys) MN-major 128B from the dS^T buffer, B = the K tile (K = keys, N = 96 d)
    # MN-major 64B. The A LBO (kDsBytes) is never used: M = 64 is one 128B atom.
    da = make_desc128(BASE + OFF["DS"] + 1 * DS_BYTES, DS_BYTES, 1024)
    db = make_desc64(BASE + OFF["K"], dq_b_lbo, 512)
    for s in range(8):
        a, b = dc.advance(da, 2048 * s), dc.advance(db, dq_b_step * s)
        wrong += wrong_reads(smem, a, 64, "dS", 0, 16 * s, mn_major=True)
        wrong += wrong_reads(smem, b, D, "K", 16 * s, 0, mn_major=True, k_is_row=True)
    print(f"{name:>58}: {'OK' if wrong == 0 else f'{wrong} wrong element reads'}")
    return wrong


def check_dq_layout(tile_floats: int = 64 * D, post_tile_div: int = 128 * 12, chunks: int = 12):
    """Staging float4 (c, t) -> global fragment layout -> post kernel's inverse map: one
    warpgroup stages the whole [64][96] fp32 tile (bwd_model.check_dq_layout, one half, 12
    chunks)."""
    return _check_dq_layout(1, tile_floats, post_tile_div, chunks)


def causal_shares_layout() -> int:
    """mha_bwd_causal_d96.cu must have this draft's layout, descriptors and wgmma issue code
    byte for byte (the causal changes are elsewhere), so this check covers it too: the text from
    the box constants to the pre kernel and the consumers' descriptor setup must be identical."""

    def parts(name: str) -> list[str]:
        src = (pathlib.Path(__file__).parent.parent / name).read_text()
        out = []
        for begin, end in (
            ("// d96: TMA boxes are", "// Dr[b, h, s] ="),
            ("  // Descriptors that do not change over the loop.", "  float dk_acc[48];"),
        ):
            i = src.index(begin)
            out.append(src[i : src.index(end, i)])
        return out

    same = parts("mha_bwd_causal_d96.cu") == parts("mha_bwd_d96.cu")
    label = "mha_bwd_causal_d96.cu: same layout/descriptor/issue code"
    print(f"{label:>58}: {'OK' if same else 'DIFFERENT'}")
    return 0 if same else 1


def main() -> int:
    t0 = time.time()
    failures = 0
    failures += check_smem_plan() != 0
    failures += causal_shares_layout() != 0
    failures += check_rs_fragments() != 0
    failures += check("all five GEMMs, both warpgroups, ring stage 0") != 0
    failures += (
        check(f"all five GEMMs, both warpgroups, ring stage {STAGES - 1}", stage=STAGES - 1) != 0
    )
    failures += check_dq_layout() != 0
    print("negative controls (each must report wrong reads):")
    failures += (
        check(
            "K-major k-steps as at 128B (box kk/4, +32 B x kk%4)",
            kmajor_step=lambda kk, box: (kk // 4) * box + (kk % 4) * 32,
        )
        == 0
    )
    failures += check("K-major SBO 1024 instead of 512", k_sbo=1024) == 0
    failures += check("A rows of warpgroup g at +8 KB (128-B rows) not +4 KB", a_rows_off=8192) == 0
    failures += check("G1/G2 with a 128B descriptor on 64B data", desc_g1=make_desc128) == 0
    failures += check("dO/Q MN-major LBO 8 KB (the K box) instead of 4 KB", q_lbo=K_BOX) == 0
    failures += check("dQ B operand LBO 4 KB (the Q box) instead of 8 KB", dq_b_lbo=Q_BOX) == 0
    failures += check("dQ B operand k-step 2048 B (128-B rows)", dq_b_step=2048) == 0
    failures += (
        check("dS^T stores without the swizzle XOR", smem=build_smem(0, ds_xor_fn=lambda t: 0)) == 0
    )
    print("negative control (must fail): post kernel tile = idx / 1024 (the d64 divisor)")
    failures += check_dq_layout(post_tile_div=1024) == 0
    print("negative control (must fail): dQacc tile of 4096 floats (the d64 size)")
    failures += check_dq_layout(tile_floats=4096) == 0
    print(f"{'FAILED' if failures else 'ALL OK'} ({time.time() - t0:.1f} s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
