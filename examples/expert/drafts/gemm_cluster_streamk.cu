// Expert GEMM for the ptxgym GEMM task on Hopper (sm_90a): the GPU-verified
// examples/expert/gemm_cluster.cu with a STREAM-K TAIL.
//
// DRAFT (examples/expert/drafts/gemm_cluster_streamk.cu), not run on a GPU. It builds for sm_90a
// with no spills (ptxas figures in examples/expert/drafts/README.md), and its desk check
// examples/expert/drafts/gemm_streamk_check.py (CPU, numpy) models its work decomposition, the
// fp32 workspace reduction with its self-cleaning counters over back-to-back launches, and the
// schedule. It is a copy of examples/expert/gemm_cluster.cu (H200: 1.011x, 0.995x and 0.992x
// cuBLAS on three hosts, cuBLAS ~1.41-1.42 ms) in which every change is marked "streamk:";
// everything else (2-CTA cluster along M with the B slab multicast, 1 producer + 2 consumer
// warpgroups, 128 x 256 x 64 tiles, the 4-stage ring and its full/empty barriers, the
// descriptors, the rasterised order, the register-direct bf16 epilogue) is unchanged.
//
//   C[M, N] = A[M, K] * B[N, K]^T     A, B, C bf16 row-major (A and B K-major), fp32 accumulate
//
// Why: gemm_cluster.cu hands out whole cluster tiles, 1024 at 8192^3 over 66 co-resident
// clusters = 15.52 waves, so clusters 0..33 run 16 tiles while 34..65 idle through the 16th
// (about 3 % of the run). Here the last partial wave's k-steps are spread over every cluster.
//
// Design (streamk)
//   * Split. T cluster tiles over G clusters (G = gridDim.x / 2, whatever the host picked):
//     dp_tiles = floor(T / G) * G tiles are processed WHOLE, exactly as today (cluster c takes
//     tiles c, c + G, ... in the rasterised order, same code path, same bf16 store). The other
//     sk_tiles = T - dp_tiles < G tiles (the end of the rasterised order: neighbours in the last
//     raster group) form the stream-K tail. Their W = sk_tiles * K/64 k-steps, numbered
//     tile-major (step s = (tile - dp_tiles) * K/64 + kt), are cut into S contiguous ranges of
//     equal length (+-1 step), [c W / S, (c + 1) W / S), that clusters c = 0 .. S-1 run after
//     their whole tiles. A range is cut at tile boundaries into UNITS (cluster tile, k-steps
//     [k_begin, k_end)); the whole tiles are units [0, K/64).
//     Why only the T mod G leftover tiles: it is the least work that has to be split. The
//     floor(T/G) whole waves are balanced already and keep today's code, L2 traffic and epilogue
//     (no workspace traffic at all); splitting one more wave (Stream-K's "DP + 2 tiles" hybrid)
//     would give the same ideal makespan with 3x the split units.
//   * S = min(G, max(sk_tiles, W / kMinSkSteps)). A range is never cut below kMinSkSteps = 16
//     k-steps where that can be helped (a split unit costs an estimated ~4 us of fix-up, about 6
//     k-steps, which it must pay for), and there are never fewer ranges than tail tiles, so no
//     cluster gets more than one tile's worth of tail: with S = sk_tiles the ranges ARE the tail
//     tiles (nothing split, today's schedule). 8192^3 with G = 66: T = 1024, dp_tiles = 990 (15
//     waves), sk_tiles = 34, W = 4352, S = 66: 65 or 66 k-steps per cluster (0.51 of a tile),
//     in 1 or 2 units; each tail tile has 2 or 3 contributors.
//   * Work list (struct WorkList): a function of the cluster id and the kernel arguments only,
//     walked identically by the producer and by the consumers of BOTH CTAs of the cluster, so
//     the B multicast and the cross-CTA empty barriers pair up k-step by k-step as today.
//     (stage, phase) carry across units as they did across tiles; every unit fills, consumes and
//     releases exactly k_end - k_begin stages on every side (the consumers release the unit's
//     last stage after wait<0>, as each tile's before); scale_d = 0 on the unit's FIRST k-step
//     (kt == k_begin), so a partial range starts a fresh sum just as a tile does.
//   * Reduction, with no waiting anywhere (so it cannot deadlock, for any grid size and whether
//     or not the clusters are co-resident): a unit covering a whole tile stores bf16 as today. A
//     partial unit's consumer warpgroup adds its 64 x 256 fp32 accumulators into its SLOT of a
//     global workspace with red.global.add.v4.f32: slot = (tail tile, CTA rank, warpgroup), 64
//     KB, laid out [i / 4][thread][4] (accumulator i of thread t at ((i / 4) * 128 + t) * 4 +
//     i % 4: each red is 16 contiguous bytes and a warp's 32 reds 512 contiguous bytes). Every
//     contributor of a slot has the same rank and warpgroup, hence the same register -> (row,
//     col) map, so the slot needs no (row, col) layout at all. Then every thread fences
//     (__threadfence), the warpgroup meets at a named barrier, and its thread 0 adds the unit's
//     k-step count k_end - k_begin to the slot's counter (atomicAdd). The add that brings the
//     counter to K/64 is the slot's last contribution, since every other contributor added
//     only after its reds were fenced: its thread fences again (acquire), resets the counter to
//     0 and raises a shared-memory flag; after a second barrier the warpgroup reads the slot
//     back with ld.global.cg (L2; its own adds included, same thread, same addresses), writes
//     zeros behind it (st.global.cg) and stores the tile's bf16 C from those sums with today's
//     epilogue. Counting k-steps, not contributors, needs no contributor-count formula: a slot
//     is complete when K/64 steps were added, whoever added them, and exactly one add completes
//     it. The two CTAs of a tile and the two warpgroups of a CTA reduce independently (own slots
//     and counters), so nothing couples them beyond today's pipeline.
//   * Self-cleaning: each slot's finisher zeroes the slot and resets its counter, so workspace
//     and counters are all zero after every launch, whatever the next launch's shape or grid.
//     They are allocated and zeroed ONCE, on the first call (cudaMalloc + cudaMemsetAsync on the
//     call's stream, the way examples/expert/mha_fwd_causal_d128.cu allocates its ticket
//     counter), sized for max clusters x 2 ranks x 2 warpgroups slots (sk_tiles < G <= max
//     clusters): 66 x 4 x 64 KB = 16.5 MB on an H200. No memset in the later (timed) calls. One
//     call at a time on one stream is assumed, as there.
//   * red.global.add.v4.f32 (PTX 8.1+, sm_90) is not among the pack's wrappers: red_add_v4_f32
//     below is a small inline-asm helper (relaxed, gpu scope: the defaults). Fences and the
//     counter are plain CUDA C++ (__threadfence, atomicAdd, __ldcg, __stcg). Contributions land
//     in arrival order, so C is not bitwise deterministic from run to run (a last-bit bf16
//     difference at most, far inside the task's 1e-2 tolerance).
//   * Host: as today (grid = 2 x cudaOccupancyMaxActiveClusters, capped at T; with the cap
//     T <= G there is no tail); it computes dp_tiles and S and passes them with the workspace.
//     Shapes are today's (M % 256, N % 256, K % 64 == 0), plus T * K/64 < 2^31 so that a step
//     index fits an int (8192^3: 131072).
//
// Shared memory: as today, 197888 B; the two warpgroups' finisher flags (2 ints) sit in the
// 256 B barrier slot behind full[4] and empty[4] (64 B). Named barriers 1 and 2 are new.
//
// Expected (desk check's makespan model, 8192^3, G = 66, in tile times; a tile is ~88 us):
// today 16 tiles; stream-K 15 + 66/128 = 15.52 with no overhead. Assumed per split unit 0.04
// tile of fix-up (128 KB of red per CTA, fence, count) and 0.03 more for the finisher (read
// back, zero, store): the longest cluster (two split units, finishing both tiles) ends at 15.66,
// so 16 / 15.66 = 1.022x, about 1.38 ms, ~1.03x cuBLAS if the rest holds; twice those overheads
// still give 1.013x, four times them lose 0.5 %. The real gain is likely smaller: today's 16th
// wave runs on half the GPU (more L2 bandwidth and power headroom per SM, so it is shorter than
// a full wave), and the tail's split ranges start at different k, so clusters share fewer A/B
// slabs in L2 than in a whole-tile wave.
//
// What the first GPU run must show: PASSED on the 8192^3 workload (the task's only one), no
// hang, memcheck clean, qualified with the same counts as gemm_cluster.cu (HGMMA 8,388,608 warps,
// UTMALDG 524,288: every k-step is still loaded and multiplied once); correct results over
// back-to-back calls (the self-cleaning workspace: the timing loop's many calls, then a checked
// call) and on a few extra shapes run by hand (a tail with 1 tile, no tail (T % G == 0), T < G,
// K = 64, K = 128); and the time beside gemm_cluster.cu's on the same host (the model's bet:
// 1-2.5 % faster). Not checked on a GPU: the memory ordering of red/fence/atomic/ld.cg (argued
// above, the classic threadfence-reduction pattern), the fix-up's real cost, and the register
// budget's effect on the consumers' k-loop (ptxas: no spills).

#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cstdint>

#include "ptxgym_h100.cuh"

namespace {

constexpr int kBM = 128;      // CTA tile rows: two consumer warpgroups of 64
constexpr int kBN = 256;      // CTA tile columns: the widest wgmma (n256)
constexpr int kBK = 64;       // one 128-byte swizzle atom of bf16 along K
constexpr int kStages = 4;    // 4 x 48 KB; a fifth stage does not fit in 227 KB
constexpr int kThreads = 384;  // producer warpgroup + 2 consumer warpgroups
constexpr int kCluster = 2;   // CTAs per cluster, stacked along M, sharing the B slab
constexpr int kConsumers = 2;  // consumer warpgroups per CTA
constexpr int kGroupM = 8;    // raster group height, in cluster tiles (2 x 128 rows each)
constexpr uint16_t kMcastMask = (1u << kCluster) - 1;  // 0b11: both CTAs of the cluster

constexpr uint32_t kStageBytesA = kBM * kBK * 2;             // 16384
constexpr uint32_t kStageBytesB = kBN * kBK * 2;             // 32768
constexpr uint32_t kHalfRowsB = kBN / kCluster;              // 128 B rows loaded per CTA
constexpr uint32_t kHalfBytesB = kHalfRowsB * kBK * 2;       // 16384 (a multiple of 1024)
constexpr uint32_t kStageTxBytes = kStageBytesA + kStageBytesB;  // bytes landing per CTA per stage
constexpr int kTileBytes = kStages * (kStageBytesA + kStageBytesB);
constexpr int kSmemBytes = kTileBytes + 256 + 1024;
static_assert(kHalfBytesB % 1024 == 0, "each multicast half must start on a swizzle atom");
static_assert(kSmemBytes <= 232448, "over the 227 KB per-block limit");

// streamk: the tail split and the fp32 workspace.
constexpr int kMinSkSteps = 16;    // streamk: shortest stream-K range where the tail allows it
constexpr int kWgThreads = 128;    // streamk: threads of one consumer warpgroup
constexpr int kAccRegs = 128;      // streamk: fp32 accumulators per thread (m64n256)
constexpr int kSlotFloats = kWgThreads * kAccRegs;  // streamk: one warpgroup's 64 x 256 partial
constexpr int kSkBar = 1;          // streamk: named barriers 1, 2 (consumer warpgroup 0, 1)
static_assert(kSlotFloats == 64 * kBN, "a slot holds one warpgroup's 64 x 256 accumulators");
static_assert(16 * kStages + 4 * kConsumers <= 256, "streamk: flags fit the barrier slot");

// Remote arrive (count 1) on the mbarrier at the same offset in CTA `cta_rank` of the cluster, with
// the default .release.cta semantics: CUTLASS's ClusterBarrier::arrive(cta_id, pred), in use in its
// multicast GEMMs. The pack's ptx::mbar_arrive_cluster says .release.cluster, and nvcc 13.0 turns
// that into MEMBAR.ALL.CTA + MEMBAR.ALL.GPU + ERRBAR + CGAERRBAR before every arrive: in the
// consumers' k-loop, right after a tile's 64 st.global, that fence would wait for the stores to
// reach the GPU scope. Nothing needs it: what the arrive publishes is "wgmma's async-proxy reads of
// this stage have retired" (wgmma.wait_group), not generic writes a peer will read.
__device__ __forceinline__ void mbar_arrive_remote(uint64_t* bar, uint32_t cta_rank) {
  asm volatile(
      "{\n.reg .b32 remAddr32;\n"
      "mapa.shared::cluster.u32 remAddr32, %0, %1;\n"
      "mbarrier.arrive.shared::cluster.b64 _, [remAddr32];\n}\n" ::"r"(ptx::smem_u32(bar)),
      "r"(cta_rank)
      : "memory");
}

// streamk: vector reduction into global memory (not in the pack).
//   red{.sem}{.scope}{.global}.add{.level::cache_hint}.vec_32_bit.f32 [a], b{, cache-policy};
//   .vec_32_bit = { .v2, .v4 };  PTX 8.1+, sm_90+; .sem defaults to .relaxed, .scope to .gpu.
// Four fp32 adds to 16 contiguous, 16-byte-aligned bytes of global memory (one REDG.E.ADD.F32x4).
__device__ __forceinline__ void red_add_v4_f32(float* gaddr, float a, float b, float c, float d) {
  asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};" ::"l"(
                   static_cast<uint64_t>(__cvta_generic_to_global(gaddr))),
               "f"(a), "f"(b), "f"(c), "f"(d)
               : "memory");
}

// streamk: bar.sync over one consumer warpgroup (named barrier kSkBar + consumer, 128 threads),
// with the id as an immediate so that ptxas reserves barriers 1 and 2 only, not all 16.
__device__ __forceinline__ void sk_bar_sync(int consumer) {
  if (consumer == 0) {
    ptx::named_bar_sync(kSkBar, kWgThreads);
  } else {
    ptx::named_bar_sync(kSkBar + 1, kWgThreads);
  }
}

// Cluster tile id -> (pair row p, n-tile), grouped kGroupM pair rows at a time (Triton's grouped
// order; the last group may be shorter, so any number of pair rows works).
__device__ __forceinline__ void cluster_tile_coords(int id, int n_pairs_m, int n_tiles_n, int& pair,
                                                    int& n_tile) {
  const int per_group = kGroupM * n_tiles_n;
  const int group = id / per_group;
  const int first_pair = group * kGroupM;
  const int rows_in_group = min(n_pairs_m - first_pair, kGroupM);
  const int in_group = id - group * per_group;
  pair = first_pair + in_group % rows_in_group;
  n_tile = in_group / rows_in_group;
}

// streamk: a cluster's work list, units (cluster tile, k-steps [k_begin, k_end)):
//   1. whole tiles cluster, cluster + n_clusters, ... below dp_tiles (today's list, cut at the
//      last whole wave);
//   2. clusters below sk_clusters: the tail's k-step range [c W / S, (c + 1) W / S), steps
//      numbered tile-major from tile dp_tiles, cut at tile boundaries.
// A function of (cluster, kernel arguments) only: the producer and the consumers of both CTAs of
// the cluster walk the same units. All step indices fit an int (the host checks T * K/64 < 2^31).
struct WorkList {
  int next_tile;  // next whole tile
  int dp_tiles;
  int n_clusters;
  int k_tiles;
  int sk_pos;     // next tail step of this cluster's range
  int sk_end;     // end of the range

  __device__ __forceinline__ WorkList(int cluster, int n_clusters_, int n_cluster_tiles,
                                      int dp_tiles_, int sk_clusters, int k_tiles_)
      : next_tile(cluster), dp_tiles(dp_tiles_), n_clusters(n_clusters_), k_tiles(k_tiles_),
        sk_pos(0), sk_end(0) {
    const long long sk_steps = static_cast<long long>(n_cluster_tiles - dp_tiles_) * k_tiles_;
    if (cluster < sk_clusters) {
      sk_pos = static_cast<int>(cluster * sk_steps / sk_clusters);
      sk_end = static_cast<int>((cluster + 1) * sk_steps / sk_clusters);
    }
  }

  __device__ __forceinline__ bool next(int& tile, int& k_begin, int& k_end) {
    if (next_tile < dp_tiles) {
      tile = next_tile;
      k_begin = 0;
      k_end = k_tiles;
      next_tile += n_clusters;
      return true;
    }
    if (sk_pos >= sk_end) return false;
    const int t = sk_pos / k_tiles;
    k_begin = sk_pos - t * k_tiles;
    k_end = min(k_tiles, k_begin + (sk_end - sk_pos));
    tile = dp_tiles + t;
    sk_pos += k_end - k_begin;
    return true;
  }
};

__global__ void __launch_bounds__(kThreads, 1)
    gemm_cluster_kernel(const __grid_constant__ CUtensorMap map_a,
                        const __grid_constant__ CUtensorMap map_b, __nv_bfloat16* __restrict__ C,
                        int N, int K, int n_pairs_m, int n_tiles_n,
                        float* __restrict__ workspace, int* __restrict__ counters, int dp_tiles,
                        int sk_clusters) {  // streamk: the last four
  extern __shared__ uint8_t smem_raw[];
  // 1024-aligned inside the CTA window: the offsets are the same in both CTAs (same kernel, same
  // dynamic smem base), which multicast relies on (data and complete_tx land at the SAME offset
  // in every destination CTA).
  uint8_t* smem = reinterpret_cast<uint8_t*>(
      (reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  uint8_t* tiles_a = smem;
  uint8_t* tiles_b = smem + kStages * kStageBytesA;
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + kTileBytes);
  uint64_t* empty = full + kStages;
  int* sk_last = reinterpret_cast<int*>(empty + kStages);  // streamk: finisher flag per warpgroup

  const uint32_t rank = ptx::cluster_ctarank();          // 0 or 1: which m-tile of the pair
  const int cluster = static_cast<int>(ptx::cluster_id_x());
  const int n_clusters = static_cast<int>(gridDim.x) / kCluster;
  const int n_cluster_tiles = n_pairs_m * n_tiles_n;
  const int k_tiles = K / kBK;
  // streamk: built once, before the roles split (its 64-bit divisions stay out of the producer's
  // 40-register budget); each role walks its own copy.
  const WorkList work_list(cluster, n_clusters, n_cluster_tiles, dp_tiles, sk_clusters, k_tiles);

  // ---- 1. Barriers: initialised by one thread per CTA, visible cluster-wide before use. --------
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      ptx::mbar_init(&full[s], 1);                       // own producer's arrive_expect_tx
      ptx::mbar_init(&empty[s], kConsumers * kCluster);  // 2 warpgroups x 2 CTAs
    }
    ptx::fence_mbarrier_init();  // release.cluster: the peer's TMA and remote arrives see them
    ptx::prefetch_tmap(&map_a);
    ptx::prefetch_tmap(&map_b);
  }
  // No CTA may multicast into, or arrive remotely on, its peer before the peer's barriers exist.
  ptx::cluster_sync();

  const uint32_t warpgroup = ptx::warpgroup_idx();
  if (warpgroup == 0) {
    // ---- 2. Producer: one elected thread streams A (own) and B (half, multicast). ------------
    ptx::setmaxnreg_dec<40>();
    if (ptx::warp_idx() == 0 && ptx::elect_one_sync()) {
      int stage = 0;
      uint32_t phase = 0;  // carried across tiles: the ring never restarts
      WorkList work = work_list;  // streamk: units instead of whole tiles
      int tile;
      int k_begin;
      int k_end;
      while (work.next(tile, k_begin, k_end)) {
        int pair;
        int n_tile;
        cluster_tile_coords(tile, n_pairs_m, n_tiles_n, pair, n_tile);
        const int m0 = (pair * kCluster + static_cast<int>(rank)) * kBM;
        const int n0 = n_tile * kBN;
        const int b_row = n0 + static_cast<int>(rank * kHalfRowsB);  // this CTA's half of B
        for (int kt = k_begin; kt < k_end; ++kt) {  // streamk: the unit's k-range
          // Parity phase^1 on a fresh barrier passes at once (first pass through the ring). Half
          // of the 4 arrivals are remote; a CTA-scope wait as in CUTLASS (acquire.cluster costs a
          // CCTL.IVALL, an L1 invalidation, after every wait in nvcc 13.0's SASS).
          ptx::mbar_wait(&empty[stage], phase ^ 1);
          // All 48 KB that land in THIS CTA's stage: A 16 KB + own B half + the peer's B half.
          // The peer's complete_tx may reach full[stage] before this arrive: the tx count goes
          // transiently negative, but the phase cannot complete without this arrival.
          ptx::mbar_arrive_expect_tx(&full[stage], kStageTxBytes);
          ptx::tma_load_2d(tiles_a + stage * kStageBytesA, &map_a, &full[stage], kt * kBK, m0);
          ptx::tma_load_2d_multicast(tiles_b + stage * kStageBytesB + rank * kHalfBytesB, &map_b,
                                     &full[stage], kt * kBK, b_row, kMcastMask);
          if (++stage == kStages) {
            stage = 0;
            phase ^= 1;
          }
        }
      }
    }
    __syncwarp();  // reconverge warp 0 before the .aligned cluster barrier below
  } else {
    // ---- 3. Consumers: wgmma over the ring, release each stage to BOTH producers. -------------
    ptx::setmaxnreg_inc<232>();
    const int consumer = static_cast<int>(warpgroup) - 1;  // which 64 rows of the CTA tile
    const uint32_t lane = threadIdx.x % 128;
    float acc[128];
    int stage = 0;
    uint32_t phase = 0;  // carried across tiles, in step with the producer
    WorkList work = work_list;  // streamk: the producer's units, in the same order
    int tile;
    int k_begin;
    int k_end;
    while (work.next(tile, k_begin, k_end)) {
      int pair;
      int n_tile;
      cluster_tile_coords(tile, n_pairs_m, n_tiles_n, pair, n_tile);
      const int m0 = (pair * kCluster + static_cast<int>(rank)) * kBM;
      const int n0 = n_tile * kBN;
      int previous = 0;
      for (int kt = k_begin; kt < k_end; ++kt) {  // streamk: the unit's k-range
        // Half of this stage's B was written by the peer's multicast TMA; its complete_tx lands
        // on THIS CTA's full[stage], so the CTA-scope wait on it covers the bytes (CUTLASS waits
        // the same way; mbar_wait_cluster is the variant to try if the first run reads stale B).
        ptx::mbar_wait(&full[stage], phase);
        ptx::wgmma_fence();
#pragma unroll
        for (int k16 = 0; k16 < kBK / 16; ++k16) {
          // Verified descriptors of gemm.cu: the B stage is still one [256][64] swizzled tile,
          // its two multicast halves sit back to back (16384 B = 16 whole 1024-B atoms apart).
          const uint64_t desc_a = ptx::desc_advance(
              ptx::make_desc_kmajor_sw128(tiles_a + stage * kStageBytesA + consumer * 64 * 128),
              32 * k16);
          const uint64_t desc_b = ptx::desc_advance(
              ptx::make_desc_kmajor_sw128(tiles_b + stage * kStageBytesB), 32 * k16);
          // streamk: scale_d = 0 on the UNIT's first k-step (kt == k_begin): a whole tile and a
          // partial k-range alike start a fresh sum (no zeroing needed).
          ptx::wgmma_m64n256k16_ss(acc, desc_a, desc_b, (kt > k_begin || k16 > 0) ? 1 : 0);
        }
        ptx::wgmma_commit();
        // This stage's group stays in flight; the previous stage's group has retired, so its
        // smem can be refilled. Lane 0 releases it in CTA 0 and lane 1 in CTA 1 (one remote
        // arrive each, in parallel): 2 warpgroups x 2 CTAs = the count 4 of every empty[s].
        ptx::wgmma_wait<1>();
        // streamk: kt > k_begin: no release before the unit's first stage was consumed.
        if (kt > k_begin && lane < kCluster) mbar_arrive_remote(&empty[previous], lane);
        previous = stage;
        if (++stage == kStages) {
          stage = 0;
          phase ^= 1;
        }
      }
      ptx::wgmma_wait<0>();
      ptx::fence_regs(acc);
      // streamk: per unit. The unit's last stage: every stage consumed is released exactly once
      // per unit, so the producer's k_end - k_begin waits per unit stay matched across units.
      if (lane < kCluster) mbar_arrive_remote(&empty[previous], lane);

      // streamk: a partial unit adds its fp32 sums into the slot of (tail tile, rank, warpgroup);
      // the warpgroup whose count completes the slot (K/64 steps) reads the sums back, cleans
      // the slot and stores the tile below as a whole tile would.
      bool store = k_end - k_begin == k_tiles;
      if (!store) {
        const int slot =
            ((tile - dp_tiles) * kCluster + static_cast<int>(rank)) * kConsumers + consumer;
        float* part = workspace + static_cast<size_t>(slot) * kSlotFloats + lane * 4;
#pragma unroll
        for (int j = 0; j < kAccRegs / 4; ++j) {
          red_add_v4_f32(part + j * 4 * kWgThreads, acc[4 * j], acc[4 * j + 1], acc[4 * j + 2],
                         acc[4 * j + 3]);
        }
        __threadfence();  // streamk: this thread's adds are performed before the count below
        sk_bar_sync(consumer);
        if (lane == 0) {
          const int steps = k_end - k_begin;
          const int before = atomicAdd(&counters[slot], steps);
          const int last = before + steps == k_tiles ? 1 : 0;
          if (last) {
            __threadfence();      // streamk: acquire: every contributor's adds before the reads
            counters[slot] = 0;   // streamk: self-cleaning: 0 for the next launch
          }
          sk_last[consumer] = last;
        }
        __syncwarp();
        sk_bar_sync(consumer);
        store = sk_last[consumer] != 0;  // uniform over the warpgroup
        if (store) {
#pragma unroll
          for (int j = 0; j < kAccRegs / 4; ++j) {
            float4* p = reinterpret_cast<float4*>(part + j * 4 * kWgThreads);
            const float4 sum = __ldcg(p);
            __stcg(p, make_float4(0.f, 0.f, 0.f, 0.f));  // streamk: self-cleaning
            acc[4 * j] = sum.x;
            acc[4 * j + 1] = sum.y;
            acc[4 * j + 2] = sum.z;
            acc[4 * j + 3] = sum.w;
          }
        }
      }

      // ---- 4. Epilogue: bf16 pairs straight from the accumulators (gemm.cu's, verified). ------
      // The producer is already filling the next tile's stages meanwhile.
      if (store) {  // streamk: whole tiles, and finished tail tiles
#pragma unroll
        for (int i = 0; i < 128; i += 2) {
          uint32_t row;
          uint32_t col;
          ptx::wgmma_acc_coord(lane, i, row, col);
          const size_t offset = static_cast<size_t>(m0 + consumer * 64 + row) * N + n0 + col;
          *reinterpret_cast<uint32_t*>(C + offset) = ptx::pack_bf16x2(acc[i], acc[i + 1]);
        }
      }
    }
    __syncwarp();
  }

  // ---- 5. No CTA exits while its peer may still multicast into it or arrive on its barriers. ---
  ptx::cluster_sync();
}

// Co-resident 2-CTA clusters of this kernel (66 when all 132 SMs pair up inside their GPCs);
// queried once: the evaluation uses one device.
int max_active_clusters() {
  static int cached = 0;
  if (cached > 0) return cached;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(kCluster);
  cfg.blockDim = dim3(kThreads);
  cfg.dynamicSmemBytes = kSmemBytes;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = kCluster;
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  int clusters = 0;
  if (cudaOccupancyMaxActiveClusters(&clusters, reinterpret_cast<const void*>(gemm_cluster_kernel),
                                     &cfg) != cudaSuccess ||
      clusters <= 0) {
    (void)cudaGetLastError();  // clear the (non-sticky) query error; fall back to SMs / 2
    int device = 0;
    int sms = 0;
    if (cudaGetDevice(&device) != cudaSuccess ||
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess ||
        sms < kCluster) {
      return 0;
    }
    clusters = sms / kCluster;
  }
  cached = clusters;
  return cached;
}

}  // namespace

extern "C" int gemm(const __nv_bfloat16* A, const __nv_bfloat16* B, __nv_bfloat16* C, int M,
                    int N, int K, cudaStream_t stream) {
  if (M <= 0 || N <= 0 || K <= 0 || M % (kCluster * kBM) != 0 || N % kBN != 0 || K % kBK != 0) {
    return static_cast<int>(cudaErrorInvalidValue);
  }
  CUtensorMap map_a;
  CUtensorMap map_b;
  // Both boxes are [128 rows][64 K]: 64 bf16 = 128 bytes, the 128B swizzle span. B's box is half
  // the 256-row slab; the two CTAs of a cluster load one half each.
  if (ptx::make_tmap_2d(&map_a, A, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, K, M,
                        static_cast<uint64_t>(K) * 2, kBK, kBM,
                        CU_TENSOR_MAP_SWIZZLE_128B) != CUDA_SUCCESS ||
      ptx::make_tmap_2d(&map_b, B, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, K, N,
                        static_cast<uint64_t>(K) * 2, kBK, kHalfRowsB,
                        CU_TENSOR_MAP_SWIZZLE_128B) != CUDA_SUCCESS) {
    return static_cast<int>(cudaErrorInvalidValue);
  }
  const cudaError_t attribute = ptx::set_max_dynamic_smem(gemm_cluster_kernel, kSmemBytes);
  if (attribute != cudaSuccess) return static_cast<int>(attribute);

  const int n_pairs_m = M / (kCluster * kBM);
  const int n_tiles_n = N / kBN;
  const int n_cluster_tiles = n_pairs_m * n_tiles_n;
  const int k_tiles = K / kBK;
  // streamk: every k-step index (tile * K/64 + kt) must fit an int.
  if (static_cast<long long>(n_cluster_tiles) * k_tiles >= 0x7fffffffLL) {
    return static_cast<int>(cudaErrorInvalidValue);
  }
  const int max_clusters = max_active_clusters();  // streamk: also sizes the workspace
  int clusters = max_clusters;
  if (clusters <= 0) return static_cast<int>(cudaErrorInvalidValue);
  if (clusters > n_cluster_tiles) clusters = n_cluster_tiles;

  // streamk: whole waves first, the leftover tiles' k-steps over sk_clusters clusters.
  const int dp_tiles = n_cluster_tiles / clusters * clusters;
  const int sk_tiles = n_cluster_tiles - dp_tiles;  // < clusters <= max_clusters
  int sk_clusters = 0;
  if (sk_tiles > 0) {
    const int by_length = sk_tiles * k_tiles / kMinSkSteps;
    sk_clusters = by_length > sk_tiles ? by_length : sk_tiles;
    if (sk_clusters > clusters) sk_clusters = clusters;
  }

  // streamk: the workspace and its counters, allocated and zeroed once (stream-ordered before the
  // first launch); every launch leaves them zero again (each slot's finisher cleans it).
  static float* workspace = nullptr;
  static int* counters = nullptr;
  static int slots = 0;
  if (workspace == nullptr) {
    const int want = max_clusters * kCluster * kConsumers;
    const size_t bytes = static_cast<size_t>(want) * (kSlotFloats * sizeof(float) + sizeof(int));
    cudaError_t err = cudaMalloc(&workspace, bytes);
    if (err != cudaSuccess) {
      workspace = nullptr;
      return static_cast<int>(err);
    }
    if ((err = cudaMemsetAsync(workspace, 0, bytes, stream)) != cudaSuccess) {
      cudaFree(workspace);
      workspace = nullptr;
      return static_cast<int>(err);
    }
    counters = reinterpret_cast<int*>(workspace + static_cast<size_t>(want) * kSlotFloats);
    slots = want;
  }
  if (sk_tiles * kCluster * kConsumers > slots) return static_cast<int>(cudaErrorInvalidValue);

  // streamk: the workspace, counters and split travel with today's arguments.
  const cudaError_t launch = ptx::launch_cluster(
      gemm_cluster_kernel, dim3(clusters * kCluster), dim3(kThreads), kSmemBytes, stream, kCluster,
      map_a, map_b, C, N, K, n_pairs_m, n_tiles_n, workspace, counters, dp_tiles, sk_clusters);
  if (launch != cudaSuccess) return static_cast<int>(launch);
  return static_cast<int>(cudaGetLastError());
}
