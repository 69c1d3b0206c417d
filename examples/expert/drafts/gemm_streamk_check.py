"""Desk check (CPU only, numpy) of the draft ./gemm_cluster_streamk.cu (task PTX-H100-GEMM):
examples/expert/gemm_cluster.cu with a stream-K tail (whole-tile waves as today, the leftover
tiles' k-steps split evenly over the clusters, partial sums reduced in fp32 through a global
workspace with self-cleaning k-step counters).

The kernel's work list, host split, slot arithmetic and finisher protocol are re-implemented
below, and every C++ line the models mirror is asserted to be present verbatim in the source (an
edit of the kernel that this model does not follow fails here). Constants (kBM, kBN, kBK,
kStages, kCluster, kConsumers, kGroupM, kMinSkSteps, kWgThreads, kAccRegs, kSlotFloats, kSkBar)
are read from the source's `constexpr` definitions.

0. source: constants, mirrored lines, the work list independent of the CTA rank, and every
   change against ../gemm_cluster.cu marked with a `streamk:` comment.
1. work decomposition: for 8192^3 and other shapes (no tail, one tail tile, T < G, K = 64, 128,
   ragged raster groups) and grids of 1, 2, 64, 66, 132 clusters: every (cluster tile, k-step)
   covered exactly once, units non-empty and inside one tile, whole tiles first and in today's
   order, tail ranges equal (+-1 step), at most 2 tail units per cluster, no cluster with more
   tail work than one tile, the k-steps counted into each split slot sum to K/64 (what the
   finisher test expects), the workspace slots needed fit the allocation, step indices fit an int.
2. pipeline model of one cluster (2 CTAs x (producer + 2 consumer warpgroups), TMA actors with
   the B multicast into both CTAs, deskcheck.MBar full/empty rings) walking unit lists with
   partial k-ranges, random interleavings: no deadlock, every consumed stage holds the expected
   (tile, k-step) A and both B halves, no TMA lands in a stage a wgmma still reads, and each
   unit's accumulator holds exactly its k-range (scale_d restart at k_begin).
3. reduction model with data: 3 back-to-back launches per sequence (shapes and grids changing
   between launches), the workspace and counters kept across launches; every consumer
   warpgroup an actor, random interleaving; reds land in memory at random times unless the
   thread's fence forces them (a weak-memory stand-in); the finisher reads with the kernel's
   slot layout (deskcheck.acc_coord register map). Checks: C written exactly once per element
   and within the task's tolerance of A @ B^T (bf16 inputs), exactly one finisher and one reset
   per split slot, workspace and counters all zero after every launch.
4. negative controls (planted bugs that the checks above must catch).
5. makespan model, in tile times, today's schedule against the stream-K one, with a stated
   fixed fix-up overhead per split unit and per finisher.
Exits non-zero on any failure. Run: python3 examples/expert/drafts/gemm_streamk_check.py
"""

from __future__ import annotations

import difflib
import heapq
import random
import sys
from pathlib import Path

import numpy as np
from deskcheck import (
    CheckError,
    MBar,
    acc_coord,
    assert_mirrored,
    bf16,
    constexprs,
    flat,
    interleave,
    negative_controls,
    require,
)

HERE = Path(__file__).resolve().parent
KERNEL = HERE / "gemm_cluster_streamk.cu"
SHIPPED = HERE.parent / "gemm_cluster.cu"
SRC = KERNEL.read_text()


CONST = constexprs(SRC)
BM, BN, BK = CONST["kBM"], CONST["kBN"], CONST["kBK"]
STAGES, CLUSTER, CONSUMERS = CONST["kStages"], CONST["kCluster"], CONST["kConsumers"]
GROUP_M, MIN_SK = CONST["kGroupM"], CONST["kMinSkSteps"]
WG_THREADS, ACC_REGS, SLOT_FLOATS = CONST["kWgThreads"], CONST["kAccRegs"], CONST["kSlotFloats"]
SK_BAR = CONST["kSkBar"]
ATOL = RTOL = 1e-2  # envs/ops/gemm.yaml
INT_MAX = 2**31 - 1

MIRRORED = [
    # WorkList
    "const long long sk_steps = static_cast<long long>(n_cluster_tiles - dp_tiles_) * k_tiles_;",
    ": next_tile(cluster), dp_tiles(dp_tiles_), n_clusters(n_clusters_), k_tiles(k_tiles_),",
    "sk_pos(0), sk_end(0) {",
    "if (cluster < sk_clusters) {",
    "sk_pos = static_cast<int>(cluster * sk_steps / sk_clusters);",
    "sk_end = static_cast<int>((cluster + 1) * sk_steps / sk_clusters);",
    "if (next_tile < dp_tiles) {",
    "tile = next_tile; k_begin = 0; k_end = k_tiles; next_tile += n_clusters; return true;",
    "if (sk_pos >= sk_end) return false;",
    "const int t = sk_pos / k_tiles;",
    "k_begin = sk_pos - t * k_tiles;",
    "k_end = min(k_tiles, k_begin + (sk_end - sk_pos));",
    "tile = dp_tiles + t;",
    "sk_pos += k_end - k_begin;",
    # kernel: the list, built once per thread from cluster-wide values
    "const int cluster = static_cast<int>(ptx::cluster_id_x());",
    "const int n_clusters = static_cast<int>(gridDim.x) / kCluster;",
    "const WorkList work_list(cluster, n_clusters, n_cluster_tiles, dp_tiles, sk_clusters,"
    " k_tiles);",
    # producer
    "WorkList work = work_list;  // streamk: units instead of whole tiles",
    "while (work.next(tile, k_begin, k_end)) {",
    "for (int kt = k_begin; kt < k_end; ++kt) {  // streamk: the unit's k-range",
    "ptx::mbar_wait(&empty[stage], phase ^ 1);",
    "ptx::mbar_arrive_expect_tx(&full[stage], kStageTxBytes);",
    "ptx::tma_load_2d(tiles_a + stage * kStageBytesA, &map_a, &full[stage], kt * kBK, m0);",
    "ptx::tma_load_2d_multicast(tiles_b + stage * kStageBytesB + rank * kHalfBytesB, &map_b,"
    " &full[stage], kt * kBK, b_row, kMcastMask);",
    # consumers
    "WorkList work = work_list;  // streamk: the producer's units, in the same order",
    "ptx::mbar_wait(&full[stage], phase);",
    "ptx::wgmma_m64n256k16_ss(acc, desc_a, desc_b, (kt > k_begin || k16 > 0) ? 1 : 0);",
    "ptx::wgmma_wait<1>();",
    "if (kt > k_begin && lane < kCluster) mbar_arrive_remote(&empty[previous], lane);",
    "ptx::wgmma_wait<0>();",
    "if (lane < kCluster) mbar_arrive_remote(&empty[previous], lane);",
    # reduction
    "bool store = k_end - k_begin == k_tiles;",
    "((tile - dp_tiles) * kCluster + static_cast<int>(rank)) * kConsumers + consumer;",
    "float* part = workspace + static_cast<size_t>(slot) * kSlotFloats + lane * 4;",
    "for (int j = 0; j < kAccRegs / 4; ++j) {",
    "red_add_v4_f32(part + j * 4 * kWgThreads, acc[4 * j], acc[4 * j + 1], acc[4 * j + 2],"
    " acc[4 * j + 3]);",
    "__threadfence();  // streamk: this thread's adds are performed before the count below",
    "const int steps = k_end - k_begin;",
    "const int before = atomicAdd(&counters[slot], steps);",
    "const int last = before + steps == k_tiles ? 1 : 0;",
    "counters[slot] = 0;   // streamk: self-cleaning: 0 for the next launch",
    "sk_last[consumer] = last;",
    "store = sk_last[consumer] != 0;  // uniform over the warpgroup",
    "float4* p = reinterpret_cast<float4*>(part + j * 4 * kWgThreads);",
    "const float4 sum = __ldcg(p);",
    "__stcg(p, make_float4(0.f, 0.f, 0.f, 0.f));  // streamk: self-cleaning",
    "acc[4 * j] = sum.x; acc[4 * j + 1] = sum.y; acc[4 * j + 2] = sum.z; acc[4 * j + 3] = sum.w;",
    "if (store) {  // streamk: whole tiles, and finished tail tiles",
    "ptx::wgmma_acc_coord(lane, i, row, col);",
    "const size_t offset = static_cast<size_t>(m0 + consumer * 64 + row) * N + n0 + col;",
    "*reinterpret_cast<uint32_t*>(C + offset) = ptx::pack_bf16x2(acc[i], acc[i + 1]);",
    'asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};"',
    "ptx::named_bar_sync(kSkBar, kWgThreads);",
    "ptx::named_bar_sync(kSkBar + 1, kWgThreads);",
    # host
    "if (static_cast<long long>(n_cluster_tiles) * k_tiles >= 0x7fffffffLL) {",
    "int clusters = max_clusters;",
    "if (clusters > n_cluster_tiles) clusters = n_cluster_tiles;",
    "const int dp_tiles = n_cluster_tiles / clusters * clusters;",
    "const int sk_tiles = n_cluster_tiles - dp_tiles;  // < clusters <= max_clusters",
    "int sk_clusters = 0;",
    "if (sk_tiles > 0) {",
    "const int by_length = sk_tiles * k_tiles / kMinSkSteps;",
    "sk_clusters = by_length > sk_tiles ? by_length : sk_tiles;",
    "if (sk_clusters > clusters) sk_clusters = clusters;",
    "const int want = max_clusters * kCluster * kConsumers;",
    "const size_t bytes = static_cast<size_t>(want) * (kSlotFloats * sizeof(float) + sizeof(int));",
    "if ((err = cudaMemsetAsync(workspace, 0, bytes, stream)) != cudaSuccess) {",
    "counters = reinterpret_cast<int*>(workspace + static_cast<size_t>(want) * kSlotFloats);",
    "if (sk_tiles * kCluster * kConsumers > slots) return static_cast<int>(cudaErrorInvalidValue);",
    "map_a, map_b, C, N, K, n_pairs_m, n_tiles_n, workspace, counters, dp_tiles, sk_clusters);",
    # raster order (today's)
    "const int per_group = kGroupM * n_tiles_n;",
    "const int rows_in_group = min(n_pairs_m - first_pair, kGroupM);",
    "pair = first_pair + in_group % rows_in_group;",
    "n_tile = in_group / rows_in_group;",
]


def check_source() -> None:
    assert_mirrored(SRC, MIRRORED, "stream-K kernel")
    src = flat(SRC)
    # the work list is a function of cluster-wide values only: both CTAs walk the same units
    body = SRC[SRC.index("struct WorkList {") : SRC.index("__global__ void")]
    for word in ("rank", "threadIdx", "blockIdx", "cluster_ctarank", "warpgroup"):
        require(word not in body, f"the work list depends on {word}")
    require(src.count("WorkList work = work_list;") == 2, "producer and consumers copy one list")
    require(src.count("while (work.next(tile, k_begin, k_end)) {") == 2, "two walks of the list")
    require(src.count("if (++stage == kStages) {") == 2, "ring advances: producer + consumers")
    require(src.count(flat("phase = 0;  // carried across tiles")) == 2, "ring phase not carried")
    require(src.count("sk_bar_sync(consumer);") == 2, "two warpgroup barriers per split unit")
    require(SLOT_FLOATS == WG_THREADS * ACC_REGS == 64 * BN, "slot size")
    require(SK_BAR == 1, "named barriers 1 and 2 (0 is the CTA barrier)")
    check_marked_changes()
    print(
        f"0. source: {KERNEL.name}: kBM={BM} kBN={BN} kBK={BK} kStages={STAGES} "
        f"kCluster={CLUSTER} kConsumers={CONSUMERS} kGroupM={GROUP_M} kMinSkSteps={MIN_SK} "
        f"kSlotFloats={SLOT_FLOATS}; {len(MIRRORED)} mirrored lines present; the work list "
        "uses no rank/thread index; every change against gemm_cluster.cu is marked streamk:"
    )


def check_marked_changes() -> None:
    """Every hunk of the diff against ../gemm_cluster.cu (code after the header comment) holds a
    `streamk` comment, in the hunk or in the 3 lines above it."""
    start = "#include <cuda_runtime.h>"
    base = SHIPPED.read_text()
    base_lines = base[base.index(start) :].splitlines()
    mine_lines = SRC[SRC.index(start) :].splitlines()
    matcher = difflib.SequenceMatcher(a=base_lines, b=mine_lines, autojunk=False)
    hunks = 0
    for tag, i1, _i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            continue
        hunks += 1
        window = mine_lines[max(0, j1 - 3) : max(j2, j1 + 1)]
        require(
            any("streamk" in line for line in window),
            f"unmarked change near draft line {j1} / shipped line {i1}: "
            f"{(mine_lines[j1:j2] or base_lines[i1 : i1 + 2])[:3]}",
        )
    require(hunks > 10, f"only {hunks} changed hunks against the shipped kernel")


# ---------------------------------------------------------------------------- kernel arithmetic
def host_split(n_tiles: int, k_tiles: int, max_clusters: int, bug: str | None = None):
    """(clusters, dp_tiles, sk_clusters), as the host computes them."""
    clusters = min(max_clusters, n_tiles)
    dp_tiles = n_tiles // clusters * clusters
    sk_tiles = n_tiles - dp_tiles
    sk_clusters = 0
    if sk_tiles > 0:
        by_length = sk_tiles * k_tiles // MIN_SK
        sk_clusters = by_length if by_length > sk_tiles else sk_tiles
        sk_clusters = min(sk_clusters, clusters)
    return clusters, dp_tiles, sk_clusters


def work_list(cluster, n_clusters, n_tiles, dp_tiles, sk_clusters, k_tiles, bug=None):
    """The units (tile, k_begin, k_end) of WorkList, in order."""
    next_tile = cluster
    sk_pos = sk_end = 0
    sk_steps = (n_tiles - dp_tiles) * k_tiles
    if cluster < sk_clusters:
        sk_pos = cluster * sk_steps // sk_clusters
        sk_end = (cluster + 1) * sk_steps // sk_clusters
        if bug == "range-start-plus-1":
            sk_pos += 1
        if bug == "range-end-plus-1":
            sk_end = min(sk_end + 1, sk_steps)
    units = []
    while True:
        if next_tile < dp_tiles:
            units.append((next_tile, 0, k_tiles))
            next_tile += n_clusters
            continue
        if sk_pos >= sk_end:
            break
        t = sk_pos // k_tiles
        k_begin = sk_pos - t * k_tiles
        k_end = min(k_tiles, k_begin + (sk_end - sk_pos))
        if bug == "unit-end-plus-1":
            k_end = min(k_tiles, k_end + 1)
        units.append((dp_tiles + t, k_begin, k_end))
        sk_pos += k_end - k_begin
        require(len(units) < 10**6, "work list does not end")
    return units


def tile_coords(tile: int, n_pairs_m: int, n_tiles_n: int) -> tuple[int, int]:
    """cluster_tile_coords: (pair row, n-tile) of a cluster tile."""
    per_group = GROUP_M * n_tiles_n
    group = tile // per_group
    first_pair = group * GROUP_M
    rows_in_group = min(n_pairs_m - first_pair, GROUP_M)
    in_group = tile - group * per_group
    return first_pair + in_group % rows_in_group, in_group // rows_in_group


def slot_of(tile: int, dp_tiles: int, rank: int, g: int, bug: str | None = None) -> int:
    if bug == "slot-without-rank":
        return (tile - dp_tiles) * CONSUMERS + g
    return ((tile - dp_tiles) * CLUSTER + rank) * CONSUMERS + g


class Plan:
    """One launch: shape, host split and every cluster's unit list."""

    def __init__(self, M: int, N: int, K: int, max_clusters: int, bug: str | None = None):
        self.M, self.N, self.K = M, N, K
        self.n_pairs_m, self.n_tiles_n = M // (CLUSTER * BM), N // BN
        self.T = self.n_pairs_m * self.n_tiles_n
        self.k_tiles = K // BK
        self.max_clusters = max_clusters
        self.G, self.dp_tiles, self.S = host_split(self.T, self.k_tiles, max_clusters, bug)
        self.sk_tiles = self.T - self.dp_tiles
        self.units = [
            work_list(c, self.G, self.T, self.dp_tiles, self.S, self.k_tiles, bug)
            for c in range(self.G)
        ]


def check_plan(p: Plan) -> dict:
    """Coverage and the properties the kernel relies on; returns statistics."""
    require(p.T * p.k_tiles < INT_MAX, "step indices overflow an int (host guard)")
    covered = np.zeros((p.T, p.k_tiles), dtype=np.int32)
    slot_steps: dict[tuple[int, int, int], int] = {}
    contributors: dict[int, int] = {}
    tail_work = []
    tail_units = []
    for c, units in enumerate(p.units):
        whole = [u for u in units if u[0] < p.dp_tiles]
        require(
            whole == [(t, 0, p.k_tiles) for t in range(c, p.dp_tiles, p.G)],
            f"cluster {c}: whole tiles differ from today's list",
        )
        require(units[: len(whole)] == whole, f"cluster {c}: whole tiles not first")
        tail = units[len(whole) :]
        tail_units.append(len(tail))
        tail_work.append(sum(e - b for _t, b, e in tail))
        for tile, kb, ke in units:
            require(0 <= tile < p.T, f"cluster {c}: tile {tile} out of range")
            require(0 <= kb < ke <= p.k_tiles, f"cluster {c}: bad k-range [{kb}, {ke})")
            covered[tile, kb:ke] += 1
            if ke - kb < p.k_tiles:  # a split unit: each CTA's 2 warpgroups count into slots
                require(tile >= p.dp_tiles, "a whole-wave tile is split")
                contributors[tile] = contributors.get(tile, 0) + 1
                for r in range(CLUSTER):
                    for g in range(CONSUMERS):
                        key = (slot_of(tile, p.dp_tiles, r, g), r, g)
                        slot_steps[key] = slot_steps.get(key, 0) + ke - kb
    require(
        int(covered.min()) == 1 and int(covered.max()) == 1, "a (tile, k-step) not covered once"
    )
    # the finisher test `before + steps == k_tiles`: every split slot is completed exactly
    for (slot, _r, _g), steps in slot_steps.items():
        require(steps == p.k_tiles, f"slot {slot}: {steps} k-steps counted, want {p.k_tiles}")
    slots = {s for s, _r, _g in slot_steps}
    require(len(slots) == len(slot_steps), "two (rank, warpgroup) pairs share a slot")
    require(p.sk_tiles * CLUSTER * CONSUMERS <= p.max_clusters * CLUSTER * CONSUMERS, "slots")
    require(all(0 <= s < p.sk_tiles * CLUSTER * CONSUMERS for s in slots), "slot out of range")
    if p.S:
        sk = [tail_work[c] for c in range(p.S)]
        require(max(sk) - min(sk) <= 1, f"tail ranges not equal: {min(sk)}..{max(sk)}")
        require(all(w == 0 for w in tail_work[p.S :]), "a cluster >= S has tail work")
        require(max(sk) <= p.k_tiles, "a cluster has more than one tile of tail work")
        require(max(tail_units) <= 2, f"{max(tail_units)} tail units in one cluster")
    else:
        require(not any(tail_work), "tail work without a tail")
    # today's makespan in k-steps vs stream-K's (no overhead): never worse
    today = -(-p.T // p.G) * p.k_tiles
    mine = max(len(range(c, p.dp_tiles, p.G)) * p.k_tiles + tail_work[c] for c in range(p.G))
    require(mine <= today, "stream-K longer than today's schedule")
    # raster order: a bijection onto (pair, n-tile)
    coords = {tile_coords(t, p.n_pairs_m, p.n_tiles_n) for t in range(p.T)}
    require(len(coords) == p.T, "raster order not a bijection")
    return {
        "split_tiles": len(contributors),
        "contributors": sorted(set(contributors.values())),
        "tail_units": max(tail_units),
        "tail_steps": (min(tail_work[: p.S]), max(tail_work[: p.S])) if p.S else (0, 0),
    }


SHAPES = [
    (8192, 8192, 8192),  # the task: T = 1024, K/64 = 128
    (8192, 8192, 4096),
    (4096, 8192, 8192),
    (3072, 2816, 8192),  # T = 12 x 11 = 132 = 2 x 66: no tail on 66 clusters
    (256, 256, 64),  # T = 1, one k-step
    (256, 256, 8192),  # T = 1
    (512, 768, 128),  # T = 6, K/64 = 2
    (1280, 1792, 64),  # T = 35, K/64 = 1: splitting impossible
    (2560, 3328, 640),  # ragged raster groups (5 x 13), K/64 = 10
    (4352, 6400, 1088),  # 17 x 25 = 425 tiles, K/64 = 17
    (16384, 1024, 8192),  # 64 x 4 = 256 tiles
    (768, 256, 8192),  # T = 3
]
GRIDS = [1, 2, 64, 66, 132]


def check_decomposition() -> None:
    n = 0
    for M, N, K in SHAPES:
        for grid in GRIDS:
            check_plan(Plan(M, N, K, grid))
            n += 1
    rng = random.Random(5)
    for _ in range(300):  # random shapes and grids
        M = 256 * rng.randint(1, 40)
        N = 256 * rng.randint(1, 40)
        K = 64 * rng.choice([1, 2, 3, 5, 16, 17, 64, 127, 128, 200])
        check_plan(Plan(M, N, K, rng.randint(1, 140)))
        n += 1
    task = Plan(8192, 8192, 8192, 66)
    stats = check_plan(task)
    per_cluster = sorted({len(u) for u in task.units})
    print(
        f"1. decomposition ok: {len(SHAPES)} shapes x grids {GRIDS} + 300 random = {n} plans: "
        "every (tile, k-step) once, whole tiles first in today's order, equal tail ranges, "
        "slot k-step sums = K/64"
    )
    print(
        f"   8192^3, 66 clusters: T={task.T}, dp_tiles={task.dp_tiles} "
        f"({task.dp_tiles // task.G} waves), sk_tiles={task.sk_tiles}, "
        f"W={task.sk_tiles * task.k_tiles} steps over S={task.S} clusters "
        f"({stats['tail_steps'][0]}-{stats['tail_steps'][1]} each, up to {stats['tail_units']} "
        f"units); {stats['split_tiles']} split tiles with {stats['contributors']} contributors; "
        f"units per cluster {per_cluster}"
    )
    require(task.S == 66 and task.sk_tiles == 34 and task.dp_tiles == 990, "task split")


# ----------------------------------------------------------------------- 2. pipeline model
def run_pipeline(lists: list[list[tuple]], seed: int, bug: str | None = None) -> None:
    """One cluster: CTA r walks lists[r]. Raises CheckError on a failure or a deadlock."""
    rng = random.Random(seed)
    full = [[MBar(1) for _ in range(STAGES)] for _ in range(CLUSTER)]
    empty = [[MBar(CONSUMERS * CLUSTER) for _ in range(STAGES)] for _ in range(CLUSTER)]
    stage_a = [[None] * STAGES for _ in range(CLUSTER)]
    stage_b = [[[None] * CLUSTER for _ in range(STAGES)] for _ in range(CLUSTER)]
    readers = [[0] * STAGES for _ in range(CLUSTER)]
    done: list[tuple] = []
    actors: list = []

    def tma(dests, write, bar_of):
        for _ in range(rng.randrange(4)):
            yield True
        for q in dests:
            require(readers[q][write[1]] == 0, f"TMA into CTA {q} stage {write[1]} while read")
            write[0](q)
            bar_of(q).complete_tx(1)
            yield True

    def producer(r):
        stage = phase = 0
        for tile, kb, ke in lists[r]:
            for kt in range(kb, ke):
                yield ("wait", empty[r][stage], phase ^ 1)
                full[r][stage].arrive(expect_tx=3)  # A + own B half + the peer's B half
                s = stage

                def put_a(q, s=s, tile=tile, kt=kt):
                    stage_a[q][s] = ("A", tile, r, kt)

                def put_b(q, s=s, tile=tile, kt=kt):
                    stage_b[q][s][r] = ("B", tile, kt, r)

                actors.append(tma([r], (put_a, s), lambda q, s=s: full[q][s]))
                peers = list(range(CLUSTER))
                rng.shuffle(peers)
                actors.append(tma(peers, (put_b, s), lambda q, s=s: full[q][s]))
                yield True
                stage, phase = (0, phase ^ 1) if stage + 1 == STAGES else (stage + 1, phase)

    def consumer(r, g):
        stage = phase = 0
        acc: set[int] = set()  # the k-steps summed in the registers; they outlive a unit
        for tile, kb, ke in lists[r]:
            previous = 0
            in_flight: list[int] = []
            for kt in range(kb, ke):
                yield ("wait", full[r][stage], phase)
                want = [("A", tile, r, kt)] + [("B", tile, kt, h) for h in range(CLUSTER)]
                got = [stage_a[r][stage]] + stage_b[r][stage]
                require(got == want, f"CTA {r} wg {g} stage {stage}: {got}, want {want}")
                restart = kt == 0 if bug == "scale-d-at-kt-0" else not kt > kb
                acc = {kt} if restart else acc | {kt}
                readers[r][stage] += 1
                in_flight.append(stage)
                yield True
                while len(in_flight) > 1:  # wgmma_wait<1>: all but the latest group retired
                    readers[r][in_flight.pop(0)] -= 1
                release = kt > 0 if bug == "release-at-kt-gt-0" else kt > kb
                if release:
                    for q in range(CLUSTER):  # lane q -> CTA q
                        empty[q][previous].arrive()
                previous = stage
                stage, phase = (0, phase ^ 1) if stage + 1 == STAGES else (stage + 1, phase)
                yield True
            while in_flight:  # wgmma_wait<0>
                readers[r][in_flight.pop(0)] -= 1
            if bug != "no-last-release":
                for q in range(CLUSTER):
                    empty[q][previous].arrive()
            require(acc == set(range(kb, ke)), f"unit ({tile}, {kb}, {ke}) summed k {sorted(acc)}")
            done.append((r, g, tile, kb, ke))
            yield True

    for r in range(CLUSTER):
        actors.append(producer(r))
        for g in range(CONSUMERS):
            actors.append(consumer(r, g))
    if not interleave(actors, rng, max_steps=500_000):
        raise CheckError(f"pipeline deadlock (seed {seed})")
    want = sorted((r, g, *u) for r in range(CLUSTER) for g in range(CONSUMERS) for u in lists[r])
    require(sorted(done) == want, "a unit was not completed by every consumer warpgroup")


def pipeline_lists() -> list[list[tuple]]:
    """Unit lists of one cluster: from plans with partial ranges, and fixed stress lists."""
    lists = []
    for cluster, (T, G, S, kt) in [
        (0, (7, 3, 3, 7)),  # T = 7 on 3 clusters: 2 waves + 1 tail tile split 3 ways
        (1, (7, 3, 3, 7)),
        (2, (7, 3, 3, 7)),
        (1, (5, 4, 4, 3)),  # 1 tail tile of 3 steps over 4 clusters (one of them idle)
        (3, (5, 4, 4, 3)),
        (1, (11, 4, 4, 5)),  # 3 tail tiles of 5 steps: ranges of 3-4 steps across tiles
        (2, (11, 4, 4, 5)),
    ]:
        dp = T // G * G
        lists.append(work_list(cluster, G, T, dp, S, kt))
    lists += [
        [(0, 0, 1), (1, 1, 2), (2, 0, 5), (3, 3, 4), (4, 2, 7)],
        [(0, 2, 3), (0, 3, 9), (5, 0, 1), (6, 1, 6)],
        [(9, 5, 6)] * 3,
    ]
    return [u for u in lists if u]


def check_pipeline() -> None:
    lists = pipeline_lists()
    runs = 0
    for units in lists:
        for seed in range(12):
            run_pipeline([units, units], seed)
            runs += 1
    print(
        f"2. pipeline model ok: {len(lists)} unit lists (k-ranges starting at 0..5, 1..9 steps, "
        f"{STAGES}-stage ring), {runs} random interleavings of 2 CTAs x (producer + 2 consumer "
        "warpgroups) + TMA actors with the B multicast: no deadlock, stages hold the expected "
        "A and both B halves, no TMA into a stage in use, each unit sums exactly its k-range"
    )


# ---------------------------------------------------------------------- 3. reduction model
# Register maps: accumulator i of thread t (one warpgroup, m64n256) is element (ROW, COL) of the
# warpgroup's 64 x 256 block (contracts §2, deskcheck.acc_coord); its workspace offset in the slot
# is the kernel's `part + j * 4 * kWgThreads` + i % 4 with part = lane * 4, j = i / 4.
T_IDX, I_IDX = np.meshgrid(np.arange(WG_THREADS), np.arange(ACC_REGS), indexing="ij")
ROW = np.vectorize(lambda t, i: acc_coord(int(t), int(i))[0])(T_IDX, I_IDX)
COL = np.vectorize(lambda t, i: acc_coord(int(t), int(i))[1])(T_IDX, I_IDX)
SLOT_IDX = T_IDX * 4 + (I_IDX // 4) * 4 * WG_THREADS + I_IDX % 4
SLOT_IDX_WRONG = (T_IDX * (ACC_REGS // 4) + I_IDX // 4) * 4 + I_IDX % 4  # thread-major: a bug


def check_layout() -> None:
    require(sorted(SLOT_IDX.ravel().tolist()) == list(range(SLOT_FLOATS)), "slot not a bijection")
    cells = set(zip(ROW.ravel().tolist(), COL.ravel().tolist(), strict=True))
    require(cells == {(r, c) for r in range(64) for c in range(BN)}, "register map not onto 64x256")
    # a red.v4 is 16 contiguous bytes, and the 32 lanes of a warp 512 contiguous bytes
    for j in range(ACC_REGS // 4):
        for w in range(WG_THREADS // 32):
            block = SLOT_IDX[32 * w : 32 * w + 32, 4 * j : 4 * j + 4].ravel()
            require(
                block.tolist() == list(range(int(block[0]), int(block[0]) + 128)), "uncoalesced"
            )
            require(int(block[0]) % 128 == 0, "a warp's 512 bytes are not 512-aligned")
    # the epilogue's bf16 pairs: register i + 1 is column col + 1 of the same row
    require(
        bool(np.all(ROW[:, 1::2] == ROW[:, 0::2]) and np.all(COL[:, 1::2] == COL[:, 0::2] + 1)),
        "pack_bf16x2(acc[i], acc[i + 1]) is not two adjacent columns",
    )


class Device:
    """What outlives a launch: the workspace and counters (allocated and zeroed once)."""

    def __init__(self, max_clusters: int) -> None:
        self.slots = max_clusters * CLUSTER * CONSUMERS
        self.ws = np.zeros((self.slots, SLOT_FLOATS), dtype=np.float32)
        self.counters = np.zeros(self.slots, dtype=np.int64)


def partial(A, B, m0, n0, g, kb, ke):
    """One warpgroup's fp32 sums over k-steps [kb, ke) as its 128 x 128 registers."""
    a = A[m0 + 64 * g : m0 + 64 * g + 64, kb * BK : ke * BK]
    b = B[n0 : n0 + BN, kb * BK : ke * BK]
    block = a @ b.T  # fp32 (numpy's blocked order, not the wgmma's)
    return block[ROW, COL]


def launch(dev: Device, p: Plan, A, B, rng: random.Random, bug: str | None = None):
    """One launch, every consumer warpgroup an actor; returns (C, writes, events)."""
    C = np.full((p.M, p.N), np.nan, dtype=np.float32)
    writes = np.zeros((p.M, p.N), dtype=np.int32)
    finishers: dict[int, int] = {}
    resets: dict[int, int] = {}
    pending: list[list] = []  # per warp: reds issued, not yet performed in memory
    slot_idx = SLOT_IDX_WRONG if bug == "finisher-reads-thread-major" else SLOT_IDX

    def land_some():  # memory performs pending reds at random times
        live = [q for q in pending if q]
        if live and rng.random() < 0.5:
            q = rng.choice(live)
            slot, idx, vals = q.pop(0)
            dev.ws[slot, idx] += vals

    def store(m0, n0, g, regs):
        rows = m0 + 64 * g + ROW
        cols = n0 + COL
        C[rows, cols] = bf16(regs)
        writes[rows, cols] += 1

    def warpgroup(c, r, g):
        warps = [[] for _ in range(WG_THREADS // 32)]
        pending.extend(warps)
        for tile, kb, ke in p.units[c]:
            pair, n_tile = tile_coords(tile, p.n_pairs_m, p.n_tiles_n)
            m0, n0 = (pair * CLUSTER + r) * BM, n_tile * BN
            land_some()
            yield True
            regs = partial(A, B, m0, n0, g, kb, ke)
            if ke - kb == p.k_tiles:
                store(m0, n0, g, regs)
                continue
            slot = slot_of(tile, p.dp_tiles, r, g, bug)
            for w, q in enumerate(warps):  # red_add_v4_f32, 32 per thread
                lanes = slice(32 * w, 32 * w + 32)
                q.append((slot, SLOT_IDX[lanes].ravel(), regs[lanes].ravel()))
                land_some()
                yield True
            if bug != "no-fence":  # __threadfence: each thread's reds performed
                for q in warps:
                    while q:
                        s, idx, vals = q.pop(0)
                        dev.ws[s, idx] += vals
            land_some()
            yield True  # named barrier: the whole warpgroup has fenced
            steps = ke - kb
            if bug == "count-contributors-as-2":
                before = int(dev.counters[slot])
                dev.counters[slot] += 1
                last = before + 1 == 2
            else:
                target = p.k_tiles - 1 if bug == "target-k-tiles-minus-1" else p.k_tiles
                before = int(dev.counters[slot])
                dev.counters[slot] += steps  # atomicAdd
                last = before + steps == target
            if last:
                finishers[slot] = finishers.get(slot, 0) + 1
                if bug != "no-counter-reset":
                    dev.counters[slot] = 0
                    resets[slot] = resets.get(slot, 0) + 1
            land_some()
            yield True
            if last:  # ld.global.cg, st.global.cg 0, then today's epilogue
                sums = dev.ws[slot, slot_idx].copy()
                if bug != "no-workspace-zeroing":
                    dev.ws[slot] = 0.0
                store(m0, n0, g, sums)
                yield True

    actors = [
        warpgroup(c, r, g) for c in range(p.G) for r in range(CLUSTER) for g in range(CONSUMERS)
    ]
    require(interleave(actors, rng), "reduction model stalled")
    for q in pending:  # the launch ends: every red has been performed
        for s, idx, vals in q:
            dev.ws[s, idx] += vals
    return C, writes, finishers, resets


LAUNCH_SEQUENCES = [
    # (device's cluster count, (M, N, K) per launch); workspace and counters outlive launches
    (4, [(1280, 256, 4096)] * 3),  # T = 5: 1 tail tile of 64 steps, 4 contributors of 16
    (4, [(1792, 256, 3072), (768, 512, 2560), (1280, 256, 4096)]),  # shapes change
    (5, [(768, 512, 2560), (2560, 512, 1024), (512, 512, 4096)]),  # no tail; T = 4 < 5
    (3, [(1024, 512, 640), (1024, 256, 4096), (1280, 256, 1024)]),  # unsplit tail; 3-way split
]


def run_launches(seq, seed: int, bug: str | None = None) -> dict:
    max_clusters, shapes = seq
    rng = random.Random(seed)
    nrng = np.random.default_rng(seed)
    dev = Device(max_clusters)
    stats = {"split_slots": 0, "worst_ratio": 0.0, "launches": 0, "contributors": set()}
    for M, N, K in shapes:
        p = Plan(M, N, K, max_clusters, bug)
        if bug is None:
            check_plan(p)
        A = bf16(nrng.standard_normal((M, K), dtype=np.float32))
        B = bf16(nrng.standard_normal((N, K), dtype=np.float32))
        C, writes, finishers, resets = launch(dev, p, A, B, rng, bug)
        require(int(writes.min()) == 1 and int(writes.max()) == 1, "C not written exactly once")
        ref = A @ B.T  # fp32: its own error (~1e-6 relative) is far below the tolerance
        require(bool(np.isfinite(C).all()), "C holds NaN (an element never written)")
        ratio = np.abs(C - ref) / (ATOL + RTOL * np.abs(ref))
        stats["worst_ratio"] = max(stats["worst_ratio"], float(ratio.max()))
        require(float(ratio.max()) <= 1.0, f"C off by {float(ratio.max()):.2f} x the tolerance")
        split = {
            slot_of(t, p.dp_tiles, r, g)
            for us in p.units
            for t, kb, ke in us
            if ke - kb < p.k_tiles
            for r in range(CLUSTER)
            for g in range(CONSUMERS)
        }
        require(set(finishers) == split, "a split slot without a finisher, or an unsplit one")
        require(all(v == 1 for v in finishers.values()), "a slot finished twice")
        require(set(resets) == split and all(v == 1 for v in resets.values()), "resets != 1")
        require(not dev.counters.any(), "counters not zero after the launch")
        require(not dev.ws.any(), "workspace not zero after the launch")
        stats["split_slots"] += len(split)
        stats["launches"] += 1
        for us in p.units:
            for t, kb, ke in us:
                if ke - kb < p.k_tiles:
                    n = sum(1 for vs in p.units for u in vs if u[0] == t)
                    stats["contributors"].add(n)
    return stats


def check_reduction() -> None:
    check_layout()
    total = {"split_slots": 0, "worst_ratio": 0.0, "launches": 0, "contributors": set()}
    for i, seq in enumerate(LAUNCH_SEQUENCES):
        for seed in range(2):
            s = run_launches(seq, 100 * i + seed)
            total["split_slots"] += s["split_slots"]
            total["launches"] += s["launches"]
            total["worst_ratio"] = max(total["worst_ratio"], s["worst_ratio"])
            total["contributors"] |= s["contributors"]
    print(
        "3. reduction model ok: slot layout a bijection, 16-B reds, 512-B per warp; "
        f"{total['launches']} launches in {len(LAUNCH_SEQUENCES)} x 2 back-to-back sequences "
        f"(3 launches each, shapes changing), {total['split_slots']} split slots with "
        f"{sorted(total['contributors'])} contributors per tile, random arrival orders and "
        "late-landing reds: C written once, worst |C - A@B^T| "
        f"= {total['worst_ratio']:.3f} x tolerance, one finisher and one reset per slot, "
        "workspace and counters zero after every launch"
    )


# ----------------------------------------------------------------------- 4. negative controls
def check_negative_controls() -> None:
    task = (8192, 8192, 8192)

    def caught(bug: str, r: int) -> bool:
        try:
            if bug in ("range-start-plus-1", "range-end-plus-1", "unit-end-plus-1"):
                check_plan(Plan(*task, 66, bug))
                check_plan(Plan(3072, 2816, 8192, 64, bug))
            elif bug == "rank-dependent-list":
                units = pipeline_lists()[r % len(pipeline_lists())]
                other = [(t, kb, ke - 1 if ke - kb > 1 else ke) for t, kb, ke in units]
                run_pipeline([units, other if other != units else units[1:]], r)
            elif bug in ("release-at-kt-gt-0", "scale-d-at-kt-0", "no-last-release"):
                for units in pipeline_lists():
                    run_pipeline([units, units], r, bug)
            else:
                run_launches(LAUNCH_SEQUENCES[r % 2], 1000 + r, bug)
        except CheckError:
            return True
        return False

    model_bugs = [
        "range-start-plus-1",  # off-by-one at a cluster's k-range start
        "range-end-plus-1",  # off-by-one at its end
        "unit-end-plus-1",  # off-by-one where a range is cut at a tile boundary
        "rank-dependent-list",  # the two CTAs of a cluster walk different units
        "release-at-kt-gt-0",  # today's `kt > 0` release test kept
        "scale-d-at-kt-0",  # today's scale_d restart only at kt == 0 kept
        "no-last-release",  # the unit's last stage never released
    ]
    launch_bugs = [  # run whole launch sequences: 2 runs each (each run is seconds of numpy)
        "count-contributors-as-2",  # a fixed contributor count instead of the k-step sum
        "target-k-tiles-minus-1",  # wrong count target
        "no-counter-reset",  # the finisher does not reset the counter
        "no-workspace-zeroing",  # the finisher does not zero the slot
        "no-fence",  # no __threadfence between the reds and the count
        "finisher-reads-thread-major",  # the finisher reads another slot layout
        "slot-without-rank",  # both CTAs of a tile share one slot and counter
    ]
    require(negative_controls(model_bugs, 4, caught), "a negative control was not caught")
    require(negative_controls(launch_bugs, 2, caught), "a negative control was not caught")
    print(
        f"4. negative controls ok: {len(model_bugs) + len(launch_bugs)} planted bugs, each caught"
    )


# ------------------------------------------------------------------------- 5. makespan model
def makespan_today(p: Plan) -> float:
    return float(-(-p.T // p.G))


def makespan_streamk(p: Plan, o_split: float, o_fin: float) -> tuple[float, float]:
    """Event-driven: clusters run their units in order (a unit of n k-steps costs n / (K/64)
    tiles, a split unit o_split more for its reds, fence and count; the count that completes a
    slot costs its cluster o_fin more for the read-back, zeroing and store). Returns (makespan,
    the tail's share of it)."""
    heap = [(0.0, c, 0) for c in range(p.G)]
    counted: dict[int, int] = {}
    end = 0.0
    tail_start = float(p.dp_tiles // p.G)
    while heap:
        t, c, i = heapq.heappop(heap)
        if i == len(p.units[c]):
            end = max(end, t)
            continue
        tile, kb, ke = p.units[c][i]
        t += (ke - kb) / p.k_tiles
        if ke - kb < p.k_tiles:
            t += o_split
            counted[tile] = counted.get(tile, 0) + ke - kb
            if counted[tile] == p.k_tiles:
                t += o_fin
        heapq.heappush(heap, (t, c, i + 1))
    return end, end - tail_start


def check_makespan() -> None:
    o_split, o_fin = 0.04, 0.03
    print(
        "5. makespan model (tile times; a 128 x 256 x 8192 cluster tile ~88 us on the H200): "
        f"assumed fix-up per split unit o_split = {o_split} tile (~3.5 us: 128 KB of red.v4 per "
        f"CTA, fence, count) and per finisher o_fin = {o_fin} tile (~2.6 us: read back, zero, "
        "store)"
    )
    task = Plan(8192, 8192, 8192, 66)
    today = makespan_today(task)
    for os_, of in [(0.0, 0.0), (0.02, 0.015), (o_split, o_fin), (0.08, 0.06), (0.16, 0.12)]:
        mk, tail = makespan_streamk(task, os_, of)
        tag = "  <- assumed" if (os_, of) == (o_split, o_fin) else ""
        print(
            f"   8192^3, G=66: today {today:.3f}, stream-K {mk:.3f} (tail {tail:.3f}) with "
            f"o_split={os_:.3f}, o_fin={of:.3f}: {today / mk:.4f}x{tag}"
        )
    mk, _ = makespan_streamk(task, o_split, o_fin)
    require(mk < today - 0.3, "stream-K does not save at least 0.3 tile at 8192^3")
    for grid in (64, 65, 132):
        p = Plan(8192, 8192, 8192, grid)
        mk, _ = makespan_streamk(p, o_split, o_fin)
        print(
            f"   8192^3, G={grid}: T/G = {p.T / p.G:.3f} waves, today {makespan_today(p):.3f}, "
            f"stream-K {mk:.3f} ({makespan_today(p) / mk:.4f}x)"
        )


def main() -> int:
    try:
        check_source()
        check_decomposition()
        check_pipeline()
        check_reduction()
        check_negative_controls()
        check_makespan()
    except CheckError as e:
        print(f"CHECK FAILED: {e}")
        return 1
    print("ALL CHECKS OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
