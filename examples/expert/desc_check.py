"""Desk check of the expert MHA forward kernels: TMA smem writes against wgmma reads.

A CPU model, no GPU needed: ``python examples/expert/desc_check.py``.

* TMA tile writes: a box ``[rows][width]`` bf16 lands row after row (pitch ``width * 2`` B) and
  every byte address goes through ``Swizzle<B,4,3>`` (16-B chunk bits 4.. XOR address bits 7..;
  B = 3 for CU_TENSOR_MAP_SWIZZLE_128B, 2 for 64B).
* wgmma reads: the 64-bit descriptor (start, LBO, SBO in 16-B units, layout code in bits 62-63)
  is decoded and each element's address follows the PTX ISA canonical layouts (T = 8 bf16):
  K-major ``((8,m),(T,2)):((xT,SBO),(1,T))``, MN-major ``((T,x,m),(8,k)):((1,T,LBO),(xT,SBO))``,
  x = swizzle bytes / 16, then the same swizzle is applied to the address.

For every k-step of ``S = Q K^T`` (both warpgroups) and of ``O += P V`` it checks that each element
wgmma would read is the intended Q/K/V element. The GPU-verified d128 kernel's layout is checked
too, to validate the model, and three deliberately wrong descriptors must be caught.
"""

from __future__ import annotations

import sys

_B = {128: 3, 64: 2, 32: 1}  # swizzle span in bytes -> B of Swizzle<B,4,3>
_LAYOUT_CODE = {128: 1, 64: 2, 32: 3}  # sm_90 wgmma descriptor bits 62-63
_T = 8  # bf16 elements per 16 B
_ROWS = 128  # rows (tokens) per Q/K/V tile in the kernels

Smem = dict[int, tuple]


def swizzle(addr: int, span: int) -> int:
    b = _B[span]
    return addr ^ (((addr >> 7) & ((1 << b) - 1)) << 4)


def tma_box(smem: Smem, base: int, name: str, d0: int, width: int, span: int) -> None:
    """One TMA box [_ROWS][width] of tensor `name`, columns d0.., written at `base` (swizzled)."""
    for r in range(_ROWS):
        for e in range(width):
            smem[swizzle(base + r * width * 2 + 2 * e, span)] = (name, r, d0 + e)


def make_desc(start: int, span: int, lbo: int, sbo: int) -> int:
    """Same bit packing as ptx::make_smem_desc in packs/h100/wrappers.cuh."""
    desc = ((start & 0x3FFFF) >> 4) | (((lbo & 0x3FFFF) >> 4) << 16)
    desc |= ((sbo & 0x3FFFF) >> 4) << 32
    return desc | (_LAYOUT_CODE[span] << 62)


def advance(desc: int, nbytes: int) -> int:
    """ptx::desc_advance: start address += nbytes (a multiple of 16)."""
    assert nbytes % 16 == 0
    return desc + (nbytes >> 4)


def _decode(desc: int) -> tuple[int, int, int, int]:
    assert (desc >> 14) & 3 == 0, "start address overflowed its 14-bit field"
    assert (desc >> 49) & 7 == 0, "base_offset must stay 0"
    span = {1: 128, 2: 64, 3: 32}[(desc >> 62) & 3]
    return (desc & 0x3FFF) << 4, ((desc >> 16) & 0x3FFF) << 4, ((desc >> 32) & 0x3FFF) << 4, span


def read_kmajor(smem: Smem, desc: int, mn: int, k: int) -> tuple | None:
    """Element (mn, k), 0 <= k < 16, of a K-major swizzled wgmma operand."""
    start, _lbo, sbo, span = _decode(desc)
    x = span // 16
    off = (mn % 8) * x * _T + (k % _T) + (k // _T) * _T
    return smem.get(swizzle(start + 2 * off + (mn // 8) * sbo, span))


def read_mnmajor(smem: Smem, desc: int, mn: int, k: int) -> tuple | None:
    """Element (mn, k), 0 <= k < 16, of an MN-major swizzled wgmma operand."""
    start, lbo, sbo, span = _decode(desc)
    x = span // 16
    a, b, c = mn % _T, (mn // _T) % x, mn // (_T * x)
    addr = start + 2 * (a + _T * b + x * _T * (k % 8)) + c * lbo + (k // 8) * sbo
    return smem.get(swizzle(addr, span))


def check(
    name: str,
    d: int,
    span: int,
    box_w: int,
    *,
    desc_span: int | None = None,
    sbo: int | None = None,
    v_lbo: int | None = None,
) -> int:
    """Count wrong element reads of one kernel's layout (0 = consistent)."""
    n_box = d // box_w
    box_bytes = _ROWS * box_w * 2
    tile = n_box * box_bytes
    s_q, s_k, s_v = 7 * 1024, 7 * 1024 + tile, 7 * 1024 + 2 * tile  # any 1024-aligned base
    smem: Smem = {}
    for tname, base in (("Q", s_q), ("K", s_k), ("V", s_v)):
        for x in range(n_box):
            tma_box(smem, base + x * box_bytes, tname, x * box_w, box_w, span)
    dspan = desc_span or span
    row_bytes = box_w * 2
    sbo = sbo or 8 * row_bytes
    wrong = 0
    steps_per_row = box_w // 16  # 16-wide k-steps inside one swizzled row
    for g in range(2):  # S = Q K^T: k-step kk in box kk / steps_per_row, +32 B inside the row
        dq = make_desc(s_q + g * 64 * row_bytes, dspan, 16, sbo)
        dk = make_desc(s_k, dspan, 16, sbo)
        for kk in range(d // 16):
            off = (kk // steps_per_row) * box_bytes + (kk % steps_per_row) * 32
            a, b = advance(dq, off), advance(dk, off)
            for k in range(16):
                wrong += sum(
                    read_kmajor(smem, a, m, k) != ("Q", 64 * g + m, 16 * kk + k) for m in range(64)
                )
                wrong += sum(
                    read_kmajor(smem, b, n, k) != ("K", n, 16 * kk + k) for n in range(_ROWS)
                )
    dv = make_desc(s_v, dspan, v_lbo or box_bytes, sbo)  # O += P V: V MN-major, N = d
    for s in range(_ROWS // 16):
        b = advance(dv, 16 * row_bytes * s)
        for k in range(16):
            wrong += sum(read_mnmajor(smem, b, n, k) != ("V", 16 * s + k, n) for n in range(d))
    print(f"{name:>44}: {'OK' if wrong == 0 else f'{wrong} wrong element reads'}")
    return wrong


def main() -> int:
    failures = 0
    failures += check("d128 (GPU-verified): 2 x [128][64] sw128", 128, 128, 64) != 0
    failures += check("d64: 1 x [128][64] sw128", 64, 128, 64) != 0
    failures += check("d96: 3 x [128][32] sw64", 96, 64, 32) != 0
    print("negative controls (each must report wrong reads):")
    failures += check("d96, SBO 1024 instead of 512", 96, 64, 32, sbo=1024) == 0
    failures += check("d96, V LBO 16 KB instead of 8 KB", 96, 64, 32, v_lbo=16384) == 0
    failures += check("d96, 128B descriptor on 64B data", 96, 64, 32, desc_span=128) == 0
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
