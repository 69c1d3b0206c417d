"""Desk check (CPU only) of ../gemm_cluster.cu's stmatrix + TMA-store epilogue (task
PTX-H100-GEMM; written for it as a draft, shipped after its first H200 run).

The epilogue's address arithmetic and synchronisation are re-implemented below, and every C++
line the model mirrors is asserted to be present verbatim in the kernel (an edit of the kernel
that the model does not follow fails here). Constants come from the kernel's `constexpr`s.

0. Source: the shared-memory budget fits (tiles + 2 staging buffers + barriers + alignment
   <= 232448 B), the staging buffers start on 1024-B swizzle atoms, and the C box fits the 128B
   swizzle span.
1. Layout: for one 128 x 256 CTA tile, the wgmma accumulators (contracts §2, deskcheck.acc_coord)
   -> bf16 pairs -> stmatrix .x4 (lane addresses, register halves) -> the 128B-swizzled staging
   buffer -> the [64 x 64] TMA store boxes (the swizzle TMA un-does) -> global coordinates: every
   C element of the tile is written exactly once with bf16 of its accumulator; every stmatrix is
   bank-conflict free.
2. Synchronisation: per consumer warpgroup, 4 warp actors (warp 0's thread 0 issues, commits and
   waits for the bulk groups) and asynchronous TMA-store actors (each reads its box row group by
   row group, then writes global memory), in random interleavings over 1-3 tiles
   (deskcheck.NamedBarriers / interleave): no store reads a row group that is unfenced or that
   belongs to another (tile, half), no warp overwrites a row group a store has yet to read, every
   box reaches global memory exactly once, and no store is in flight when the CTA exits.
3. Negative controls: planted bugs in the layout (wrong swizzle XOR, wrong box coordinate, the
   second half staging the first half's accumulators) and in the synchronisation (no
   wait_group.read, wait_group.read 1, no barrier after the wait, no fence, no final wait) must
   each be caught.
Exits non-zero on any failure. Run: python3 examples/expert/drafts/gemm_tma_store_check.py
"""

from __future__ import annotations

import random
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
from deskcheck import (
    SPAN,
    CheckError,
    NamedBarriers,
    acc_coord,
    assert_mirrored,
    bf16,
    constexprs,
    interleave,
    negative_controls,
    require,
    run_checks,
    tma_box64,
)

HERE = Path(__file__).resolve().parent
KERNEL = HERE.parent / "gemm_cluster.cu"
SRC = KERNEL.read_text()
C = constexprs(SRC)
BM, BN, CONSUMERS = C["kBM"], C["kBN"], C["kConsumers"]
BOX_COLS, HALF_COLS, BOX_BYTES = C["kBoxCols"], C["kHalfCols"], C["kBoxBytesC"]
STAGING, TILE_BYTES, SMEM = C["kStagingBytes"], C["kTileBytes"], C["kSmemBytes"]
EPILOGUE_BAR = C["kEpilogueBar"]
HALVES, BOXES, BLOCKS = BN // HALF_COLS, HALF_COLS // BOX_COLS, HALF_COLS // 16
ROWS = BM // CONSUMERS  # 64 rows per consumer warpgroup
MAX_SMEM = 232448  # H100/H200 dynamic shared memory per block (params.md)

MIRRORED = [
    "constexpr int kSmemBytes = kTileBytes + kConsumers * kStagingBytes + 256 + 1024;",
    "uint8_t* staging = smem + kTileBytes;",
    "uint64_t* full = reinterpret_cast<uint64_t*>(staging + kConsumers * kStagingBytes);",
    # 1. layout
    "uint8_t* buf = staging + consumer * kStagingBytes;",
    "const uint32_t bar = kEpilogueBar + static_cast<uint32_t>(consumer);",
    "const uint32_t row = 16 * warp + l % 8 + 8 * ((l / 8) % 2);",
    "const uint32_t chunk_hi = l / 16;",
    "for (int half = 0; half < kBN / kHalfCols; ++half) {",
    "for (int jj = 0; jj < kHalfCols / 16; ++jj) {",
    "const int j = half * (kHalfCols / 16) + jj;",
    "const uint32_t r[4] = {ptx::pack_bf16x2(acc[8 * j + 0], acc[8 * j + 1]),",
    "ptx::pack_bf16x2(acc[8 * j + 2], acc[8 * j + 3]),",
    "ptx::pack_bf16x2(acc[8 * j + 4], acc[8 * j + 5]),",
    "ptx::pack_bf16x2(acc[8 * j + 6], acc[8 * j + 7])};",
    "const uint32_t box = static_cast<uint32_t>(jj) / (kBoxCols / 16);",
    "const uint32_t chunk = 2 * (static_cast<uint32_t>(jj) % (kBoxCols / 16)) + chunk_hi;",
    "ptx::stmatrix_x4(buf + box * kBoxBytesC + row * 128 + ((chunk ^ (row % 8)) * 16), r);",
    "for (int b = 0; b < kHalfCols / kBoxCols; ++b) {",
    "ptx::tma_store_2d(&map_c, buf + b * kBoxBytesC, n0 + half * kHalfCols + b * kBoxCols,"
    " m0 + consumer * 64);",
    "ptx::make_tmap_2d(&map_c, C, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, N, M,"
    " static_cast<uint64_t>(N) * 2, kBoxCols, 64, CU_TENSOR_MAP_SWIZZLE_128B) != CUDA_SUCCESS) {",
    # 2. synchronisation, in kernel order
    "if (lane == 0) ptx::bulk_wait_group_read<0>(); __syncwarp(); ptx::named_bar_sync(bar, 128);",
    "ptx::fence_proxy_async_smem(); ptx::named_bar_sync(bar, 128);",
    "ptx::bulk_commit_group(); } __syncwarp(); } }",
    "if (lane == 0) ptx::bulk_wait_group<0>();",
]

LAYOUT_BUGS = ["swizzle_xor_row_div8", "box_coord_no_b", "second_half_stages_first"]
SYNC_BUGS = ["no_wait_read", "wait_read_1", "no_bar_after_wait", "no_fence", "no_final_wait"]


# ---------------------------------------------------------------------------------------------
# 0. Source
# ---------------------------------------------------------------------------------------------
def check_source() -> None:
    """The mirrored lines are in the kernel and its shared-memory plan fits."""
    assert_mirrored(SRC, MIRRORED, KERNEL.name)
    require(SMEM <= MAX_SMEM, f"kSmemBytes {SMEM} > {MAX_SMEM}")
    require(TILE_BYTES % 1024 == 0 and STAGING % 1024 == 0, "staging not on 1024-B atoms")
    require(BOX_BYTES % 1024 == 0 and BOX_BYTES == ROWS * BOX_COLS * 2, "C box size")
    require(BOX_COLS * 2 <= SPAN, "C box row wider than the 128B swizzle span")
    require(STAGING == BOXES * BOX_BYTES and HALVES * HALF_COLS == BN, "staging holds one half")


# ---------------------------------------------------------------------------------------------
# 1. Layout: accumulators -> stmatrix -> staging -> TMA boxes -> C
# ---------------------------------------------------------------------------------------------
def stmatrix_address(buf: int, warp: int, lane: int, jj: int, bug: str = "") -> int:
    """The byte address lane `lane` of `warp` hands to stmatrix .x4 for block jj of a half."""
    row = 16 * warp + lane % 8 + 8 * ((lane // 8) % 2)
    chunk_hi = lane // 16
    box = jj // (BOX_COLS // 16)
    chunk = 2 * (jj % (BOX_COLS // 16)) + chunk_hi
    xor = row // 8 % 8 if bug == "swizzle_xor_row_div8" else row % 8
    return buf + box * BOX_BYTES + row * 128 + (chunk ^ xor) * 16


def epilogue_tile(d: np.ndarray, bug: str = "") -> tuple[np.ndarray, np.ndarray, int]:
    """One CTA tile's epilogue: returns C's tile (bf16 values), the write count per element and
    the number of stmatrix phases with a bank conflict."""
    out = np.zeros((BM, BN), np.float32)
    count = np.zeros((BM, BN), np.int32)
    conflicts = 0
    rounded = bf16(d)
    for consumer in range(CONSUMERS):
        buf = TILE_BYTES + consumer * STAGING
        # bf16 (cvt.rn, as pack_bf16x2 rounds) of acc[t][i] of this warpgroup, where wgmma left
        # element (row, col) = acc_coord(t, i) of its 64 rows (contracts §2)
        coords = [[acc_coord(t, i) for i in range(BN // 2)] for t in range(128)]
        acc = [[rounded[consumer * ROWS + r, c] for r, c in row] for row in coords]
        for half in range(HALVES):
            smem: dict[int, float] = {}
            for warp in range(4):
                for jj in range(BLOCKS):
                    j = (0 if bug == "second_half_stages_first" else half) * BLOCKS + jj
                    addr = [stmatrix_address(buf, warp, lane, jj, bug) for lane in range(32)]
                    for m in range(4):  # one 8x8 matrix per phase: its 8 rows' 16-B chunks
                        rows = addr[8 * m : 8 * m + 8]
                        conflicts += len({a // 16 % 8 for a in rows}) != 8
                    for lane in range(32):
                        t = 32 * warp + lane
                        for m in range(4):
                            # r[m] = pack(acc[8j + 2m], acc[8j + 2m + 1]): low half = lower column;
                            # element (lane / 4, 2 (lane % 4) + h) of matrix m, whose row address
                            # comes from lane 8m + lane / 4
                            base = addr[8 * m + lane // 4] + 4 * (lane % 4)
                            for h in range(2):
                                require(base + 2 * h not in smem, "stmatrix writes a byte twice")
                                smem[base + 2 * h] = acc[t][8 * j + 2 * m + h]
            # the TMA stores: box b = [64 rows][64 cols] read through the 128B swizzle, at the
            # addresses the drafts' TMA load model writes such a box to (deskcheck.tma_box64)
            for b in range(BOXES):
                c0 = half * HALF_COLS + (0 if bug == "box_coord_no_b" else b * BOX_COLS)
                c1 = consumer * ROWS
                box: dict[int, tuple] = {}
                tma_box64(box, buf + b * BOX_BYTES, "C", ROWS, c0)
                for a, (_, r, c) in box.items():
                    require(a in smem, f"TMA store reads unwritten smem at {a}")
                    out[c1 + r, c] = smem[a]
                    count[c1 + r, c] += 1
    return out, count, conflicts


def layout_wrong(d: np.ndarray, bug: str = "") -> str:
    """'' when the tile is right, else what is wrong."""
    try:
        out, count, conflicts = epilogue_tile(d, bug)
    except CheckError as e:
        return str(e)
    if not (count == 1).all():
        return f"{int((count != 1).sum())} elements not written exactly once"
    wrong = int((out != bf16(d)).sum())
    if wrong:
        return f"{wrong} elements with the wrong value"
    if conflicts:
        return f"{conflicts} stmatrix phases with a bank conflict"
    return ""


def check_layout() -> None:
    d = np.random.default_rng(0).standard_normal((BM, BN)).astype(np.float32) * 100
    wrong = layout_wrong(d)
    require(not wrong, f"layout: {wrong}")
    print(
        f"1. layout: {BM}x{BN} tile, {CONSUMERS} warpgroups x {HALVES} halves x {BOXES} boxes "
        f"[{ROWS}x{BOX_COLS}]: every element written once with bf16(acc); "
        f"{CONSUMERS * HALVES * 4 * BLOCKS} stmatrix .x4, none bank-conflicted"
    )
    for bug in LAYOUT_BUGS:
        what = layout_wrong(d, bug)
        require(bool(what), f"layout negative control {bug} not caught")
        print(f"negative control {bug}: caught ({what})")


# ---------------------------------------------------------------------------------------------
# 2. Synchronisation: the staging buffer's reuse
# ---------------------------------------------------------------------------------------------
class Cta:
    """The shared state of one CTA's epilogues: staging row groups (per consumer, box, warp:
    ((tile, half), fenced)), each storing thread's bulk groups, global writes, failures."""

    def __init__(self, bug: str) -> None:
        self.bug = bug
        self.nb = NamedBarriers(report=self.fail)
        self.rows: dict[tuple[int, int, int], tuple[tuple[int, int], bool]] = {}
        self.unread: dict[tuple[int, int, int], int] = {}  # stores yet to read a row group
        self.groups: dict[int, list[list[dict]]] = {c: [] for c in range(CONSUMERS)}
        self.written: dict[tuple, int] = {}
        self.failures: list[str] = []
        self.exited = 0
        self.actors: list[Iterator] = []

    def fail(self, what: str) -> None:
        self.failures.append(what)

    def pending_reads(self, consumer: int) -> int:
        """Committed bulk groups of the storing thread whose smem reads are not all done."""
        return sum(any(not s["read"] for s in g) for g in self.groups[consumer])

    def store(self, consumer: int, key: tuple[int, int], b: int, s: dict) -> Iterator:
        """One TMA store of box b: reads the box's row groups (one per warp), then writes C; the
        interleaving driver puts any other actor's steps between them."""
        for w in range(4):
            yield True
            content, fenced = self.rows[(consumer, b, w)]
            if content != key:
                self.fail(f"store {key} box {b} reads rows of warp {w} holding {content}")
            if not fenced:
                self.fail(f"store {key} box {b} reads unfenced rows of warp {w}")
            self.unread[(consumer, b, w)] -= 1
        s["read"] = True
        yield True
        out = (consumer, key, b)
        self.written[out] = self.written.get(out, 0) + 1
        s["done"] = True

    def warp(self, consumer: int, w: int, tiles: int) -> Iterator:
        bar = EPILOGUE_BAR + consumer
        storer = w == 0  # thread 0 of the warpgroup lives in warp 0
        for tile in range(tiles):
            for half in range(HALVES):
                # 4a: the storing thread waits until the buffer's stores have read it
                if storer and self.bug != "no_wait_read":
                    allowed = 1 if self.bug == "wait_read_1" else 0
                    while self.pending_reads(consumer) > allowed:
                        yield False
                if self.bug != "no_bar_after_wait":
                    yield from self.nb.sync(bar, w, 4)
                # 4b: this warp's stmatrix writes its 16 rows of both boxes
                for b in range(BOXES):
                    if self.unread.get((consumer, b, w), 0):
                        self.fail(f"warp {w} overwrites box {b} before its store read it")
                    self.rows[(consumer, b, w)] = ((tile, half), False)
                    yield True
                # 4c: fence (each writing thread), then the warpgroup barrier
                if self.bug != "no_fence":
                    for b in range(BOXES):
                        self.rows[(consumer, b, w)] = (self.rows[(consumer, b, w)][0], True)
                yield True
                yield from self.nb.sync(bar, w, 4)
                # 4d: thread 0 issues the boxes' stores and commits them as one bulk group
                if storer:
                    group = []
                    for b in range(BOXES):
                        s = {"read": False, "done": False}
                        for ww in range(4):
                            key = (consumer, b, ww)
                            self.unread[key] = self.unread.get(key, 0) + 1
                        self.actors.append(self.store(consumer, (tile, half), b, s))
                        group.append(s)
                        yield True
                    self.groups[consumer].append(group)
        # the final wait_group 0: every store of this thread complete
        if storer and self.bug != "no_final_wait":
            while any(not s["done"] for g in self.groups[consumer] for s in g):
                yield False
        # cluster_sync: the CTA exits once all its consumer warps are here
        self.exited += 1
        if self.exited == 4 * CONSUMERS:
            busy = sum(not s["done"] for c in range(CONSUMERS) for g in self.groups[c] for s in g)
            if busy:
                self.fail(f"CTA exits with {busy} TMA stores in flight")


def sync_run(seed: int, bug: str = "") -> list[str]:
    """One random interleaving; returns the failures (empty = correct)."""
    rng = random.Random(seed)
    tiles = 1 + seed % 3
    cta = Cta(bug)
    cta.actors.extend(cta.warp(c, w, tiles) for c in range(CONSUMERS) for w in range(4))
    if not interleave(cta.actors, rng):
        cta.fail("deadlock")
    expected = {
        (c, (t, h), b)
        for c in range(CONSUMERS)
        for t in range(tiles)
        for h in range(HALVES)
        for b in range(BOXES)
    }
    if set(cta.written) != expected or any(n != 1 for n in cta.written.values()):
        cta.fail("a box not written exactly once")
    if not cta.nb.balanced():
        cta.fail("a named-barrier generation left open")
    return cta.failures


def check_sync(runs: int) -> None:
    for seed in range(runs):
        failures = sync_run(seed)
        require(not failures, f"sync model, seed {seed}: {failures[:3]}")
    print(
        f"2. synchronisation: {runs} random interleavings of {CONSUMERS} warpgroups x 4 warps + "
        "TMA-store actors over 1-3 tiles: no early overwrite, no unfenced read, every box stored "
        "once, nothing in flight at exit"
    )


def checks() -> None:
    check_source()
    print(
        f"0. source: {KERNEL.name}: {len(MIRRORED)} mirrored lines present; "
        f"smem {SMEM} B of {MAX_SMEM} "
        f"(staging {CONSUMERS} x {STAGING} B at {TILE_BYTES})"
    )
    check_layout()
    check_sync(300)
    require(
        negative_controls(SYNC_BUGS, 60, lambda bug, r: bool(sync_run(r, bug))),
        "a synchronisation negative control was not caught",
    )


if __name__ == "__main__":
    sys.exit(run_checks(checks))
