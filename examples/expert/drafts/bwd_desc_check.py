"""Desk check of examples/expert/mha_bwd_d128.cu's shared-memory operands (CPU only).

``python examples/expert/drafts/bwd_desc_check.py``

The model is the one of examples/expert/desc_check.py (imported by path through deskcheck.py, as
m192_check.py does, so the GPU-verified original stays the one model): TMA boxes land row after row
and every byte address goes through the 128B swizzle; wgmma decodes the 64-bit descriptor and reads
elements at the PTX ISA canonical K-major / MN-major addresses, swizzled the same way.

Added for the backward kernel:
* the dS^T buffer is written by the consumer threads themselves: for every thread of both
  warpgroups the exact store address of the kernel (row base + (byte column ^ (lane/4) << 4)) and
  the register -> (key, query) map of the m64n64 accumulator (contracts §2) and of the packing
  df[s][k] = pack(dp[8s+2k], dp[8s+2k+1]);
* every element of all five GEMMs of one query tile is checked: G1 S^T = K_g Q^T and G2 dP^T =
  V_g dO^T (A and B K-major), G3/G4 B operand dO/Q MN-major (RS; the A fragments are checked
  against the register-A layout), G5 A = dS read MN-major from the dS^T buffer, B = K box g
  MN-major;
* the dQ staging layout: the float4 of chunk c of thread t, the [64][64] fp32 TMA box, the global
  fragment layout and the post kernel's inverse map must round-trip every (query, d) once;
* negative controls: wrong variants that the model must reject.

The dS^T stores, the RS fragment check and the dQ layout check are bwd_model.py's, shared with
bwd_d64_desc_check.py.
"""

from __future__ import annotations

import sys

from bwd_model import check_dq_layout as _check_dq_layout
from bwd_model import check_rs_fragments, store_ds_t
from deskcheck import Smem, dc, make_desc128, tma_box64, wrong_reads

# Kernel constants (mha_bwd_d128.cu)
K_BOX = 128 * 128
Q_BOX = 64 * 128
DS_BYTES = 128 * 128
BASE = 3 * 1024  # any 1024-aligned base
OFF_K = 0
OFF_V = OFF_K + 2 * K_BOX
OFF_Q = OFF_V + 2 * K_BOX  # stage 0 only: stages differ by whole 1024-aligned tiles
OFF_DO = OFF_Q + 2 * 2 * Q_BOX
OFF_DS = OFF_DO + 2 * 2 * Q_BOX


def build_smem(ds_xor_fn=None, q_box_rows: int = 64) -> Smem:
    smem: Smem = {}
    for name, off, rows, nbox_bytes in (
        ("K", OFF_K, 128, K_BOX),
        ("V", OFF_V, 128, K_BOX),
        ("Q", OFF_Q, q_box_rows, Q_BOX),
        ("dO", OFF_DO, q_box_rows, Q_BOX),
    ):
        for bx in range(2):
            tma_box64(smem, BASE + off + bx * nbox_bytes, name, rows, 64 * bx)
    # dS^T stores of both consumer warpgroups, buffer 1 (buf = it & 1 = 1), exactly as the kernel.
    store_ds_t(smem, BASE + OFF_DS + 1 * DS_BYTES, ds_xor_fn)
    return smem


def check(
    name: str,
    *,
    smem: Smem | None = None,
    q_box_stride: int = Q_BOX,
    ds_lbo: int = DS_BYTES,
    dq_trans_b_box: int = K_BOX,
    do_lbo: int = Q_BOX,
) -> int:
    smem = build_smem() if smem is None else smem
    wrong = 0
    sq, sdo = BASE + OFF_Q, BASE + OFF_DO
    for g in range(2):
        # G1 / G2: A = K_g / V_g (K-major, box stride 16 KB), B = Q / dO (K-major, 8 KB boxes)
        for a_name, a_off, b_name, b_base in (("K", OFF_K, "Q", sq), ("V", OFF_V, "dO", sdo)):
            da = make_desc128(BASE + a_off + g * 8192, 16, 1024)
            db = make_desc128(b_base, 16, 1024)
            for kk in range(8):
                in_row, box = (kk % 4) * 32, kk // 4
                a = dc.advance(da, box * K_BOX + in_row)
                b = dc.advance(db, box * q_box_stride + in_row)
                wrong += wrong_reads(smem, a, 64, a_name, 64 * g, 16 * kk)
                wrong += wrong_reads(smem, b, 64, b_name, 0, 16 * kk)
        # G3 / G4: B = dO / Q MN-major (K = query rows, N = 128 d), LBO = one 8 KB box
        for b_name, b_base in (("dO", sdo), ("Q", sq)):
            db = make_desc128(b_base, do_lbo, 1024)
            for s in range(4):
                b = dc.advance(db, 2048 * s)
                wrong += wrong_reads(smem, b, 128, b_name, 16 * s, 0, mn_major=True, k_is_row=True)
        # G5: A = dS (M = 64 queries, K = 128 keys) MN-major from the dS^T buffer,
        #     B = K box g (K = keys, N = 64 d) MN-major
        da = make_desc128(BASE + OFF_DS + 1 * DS_BYTES, ds_lbo, 1024)
        db = make_desc128(BASE + OFF_K + g * dq_trans_b_box, K_BOX, 1024)
        for s in range(8):
            a, b = dc.advance(da, 2048 * s), dc.advance(db, 2048 * s)
            wrong += wrong_reads(smem, a, 64, "dS", 0, 16 * s, mn_major=True)
            wrong += wrong_reads(smem, b, 64, "K", 16 * s, 64 * g, mn_major=True, k_is_row=True)
    print(f"{name:>58}: {'OK' if wrong == 0 else f'{wrong} wrong element reads'}")
    return wrong


def check_dq_layout() -> int:
    """Staging float4 (c, t) -> global fragment layout -> post kernel's inverse map: two [64][64]
    fp32 halves (d 0..63, 64..127) per query tile of 8192 floats."""
    return _check_dq_layout(2, 8192, 2048)


def main() -> int:
    failures = 0
    failures += check_rs_fragments() != 0
    failures += check("all five GEMMs of one query tile, both warpgroups") != 0
    failures += check_dq_layout() != 0
    print("negative controls (each must report wrong reads):")
    failures += check("Q/dO k-step box stride 16 KB instead of 8 KB", q_box_stride=K_BOX) == 0
    failures += check("dO/Q MN-major LBO 16 KB instead of 8 KB", do_lbo=K_BOX) == 0
    failures += (
        check("dS^T stores without the swizzle XOR", smem=build_smem(ds_xor_fn=lambda t: 0)) == 0
    )
    failures += (
        check(
            "dS^T XOR with the warp's row r0 % 8 of 16w+lane/4 off by one",
            smem=build_smem(ds_xor_fn=lambda t: (((t % 32) // 4 + 1) % 8) << 4),
        )
        == 0
    )
    failures += check("dQ B operand at K + g*8 KB instead of K box g", dq_trans_b_box=8192) == 0
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
