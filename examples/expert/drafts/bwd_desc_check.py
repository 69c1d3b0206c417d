"""Desk check of examples/expert/drafts/mha_bwd_d128.cu's shared-memory operands (CPU only).

``python examples/expert/drafts/bwd_desc_check.py``

The model is the one of examples/expert/desc_check.py (functions copied, not imported, so the
GPU-verified original stays untouched): TMA boxes land row after row and every byte address goes
through the 128B swizzle; wgmma decodes the 64-bit descriptor and reads elements at the PTX ISA
canonical K-major / MN-major addresses, swizzled the same way.

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
"""

from __future__ import annotations

import sys

_T = 8  # bf16 elements per 16 B
SPAN = 128

Smem = dict[int, tuple]


def swizzle(addr: int) -> int:
    return addr ^ (((addr >> 7) & 7) << 4)


def tma_box(smem: Smem, base: int, name: str, rows: int, d0: int) -> None:
    """One TMA box [rows][64] bf16 of tensor `name`, columns d0.., written at `base` (swizzled)."""
    for r in range(rows):
        for e in range(64):
            smem[swizzle(base + r * 128 + 2 * e)] = (name, r, d0 + e)


def make_desc(start: int, lbo: int, sbo: int) -> int:
    """ptx::make_smem_desc with layout 1 (128B swizzle)."""
    desc = ((start & 0x3FFFF) >> 4) | (((lbo & 0x3FFFF) >> 4) << 16)
    desc |= ((sbo & 0x3FFFF) >> 4) << 32
    return desc | (1 << 62)


def advance(desc: int, nbytes: int) -> int:
    assert nbytes % 16 == 0
    return desc + (nbytes >> 4)


def _decode(desc: int) -> tuple[int, int, int]:
    assert (desc >> 14) & 3 == 0, "start address overflowed its 14-bit field"
    assert (desc >> 49) & 7 == 0, "base_offset must stay 0"
    assert (desc >> 62) & 3 == 1
    return (desc & 0x3FFF) << 4, ((desc >> 16) & 0x3FFF) << 4, ((desc >> 32) & 0x3FFF) << 4


def read_kmajor(smem: Smem, desc: int, mn: int, k: int):
    start, _lbo, sbo = _decode(desc)
    x = SPAN // 16
    off = (mn % 8) * x * _T + (k % _T) + (k // _T) * _T
    return smem.get(swizzle(start + 2 * off + (mn // 8) * sbo))


def read_mnmajor(smem: Smem, desc: int, mn: int, k: int):
    start, lbo, sbo = _decode(desc)
    x = SPAN // 16
    a, b, c = mn % _T, (mn // _T) % x, mn // (_T * x)
    addr = start + 2 * (a + _T * b + x * _T * (k % 8)) + c * lbo + (k // 8) * sbo
    return smem.get(swizzle(addr))


def acc_coord(t: int, i: int) -> tuple[int, int]:
    """contracts §2: (row, col) of f32 accumulator register i of thread t (m64nN)."""
    w, lane = t // 32, t % 32
    return 16 * w + lane // 4 + 8 * ((i // 2) % 2), 8 * (i // 4) + 2 * (lane % 4) + (i % 2)


def afrag_coord(t: int, reg: int, half: int) -> tuple[int, int]:
    """contracts §2 register-A fragment: (row, k) of bf16 `half` (0 = low) of a[reg]."""
    w, lane = t // 32, t % 32
    r0, q = 16 * w + lane // 4, lane % 4
    row = r0 + 8 * (reg % 2)
    k = 2 * q + 8 * (reg // 2) + half
    return row, k


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
            tma_box(smem, BASE + off + bx * nbox_bytes, name, rows, 64 * bx)
    # dS^T stores of both consumer warpgroups, buffer 1 (buf = it & 1 = 1), exactly as the kernel.
    buf = 1
    ds = BASE + OFF_DS + buf * DS_BYTES
    for g in range(2):
        for t in range(128):
            lane = t % 32
            r0 = 16 * (t // 32) + lane // 4
            q4 = lane % 4
            ds_row0 = (64 * g + r0) * 128
            ds_row1 = ds_row0 + 8 * 128
            ds_xor = (lane // 4) << 4 if ds_xor_fn is None else ds_xor_fn(t)
            for s in range(4):
                col0 = (32 * s + 4 * q4) ^ ds_xor
                col1 = (32 * s + 16 + 4 * q4) ^ ds_xor
                for k, addr in (
                    (0, ds_row0 + col0),
                    (1, ds_row1 + col0),
                    (2, ds_row0 + col1),
                    (3, ds_row1 + col1),
                ):
                    # df[s][k] = pack(dp[8s + 2k], dp[8s + 2k + 1]): low half at the lower address
                    for half in range(2):
                        i = 8 * s + 2 * k + half
                        row, col = acc_coord(t, i)  # dS^T row = key within g, col = query
                        key_el = ("dS", col, 64 * g + row)  # stored as dS[query][key]
                        a = ds + addr + 2 * half
                        assert a not in smem, "two stores to one dS^T element"
                        smem[a] = key_el
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
            da = make_desc(BASE + a_off + g * 8192, 16, 1024)
            db = make_desc(b_base, 16, 1024)
            for kk in range(8):
                in_row, box = (kk % 4) * 32, kk // 4
                a = advance(da, box * K_BOX + in_row)
                b = advance(db, box * q_box_stride + in_row)
                for k in range(16):
                    wrong += sum(
                        read_kmajor(smem, a, m, k) != (a_name, 64 * g + m, 16 * kk + k)
                        for m in range(64)
                    )
                    wrong += sum(
                        read_kmajor(smem, b, n, k) != (b_name, n, 16 * kk + k) for n in range(64)
                    )
        # G3 / G4: B = dO / Q MN-major (K = query rows, N = 128 d), LBO = one 8 KB box
        for b_name, b_base in (("dO", sdo), ("Q", sq)):
            db = make_desc(b_base, do_lbo, 1024)
            for s in range(4):
                b = advance(db, 2048 * s)
                for k in range(16):
                    wrong += sum(
                        read_mnmajor(smem, b, n, k) != (b_name, 16 * s + k, n) for n in range(128)
                    )
        # G5: A = dS (M = 64 queries, K = 128 keys) MN-major from the dS^T buffer,
        #     B = K box g (K = keys, N = 64 d) MN-major
        da = make_desc(BASE + OFF_DS + 1 * DS_BYTES, ds_lbo, 1024)
        db = make_desc(BASE + OFF_K + g * dq_trans_b_box, K_BOX, 1024)
        for s in range(8):
            a, b = advance(da, 2048 * s), advance(db, 2048 * s)
            for k in range(16):
                wrong += sum(
                    read_mnmajor(smem, a, m, k) != ("dS", m, 16 * s + k) for m in range(64)
                )
                wrong += sum(
                    read_mnmajor(smem, b, n, k) != ("K", 16 * s + k, 64 * g + n) for n in range(64)
                )
    print(f"{name:>58}: {'OK' if wrong == 0 else f'{wrong} wrong element reads'}")
    return wrong


def check_rs_fragments() -> int:
    """pf[s][k] = pack(acc[8s+2k], acc[8s+2k+1]) must be the register-A fragment of k-step s."""
    wrong = 0
    for t in range(128):
        for s in range(4):
            for k in range(4):
                for half in range(2):
                    row, col = acc_coord(t, 8 * s + 2 * k + half)
                    frow, fk = afrag_coord(t, k, half)
                    wrong += (row, col) != (frow, 16 * s + fk)
    print(
        f"{'RS A fragments from the m64n64 accumulator (P^T, dS^T)':>58}: "
        f"{'OK' if wrong == 0 else f'{wrong} wrong'}"
    )
    return wrong


def check_dq_layout() -> int:
    """Staging float4 (c, t) -> global fragment layout -> post kernel's inverse map."""
    n_q, H, S = 4, 3, 256
    B = 2
    seen: dict[tuple, int] = {}
    wrong = 0
    for b in range(B):
        for h in range(H):
            for qt in range(n_q):
                for g in range(2):
                    # kernel: tensor-map row (64 floats) of this half, box of 64 rows
                    dq_row_bh = (b * H + h) * n_q * (8192 // 64) + g * 64
                    row0 = dq_row_bh + qt * (8192 // 64)
                    for t in range(128):
                        for c in range(8):
                            for e in range(4):
                                # staging byte (128c + t) * 16 + 4e, box row-major [64][64] fp32
                                sbyte = (128 * c + t) * 16 + 4 * e
                                gfloat = row0 * 64 + sbyte // 4
                                qrow, dcol = acc_coord(t, 4 * c + e)  # m64n64: row = q, col = d
                                truth = (b, qt * 64 + qrow, h, 64 * g + dcol)
                                # post kernel: idx = float4 index, element e of it
                                idx = gfloat // 4
                                assert gfloat % 4 == e
                                tt = idx % 128
                                cc = (idx // 128) % 8
                                gg = (idx // 1024) % 2
                                tile = idx // 2048
                                qq = tile % n_q
                                bh = tile // n_q
                                hh, bb = bh % H, bh // H
                                r0 = 16 * (tt // 32) + (tt % 32) // 4
                                col = 64 * gg + 8 * cc + 2 * (tt % 4)
                                row = qq * 64 + r0
                                post = (bb, row + 8 * (e // 2), hh, col + (e % 2))
                                wrong += post != truth
                                seen[truth] = seen.get(truth, 0) + 1
    full = B * S * H * 128
    ok = wrong == 0 and len(seen) == full and all(v == 1 for v in seen.values())
    print(
        f"{'dQ staging -> dQacc fragment layout -> post kernel':>58}: "
        f"{'OK' if ok else f'{wrong} wrong, {len(seen)}/{full} covered'}"
    )
    return 0 if ok else 1


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
