"""Desk check of examples/expert/drafts/mha_bwd_d64.cu's shared-memory operands (CPU only).

``python examples/expert/drafts/bwd_d64_desc_check.py``

Copied from bwd_desc_check.py (the d128 draft's check, left untouched), itself the model of
examples/expert/desc_check.py: TMA boxes land row after row and every byte address goes through
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


# Kernel constants (mha_bwd_d64.cu), the two that vary read from the source itself.
_SRC = (pathlib.Path(__file__).parent / "mha_bwd_d64.cu").read_text()
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
    tma_box(smem, BASE + OFF_K, "K", 128, 0)
    tma_box(smem, BASE + OFF_V, "V", 128, 0)
    tma_box(smem, BASE + OFF_Q + stage * Q_TILE, "Q", 64, 0)
    tma_box(smem, BASE + OFF_DO + stage * Q_TILE, "dO", 64, 0)
    # dS^T stores of both consumer warpgroups, buffer 1 (buf = it & 1 = 1), exactly as the kernel.
    ds = BASE + OFF_DS + 1 * DS_BYTES
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
                    for half in range(2):
                        i = 8 * s + 2 * k + half
                        row, col = acc_coord(t, i)  # dS^T row = key within g, col = query
                        a = ds + addr + 2 * half
                        assert a not in smem, "two stores to one dS^T element"
                        smem[a] = ("dS", col, 64 * g + row)  # stored as dS[query][key]
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
            da = make_desc(BASE + a_off + g * a_rows_off, 16, 1024)
            db = make_desc(b_base, 16, 1024)
            for kk in range(4):
                a, b = advance(da, kk * kstep), advance(db, kk * kstep)
                for k in range(16):
                    wrong += sum(
                        read_kmajor(smem, a, m, k) != (a_name, 64 * g + m, 16 * kk + k)
                        for m in range(64)
                    )
                    wrong += sum(
                        read_kmajor(smem, b, n, k) != (b_name, n, 16 * kk + k) for n in range(64)
                    )
        # G3 / G4: B = dO / Q MN-major (K = query rows, N = 64 d), one atom column
        for b_name, b_base in (("dO", sdo), ("Q", sq)):
            db = make_desc(b_base, mn_lbo, mn_sbo)
            for s in range(4):
                b = advance(db, 2048 * s)
                for k in range(16):
                    wrong += sum(
                        read_mnmajor(smem, b, n, k) != (b_name, 16 * s + k, n) for n in range(64)
                    )
    # G5 (run by warpgroup it & 1; the operands do not depend on g): A = dS (M = 64 queries,
    # K = 128 keys) MN-major from the dS^T buffer, B = the K tile (K = keys, N = 64 d) MN-major.
    da = make_desc(BASE + OFF_DS + 1 * DS_BYTES, mn_lbo, mn_sbo)
    db = make_desc(BASE + OFF_K + dq_b_off, mn_lbo, mn_sbo)
    for s in range(8):
        a, b = advance(da, 2048 * s), advance(db, 2048 * s)
        for k in range(16):
            wrong += sum(read_mnmajor(smem, a, m, k) != ("dS", m, 16 * s + k) for m in range(64))
            wrong += sum(read_mnmajor(smem, b, n, k) != ("K", 16 * s + k, n) for n in range(64))
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


def check_dq_layout(tile_floats: int = 4096, post_tile_div: int = 1024) -> int:
    """Staging float4 (c, t) -> global fragment layout -> post kernel's inverse map."""
    n_q, H, B = 4, 3, 2
    S = 64 * n_q
    seen: dict[tuple, int] = {}
    wrong = 0
    for b in range(B):
        for h in range(H):
            for qt in range(n_q):
                # kernel: tensor-map row (64 floats) of query tile qt, box of 64 rows
                row0 = (b * H + h) * n_q * (tile_floats // 64) + qt * (tile_floats // 64)
                for t in range(128):
                    for c in range(8):
                        for e in range(4):
                            sbyte = (128 * c + t) * 16 + 4 * e  # staging, box [64][64] fp32
                            gfloat = row0 * 64 + sbyte // 4
                            qrow, dcol = acc_coord(t, 4 * c + e)  # m64n64: row = q, col = d
                            truth = (b, qt * 64 + qrow, h, dcol)
                            idx = gfloat // 4  # post kernel: float4 index, element e of it
                            assert gfloat % 4 == e
                            tt = idx % 128
                            cc = (idx // 128) % 8
                            tile = idx // post_tile_div
                            qq = tile % n_q
                            bh = tile // n_q
                            hh, bb = bh % H, bh // H
                            r0 = 16 * (tt // 32) + (tt % 32) // 4
                            col = 8 * cc + 2 * (tt % 4)
                            post = (bb, qq * 64 + r0 + 8 * (e // 2), hh, col + (e % 2))
                            wrong += post != truth
                            seen[truth] = seen.get(truth, 0) + 1
    full = B * S * H * 64
    # the map {64, B*S*H}: every box row stays inside it
    max_row = (B * H * n_q - 1) * (tile_floats // 64) + 63
    ok = wrong == 0 and len(seen) == full and all(v == 1 for v in seen.values())
    ok &= max_row < B * S * H
    print(
        f"{'dQ staging -> dQacc fragment layout -> post kernel':>58}: "
        f"{'OK' if ok else f'{wrong} wrong, {len(seen)}/{full} covered'}"
    )
    return 0 if ok else 1


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
