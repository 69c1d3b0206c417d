// Expert grouped-query attention PREFILL (ragged batch, bottom-right causal), head_dim 128,
// FlashAttention-3 style, PERSISTENT, for Hopper (sm_90a).
//
// The persistent version of the non-persistent kernel this file held until 2026-12-03 (in git
// history; H200: 0.89-0.99x FlashInfer per workload over three hosts, two workloads under 0.9x on
// one). The plan kernel, the tile code (Q K^T, the ragged causal mask, FA2's Check_inf, the online
// softmax, P V, the intra-warpgroup overlap) and the epilogue are that kernel's code, unchanged;
// the unit loop, the unit slot, the ticket counter and the continuous ping-pong are those of the
// persistent examples/expert/mha_fwd_causal_d128.cu. What is new is marked "persistent".
// Its desk checks are examples/expert/drafts/gqa_prefill_persistent_check.py (the persistent
// schedule) and gqa_prefill_check.py (the plan, the mask and the tile code).
//
//   q: [total_q, 32, 128] bf16, k, v: [total_kv, 8, 128] bf16 (head_dim contiguous);
//   sequence b owns query rows qo_indptr[b] .. qo_indptr[b+1] and key rows kv_indptr[b] ..
//   kv_indptr[b+1]; q_len <= kv_len; query i (0-based in its sequence) attends key j iff
//   j <= i + (kv_len - q_len).  Query head h reads KV head h / 4.  scale = 1/sqrt(128).
//   o: [total_q, 32, 128] bf16;  lse: [total_q, 32] fp32, natural log.
//
// Design (steps; the non-persistent kernel's tile-level design notes hold unchanged and are
// repeated in short at the end):
//   1. plan (as before): one block counting-sorts the query tiles (sequence b, 128-row
//      tile t) by cost n_kv, heaviest first, into items[0 .. max_items-1]; entries past the real
//      tile count are {-1, 0}. persistent: thread 0 also writes the real tile count n_items into
//      sched[kSchedItems] (cursor[0], the end of the last bucket), so the attention kernel knows
//      where the live units end without a host read, and zeroes the ticket counter (step 4).
//   2. persistent, units: a WORK UNIT is (item, query head h), ONE head per unit:
//      unit u -> item u / 32, head u % 32, KV head (u % 32) / 4. So the units go heaviest item
//      first, and the 4 query heads of one (item, KV head) are adjacent units: 4 SMs stream the
//      same K/V tiles at about the same time (one HBM read, three L2 hits). n_units = 32 *
//      n_items (device-side); every unit below it is live, because dead items sit at the end of
//      the sorted list. One head per unit (not 2 or 4 as the non-persistent kernel): persistence
//      already amortises the CTA start, so the finest split balances best (desk check, part d).
//   3. persistent, grid: min(number of SMs, 32 * max_items) CTAs of 384 threads, 1 per SM
//      (230,544 B of shared memory). A CTA whose blockIdx.x >= n_units (fewer units than SMs)
//      returns before touching any barrier.
//   4. persistent, dispatch (as mha_fwd_causal_d128.cu): the first unit of CTA c is c; later ones
//      are tickets, unit = gridDim.x + atomicAdd(&sched[kSchedCounter], 1), drawn by the
//      producer's elected thread right after it issued the current unit's last K/V load (the
//      atomic's and the next item's load latency hide behind the consumers' last kStages
//      tiles). A CTA stops at its first unit >= n_units. Draw count per launch: every unit
//      u >= grid is drawn once (ticket u - grid), and every CTA that had a first unit draws one
//      final ticket (unit >= n_units), so a launch draws max(0, n_units - grid) + min(grid,
//      n_units) = n_units tickets, values 0 .. n_units-1, each once. The drawer of value
//      n_units - 1 therefore makes the launch's LAST draw and zeroes the counter (atomicExch):
//      no memset enters the timed call, and the next launch on the stream starts from 0. The
//      counter is zeroed when it is allocated (first call) and, as a second guard that costs
//      nothing, by the plan kernel of every call (as drafts/gqa_prefill_packed.cu does): the
//      attention kernel then starts from 0 even after a launch that did not finish (an error,
//      a killed run), and the self-reset keeps the counter at 0 between calls on its own.
//   5. persistent, hand-over: one Q buffer and a unit slot in shared memory (head, tile, q_start,
//      q_len, kv_len; head -1 = end). The producer waits q_empty (8 consumer-warp arrivals, each
//      after that warp's LAST S = Q K^T of the unit retired), writes the slot, then arrives on
//      q_full with Q's TMA bytes; the consumers wait q_full and read the slot (no global load on
//      their path). So the next unit's Q and first K/V tiles load during the current unit's last
//      softmax, P V and epilogue. The producer reads the next unit's item and indptr entries
//      right after drawing its ticket, before it waits on q_empty.
//   6. persistent, phases: the K and V rings' (stage, parity) and q_full/q_empty's parity (unit
//      counter & 1) continue across units, never reset; each unit advances each ring n_kv times
//      on both sides.
//   7. persistent, ping-pong (as mha_fwd_causal_d128.cu): consumer 1 primes named barrier 1 once
//      per CTA, every hand-over arrive is made (none skipped: the last one of a unit opens the
//      other consumer's first turn of the next unit), and consumer 0 takes one extra sync on
//      bar 1 when it reads the end of the list. Per CTA: bar 1 gets 1 + sum(n_kv) arrives of
//      consumer 1 and sum(n_kv) + 1 syncs of consumer 0; bar 2 sum(n_kv) of each.
//   8. tile (as before): K/V tiles n_kv-1 .. 0 downwards, n_kv = (i_max + d)/128 + 1,
//      d = kv_len - q_len, the first n_mask <= 2 processed tiles masked (col - row > 128(t-j) +
//      d), Check_inf for rows fully masked so far, only rows < q_len written. 384 threads: WG0
//      producer (setmaxnreg 40, one elected thread issues all TMA), WG1/WG2 consumers
//      (setmaxnreg 232, 64 query rows each), 3-stage K and V rings of full/empty mbarriers.
//      Tensor maps 3-D, 128B swizzle, box {64, 1, 128}; made on the host and cached.
// Shared memory: Q 32 KB + 3 x (K 32 KB + V 32 KB) + 14 mbarriers (112 B) + the unit slot (32 B)
// + 1 KB alignment slack = 230544 B of 232448 B.
//
// On the H200 (2026-12-03, twice on one host, `ptxgym eval`'s default settings): PASSED on all 5
// workloads, qualified, memcheck clean, 0.983x and 0.984x FlashInfer (0.933-1.003x per workload)
// where the non-persistent kernel ran 0.939x (0.904-0.992x) beside it.

#include "ptxgym_h100.cuh"

#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cstdint>
#include <cmath>

namespace {

constexpr int kD = 128;         // head dimension (fixed)
constexpr int kQoHeads = 32;
constexpr int kKvHeads = 8;
constexpr int kGroup = kQoHeads / kKvHeads;  // 4 query heads per KV head
constexpr int kBM = 128;        // query rows per tile: 2 consumer warpgroups x 64
constexpr int kBN = 128;        // keys per K/V tile
constexpr int kStages = 3;      // depth of each of the K and V rings
constexpr int kThreads = 384;   // producer WG + 2 consumer WGs


// persistent: one query head per work unit; unit u = item u / 32, head u % 32 (step 2).
constexpr int kUnitsPerItem = kQoHeads;
// persistent: the small scheduling buffer (ints): the ticket counter and the plan's tile count,
// a 128-byte line apart (the count is read by every CTA, the counter hammered by atomics).
constexpr int kSchedCounter = 0;
constexpr int kSchedItems = 32;
constexpr int kSchedInts = 64;

// plan: cost buckets of the counting sort (cost = K/V tiles of a query tile, clamped; exact up
// to kv_len = 1024 * 128 = 131072, beyond that only the order degrades, not the coverage).
constexpr int kPlanThreads = 1024;
constexpr int kBuckets = 1024;

constexpr uint32_t kBoxBytes = 128u * 64u * 2u;   // [128 rows][64 bf16], 128B-swizzled
constexpr uint32_t kTileBytes = 2u * kBoxBytes;   // 32 KB: Q tile, one K stage or one V stage

constexpr uint32_t kOffQ = 0;
constexpr uint32_t kOffK = kOffQ + kTileBytes;
constexpr uint32_t kOffV = kOffK + kStages * kTileBytes;
constexpr uint32_t kOffBar = kOffV + kStages * kTileBytes;
// q_full, q_empty, k_full[], k_empty[], v_full[], v_empty[]
constexpr uint32_t kNumBars = 2 + 4 * kStages;
constexpr uint32_t kOffSlot = kOffBar + 8 * kNumBars;  // persistent: the unit slot (8 ints)
constexpr uint32_t kSlotInts = 8;  // head (-1: end), tile, q_start, q_len, kv_len, unused
constexpr uint32_t kSmemBytes = kOffSlot + 4 * kSlotInts + 1024;  // +1 KB to round the base up
static_assert(kSmemBytes <= 232448, "dynamic shared memory over the 227 KB limit");

// Empty barriers (and q_empty): one arrival per consumer warp (2 warpgroups x 4 warps).
constexpr uint32_t kEmptyArrivals = 8;
constexpr uint32_t kTurnBar = 1;  // named barriers 1, 2: ping-pong turns of consumer 0, 1

constexpr float kLn2 = 0.69314718055994531f;

__device__ __forceinline__ void fence_frag(uint32_t (&p)[8][4]) {
#pragma unroll
  for (int s = 0; s < 8; ++s) ptx::fence_regs(p[s]);
}

__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
  return x;
}

__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  x += __shfl_xor_sync(0xffffffffu, x, 2);
  return x;
}

// ragged: the exponent offset of a row whose running max is still -inf (all its scores so far
// masked). Using 0 there keeps ex2(s*c - m) = ex2(-inf) = 0 and ex2(m_old - m) = 0 (no -inf+inf).
__device__ __forceinline__ float finite_or_zero(float m) { return m == -INFINITY ? 0.f : m; }

// S = Q_g K^T over D = 128 (as in mha_fwd_causal_d128.cu).
__device__ __forceinline__ void issue_qk(float (&s_acc)[64], uint64_t dq, uint64_t dk) {
#pragma unroll
  for (int kk = 0; kk < 8; ++kk) {
    const uint32_t off = static_cast<uint32_t>(kk / 4) * kBoxBytes + static_cast<uint32_t>(kk % 4) * 32u;
    ptx::wgmma_ss<128, 0, 0>(s_acc, ptx::desc_advance(dq, off), ptx::desc_advance(dk, off),
                             kk > 0 ? 1 : 0);
  }
}

// O += P V over the 128 keys of one tile (as in mha_fwd_causal_d128.cu).
__device__ __forceinline__ void issue_pv(float (&o_acc)[64], const uint32_t (&pf)[8][4],
                                         uint64_t dv) {
#pragma unroll
  for (int s = 0; s < 8; ++s) {
    ptx::wgmma_rs<128, 1>(o_acc, pf[s], ptx::desc_advance(dv, 2048u * static_cast<uint32_t>(s)), 1);
  }
}

// ragged causal mask of one K/V tile. row = this thread's first row in the tile (64g + r0),
// off = 128(t - j) + d. Register 4jj+e: row, column 8jj+2q+e; 4jj+2+e: row+8, same column
// (contracts §2). Masked iff column - row > off  <=>  8jj + e > off + row - 2q.
__device__ __forceinline__ void mask_tile(float (&s_acc)[64], int row, int q, int off) {
  const float kNegInf = -INFINITY;
  const int lim0 = off + row - 2 * q;  // row
  const int lim1 = lim0 + 8;           // row + 8
#pragma unroll
  for (int jj = 0; jj < 16; ++jj) {
    if (8 * jj + 0 > lim0) s_acc[4 * jj + 0] = kNegInf;
    if (8 * jj + 1 > lim0) s_acc[4 * jj + 1] = kNegInf;
    if (8 * jj + 0 > lim1) s_acc[4 * jj + 2] = kNegInf;
    if (8 * jj + 1 > lim1) s_acc[4 * jj + 3] = kNegInf;
  }
}

// Number of K/V tiles query tile t needs, and how many of the first processed (downward) need
// the mask. Used by the plan (cost) and by the attention kernel (producer and consumers alike).
__device__ __forceinline__ int tile_n_kv(int t, int q_len, int kv_len) {
  const int i_max = min(kBM * t + kBM - 1, q_len - 1);  // last valid row of the tile
  return (i_max + (kv_len - q_len)) / kBN + 1;           // i_max + d >= 0
}

// =============================================================================== plan kernel
// One block. Counting sort of all query tiles (b, t) by n_kv, descending.
__global__ void __launch_bounds__(kPlanThreads, 1)
    gqa_prefill_plan_kernel(const int* __restrict__ qo_indptr, const int* __restrict__ kv_indptr,
                            int batch_size, int2* __restrict__ items, int max_items,
                            int* __restrict__ sched) {
  __shared__ int hist[kBuckets];    // tiles per cost bucket
  __shared__ int cursor[kBuckets];  // next free slot of each bucket
  __shared__ int warp_sums[kPlanThreads / 32];
  const int tid = static_cast<int>(threadIdx.x);
  for (int i = tid; i < kBuckets; i += kPlanThreads) hist[i] = 0;
  __syncthreads();

  // 1. histogram of costs
  for (int b = tid; b < batch_size; b += kPlanThreads) {
    const int q_len = qo_indptr[b + 1] - qo_indptr[b];
    const int kv_len = kv_indptr[b + 1] - kv_indptr[b];
    const int n_t = (q_len + kBM - 1) / kBM;
    for (int t = 0; t < n_t; ++t) {
      const int c = min(tile_n_kv(t, q_len, kv_len), kBuckets - 1);
      atomicAdd(&hist[c], 1);
    }
  }
  __syncthreads();

  // 2. exclusive scan in DESCENDING cost: thread i owns bucket kBuckets-1-i, so the heaviest
  //    bucket starts at 0. kBuckets == kPlanThreads: one bucket per thread.
  static_assert(kBuckets == kPlanThreads, "one bucket per plan thread");
  const int bucket = kBuckets - 1 - tid;
  const int v = hist[bucket];
  const int lane = tid % 32, warp = tid / 32;
  int incl = v;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int n = __shfl_up_sync(0xffffffffu, incl, o);
    if (lane >= o) incl += n;
  }
  if (lane == 31) warp_sums[warp] = incl;
  __syncthreads();
  if (warp == 0) {
    int w = warp_sums[lane];  // kPlanThreads / 32 == 32 warps
    int wi = w;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int n = __shfl_up_sync(0xffffffffu, wi, o);
      if (lane >= o) wi += n;
    }
    warp_sums[lane] = wi - w;  // exclusive prefix over warps
  }
  __syncthreads();
  cursor[bucket] = warp_sums[warp] + incl - v;
  __syncthreads();

  // 3. placement (order inside a bucket is arbitrary: atomics)
  for (int b = tid; b < batch_size; b += kPlanThreads) {
    const int q_len = qo_indptr[b + 1] - qo_indptr[b];
    const int kv_len = kv_indptr[b + 1] - kv_indptr[b];
    const int n_t = (q_len + kBM - 1) / kBM;
    for (int t = 0; t < n_t; ++t) {
      const int c = min(tile_n_kv(t, q_len, kv_len), kBuckets - 1);
      const int pos = atomicAdd(&cursor[c], 1);
      if (pos < max_items) items[pos] = make_int2(b, t);  // pos < max_items by the host bound
    }
  }
  __syncthreads();

  // 4. dead entries: after step 3 every cursor[c] is the end of bucket c, and bucket 0 (cost 0,
  //    never used) is the last bucket in descending order, so cursor[0] = the number of tiles.
  for (int p = cursor[0] + tid; p < max_items; p += kPlanThreads) items[p] = make_int2(-1, 0);
  // persistent: the real tile count, for the attention kernel's n_units (step 1). cursor[0] is
  // stable since the barrier after step 3; min() only guards the host bound. The ticket counter
  // is zeroed here too (step 4): already 0 after a complete launch, this makes the call
  // independent of how the previous launch ended.
  if (tid == 0) {
    sched[kSchedItems] = min(cursor[0], max_items);
    sched[kSchedCounter] = 0;
  }
}


// ========================================================================== attention kernel
__global__ void __launch_bounds__(kThreads, 1)
    gqa_prefill_persistent_kernel(const __grid_constant__ CUtensorMap tmQ,
                                  const __grid_constant__ CUtensorMap tmK,
                                  const __grid_constant__ CUtensorMap tmV,
                                  const int* __restrict__ qo_indptr,
                                  const int* __restrict__ kv_indptr,
                                  const int2* __restrict__ items, int* __restrict__ sched,
                                  __nv_bfloat16* __restrict__ O, float* __restrict__ LSE,
                                  float scale_log2) {
  // ---- 0. persistent: live units (step 2); a CTA without a first unit leaves at once ----
  const int n_units = kUnitsPerItem * sched[kSchedItems];
  if (static_cast<int>(blockIdx.x) >= n_units) return;  // CTA-uniform, before any barrier

  extern __shared__ uint8_t smem_raw[];
  uint8_t* sm = reinterpret_cast<uint8_t*>(
      (reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~static_cast<uintptr_t>(1023));
  uint8_t* sQ = sm + kOffQ;
  uint8_t* sK = sm + kOffK;
  uint8_t* sV = sm + kOffV;
  uint64_t* bars = reinterpret_cast<uint64_t*>(sm + kOffBar);
  uint64_t* q_full = bars;
  uint64_t* q_empty = bars + 1;
  uint64_t* k_full = bars + 2;
  uint64_t* k_empty = bars + 2 + kStages;
  uint64_t* v_full = bars + 2 + 2 * kStages;
  uint64_t* v_empty = bars + 2 + 3 * kStages;
  // persistent: the unit the Q buffer holds (step 5). Written by the producer before its q_full
  // arrive (release), read by the consumers after their q_full wait (acquire), rewritten only
  // after q_empty, i.e. after every consumer warp has read it.
  volatile int* slot = reinterpret_cast<volatile int*>(sm + kOffSlot);

  if (threadIdx.x == 0) {
    ptx::mbar_init(q_full, 1);
    ptx::mbar_init(q_empty, kEmptyArrivals);
#pragma unroll
    for (int s = 0; s < kStages; ++s) {
      ptx::mbar_init(&k_full[s], 1);
      ptx::mbar_init(&k_empty[s], kEmptyArrivals);
      ptx::mbar_init(&v_full[s], 1);
      ptx::mbar_init(&v_empty[s], kEmptyArrivals);
    }
    ptx::fence_mbarrier_init();
    ptx::prefetch_tmap(&tmQ);
    ptx::prefetch_tmap(&tmK);
    ptx::prefetch_tmap(&tmV);
  }
  __syncthreads();

  const uint32_t wg = ptx::warpgroup_idx();
  if (wg == 0) {
    // ------------------------------------------------------------------ 1. producer warpgroup
    ptx::setmaxnreg_dec<40>();
    if (ptx::warp_idx() == 0 && ptx::elect_one_sync()) {
      int kst = 0, vst = 0;
      uint32_t kph = 0, vph = 0;
      // 1a. persistent: the first unit is blockIdx.x (< n_units, see 0.); later ones are tickets.
      int unit = static_cast<int>(blockIdx.x);
      // The unit's item and sequence bounds, read ahead of the q_empty wait (step 5).
      int2 itm = items[unit / kUnitsPerItem];
      int q_start = qo_indptr[itm.x];
      int q_end = qo_indptr[itm.x + 1];
      int kv_start = kv_indptr[itm.x];
      int kv_end = kv_indptr[itm.x + 1];
#pragma unroll 1
      for (uint32_t it = 0;; ++it) {
        // 1b. Q buffer and slot free: every consumer warp's last S GEMM of the previous unit
        // retired. Fresh barrier at it = 0: parity 1 passes at once.
        ptx::mbar_wait(q_empty, (it & 1u) ^ 1u);
        if (unit >= n_units) {
          // End of the list: slot -1, q_full's phase completes on this arrival alone (no tx).
          slot[0] = -1;
          ptx::mbar_arrive(q_full);
          break;
        }
        const int h = unit % kUnitsPerItem;  // query head
        const int kvh = h / kGroup;          // gqa: its KV head
        const int t = itm.y;                 // query tile of sequence itm.x
        const int q_len = q_end - q_start;
        const int kv_len = kv_end - kv_start;
        const int n_kv = tile_n_kv(t, q_len, kv_len);  // >= 1
        slot[0] = h;
        slot[1] = t;
        slot[2] = q_start;
        slot[3] = q_len;
        slot[4] = kv_len;
        // 1c. Q of this unit.
        const int q_tok = q_start + t * kBM;
        ptx::mbar_arrive_expect_tx(q_full, kTileBytes);
        ptx::tma_load_3d(sQ, &tmQ, q_full, 0, h, q_tok);               // d 0..63
        ptx::tma_load_3d(sQ + kBoxBytes, &tmQ, q_full, 64, h, q_tok);  // d 64..127
        // 1d. K/V tiles n_kv-1 .. 0 of this sequence, KV head kvh; the rings continue from the
        // previous unit (step 6).
        for (int i = 0; i < n_kv; ++i) {
          const int tok = kv_start + (n_kv - 1 - i) * kBN;
          ptx::mbar_wait(&k_empty[kst], kph ^ 1u);
          ptx::mbar_arrive_expect_tx(&k_full[kst], kTileBytes);
          uint8_t* dk = sK + kst * kTileBytes;
          ptx::tma_load_3d(dk, &tmK, &k_full[kst], 0, kvh, tok);
          ptx::tma_load_3d(dk + kBoxBytes, &tmK, &k_full[kst], 64, kvh, tok);
          if (++kst == kStages) { kst = 0; kph ^= 1u; }
          ptx::mbar_wait(&v_empty[vst], vph ^ 1u);
          ptx::mbar_arrive_expect_tx(&v_full[vst], kTileBytes);
          uint8_t* dv = sV + vst * kTileBytes;
          ptx::tma_load_3d(dv, &tmV, &v_full[vst], 0, kvh, tok);
          ptx::tma_load_3d(dv + kBoxBytes, &tmV, &v_full[vst], 64, kvh, tok);
          if (++vst == kStages) { vst = 0; vph ^= 1u; }
        }
        // 1e. persistent: claim the next unit (step 4). The draw of ticket value n_units - 1 is
        // the launch's last draw: it resets the counter for the next launch.
        const int ticket = atomicAdd(&sched[kSchedCounter], 1);
        if (ticket == n_units - 1) atomicExch(&sched[kSchedCounter], 0);
        unit = static_cast<int>(gridDim.x) + ticket;
        if (unit < n_units) {
          itm = items[unit / kUnitsPerItem];
          q_start = qo_indptr[itm.x];
          q_end = qo_indptr[itm.x + 1];
          kv_start = kv_indptr[itm.x];
          kv_end = kv_indptr[itm.x + 1];
        }
      }
    }
    // The other producer threads have nothing to do; no CTA-wide barrier follows.
    return;
  }

  // -------------------------------------------------------------------- 2. consumer warpgroups
  ptx::setmaxnreg_inc<232>();
  const uint32_t g = wg - 1;                  // 0 or 1: query rows 64g .. 64g+63 of the tile
  const uint32_t tt = threadIdx.x % 128u;     // thread in the warpgroup
  const uint32_t warp = tt / 32u;
  const uint32_t lane = tt % 32u;
  const bool warp_leader = (lane == 0);
  const float c = scale_log2;                 // scale * log2(e)
  const uint32_t r0 = 16u * warp + lane / 4u;  // accumulator rows r0 and r0 + 8 (contracts §2)
  const uint32_t q = lane % 4u;                // accumulator columns 8j + 2q, 8j + 2q + 1
  const int row_t = static_cast<int>(64u * g + r0);  // this thread's first row in the tile

  const uint64_t dq = ptx::make_desc_kmajor_sw128(sQ + g * 8192u);

  float s_acc[64];
  float o_acc[64];
  uint32_t pf[8][4];
  float m0, m1;       // running max (log2 units, scaled; may be -inf while all keys masked)
  float l0, l1;
  float sc0, sc1;

  int kst = 0, vst = 0;
  uint32_t kph = 0, vph = 0;

  // Ping-pong priming, persistent: ONCE per CTA, consumer 0 issues first; the turns then
  // alternate across unit boundaries (step 7).
  if (g == 1) ptx::named_bar_arrive(kTurnBar + 0, 256);

#pragma unroll 1
  for (uint32_t it = 0;; ++it) {
    // ---- 2a. persistent: next unit (Q and the slot arrive together on q_full) ----
    ptx::mbar_wait(q_full, it & 1u);
    const int h = slot[0];
    if (h < 0) {
      // End: consumer 1's last hand-over is still pending on bar 1; consumer 0 takes it so no
      // named-barrier generation is left open.
      if (g == 0) ptx::named_bar_sync(kTurnBar + 0, 256);
      break;
    }
    const int t = slot[1];
    const int q_start = slot[2];
    const int q_len = slot[3];
    const int kv_len = slot[4];
    const int dq_off = kv_len - q_len;  // d >= 0: bottom-right alignment
    // ragged causal: tiles 0 .. n_kv-1, processed downwards; the first n_mask of them are masked.
    const int n_kv = tile_n_kv(t, q_len, kv_len);               // >= 1
    const int j_min = t + (dq_off + 1) / kBN;                    // lowest tile needing the mask
    const int n_mask = max(1, n_kv - j_min);                     // 1 or 2
    // ragged mask offset of processed block jb (tile n_kv-1-jb): off = 128(t - j) + d.
    const int off_first = kBN * (t - (n_kv - 1)) + dq_off;

#pragma unroll
    for (int i = 0; i < 64; ++i) o_acc[i] = 0.f;
    sc0 = 1.f;
    sc1 = 1.f;

    // ---- 2b. prologue: S = Q K_{n_kv-1}^T, always masked ----
    ptx::mbar_wait(&k_full[kst], kph);
    ptx::named_bar_sync(kTurnBar + g, 256);
    ptx::fence_regs(s_acc);
    ptx::wgmma_fence();
    issue_qk(s_acc, dq, ptx::make_desc_kmajor_sw128(sK + kst * kTileBytes));
    ptx::wgmma_commit();
    // persistent: the hand-over is never skipped (step 7).
    ptx::named_bar_arrive(kTurnBar + (1 - g), 256);
    ptx::wgmma_wait<0>();
    ptx::fence_regs(s_acc);
    if (warp_leader) {
      ptx::mbar_arrive(&k_empty[kst]);
      if (n_kv == 1) ptx::mbar_arrive(q_empty);  // persistent: this unit's last Q K^T retired
    }
    if (++kst == kStages) { kst = 0; kph ^= 1u; }
    mask_tile(s_acc, row_t, static_cast<int>(q), off_first);
    {
      float mx0 = fmaxf(s_acc[0], s_acc[1]);
      float mx1 = fmaxf(s_acc[2], s_acc[3]);
#pragma unroll
      for (int j = 1; j < 16; ++j) {
        mx0 = fmaxf(mx0, fmaxf(s_acc[4 * j + 0], s_acc[4 * j + 1]));
        mx1 = fmaxf(mx1, fmaxf(s_acc[4 * j + 2], s_acc[4 * j + 3]));
      }
      m0 = quad_max(mx0) * c;  // -inf if the whole row of this tile is masked
      m1 = quad_max(mx1) * c;
      const float mu0 = finite_or_zero(m0);
      const float mu1 = finite_or_zero(m1);
      float a0 = 0.f, b0 = 0.f, a1 = 0.f, b1 = 0.f;
#pragma unroll
      for (int j = 0; j < 16; ++j) {
        s_acc[4 * j + 0] = ptx::ex2_approx(fmaf(s_acc[4 * j + 0], c, -mu0));
        s_acc[4 * j + 1] = ptx::ex2_approx(fmaf(s_acc[4 * j + 1], c, -mu0));
        s_acc[4 * j + 2] = ptx::ex2_approx(fmaf(s_acc[4 * j + 2], c, -mu1));
        s_acc[4 * j + 3] = ptx::ex2_approx(fmaf(s_acc[4 * j + 3], c, -mu1));
        a0 += s_acc[4 * j + 0];
        b0 += s_acc[4 * j + 1];
        a1 += s_acc[4 * j + 2];
        b1 += s_acc[4 * j + 3];
      }
      l0 = a0 + b0;
      l1 = a1 + b1;
    }
#pragma unroll
    for (int s = 0; s < 8; ++s) {
      pf[s][0] = ptx::pack_bf16x2(s_acc[8 * s + 0], s_acc[8 * s + 1]);
      pf[s][1] = ptx::pack_bf16x2(s_acc[8 * s + 2], s_acc[8 * s + 3]);
      pf[s][2] = ptx::pack_bf16x2(s_acc[8 * s + 4], s_acc[8 * s + 5]);
      pf[s][3] = ptx::pack_bf16x2(s_acc[8 * s + 6], s_acc[8 * s + 7]);
    }

    // ---- 2b. steady state: block j (tile n_kv-1-j) S GEMM with block j-1's P V in flight ----
#pragma unroll 1
    for (int j = 1; j < n_kv; ++j) {
      ptx::mbar_wait(&k_full[kst], kph);
      ptx::named_bar_sync(kTurnBar + g, 256);
      ptx::fence_regs(s_acc);
      ptx::wgmma_fence();
      issue_qk(s_acc, dq, ptx::make_desc_kmajor_sw128(sK + kst * kTileBytes));
      ptx::wgmma_commit();                                   // group G_S(j)
#pragma unroll
      for (int i = 0; i < 64; i += 4) {
        o_acc[i + 0] *= sc0;
        o_acc[i + 1] *= sc0;
        o_acc[i + 2] *= sc1;
        o_acc[i + 3] *= sc1;
      }
      ptx::mbar_wait(&v_full[vst], vph);
      ptx::fence_regs(o_acc);
      fence_frag(pf);
      ptx::wgmma_fence();
      issue_pv(o_acc, pf, ptx::make_desc_mnmajor_sw128(sV + vst * kTileBytes, kBoxBytes));
      ptx::wgmma_commit();                                   // group G_PV(j-1)
      ptx::named_bar_arrive(kTurnBar + (1 - g), 256);        // persistent: never skipped

      ptx::wgmma_wait<1>();  // G_S(j) done; G_PV(j-1) may still run
      ptx::fence_regs(s_acc);
      if (warp_leader) {
        ptx::mbar_arrive(&k_empty[kst]);
        if (j == n_kv - 1) ptx::mbar_arrive(q_empty);  // persistent: last Q K^T of the unit
      }
      if (++kst == kStages) { kst = 0; kph ^= 1u; }

      // ragged causal: the second processed tile may still cross the diagonal (d % 128 != 0 or
      // a partial last query tile); warp-uniform branch, taken at most once per unit.
      if (j < n_mask) mask_tile(s_acc, row_t, static_cast<int>(q), off_first + kBN * j);

      {
        float mx0 = fmaxf(s_acc[0], s_acc[1]);
        float mx1 = fmaxf(s_acc[2], s_acc[3]);
#pragma unroll
        for (int jj = 1; jj < 16; ++jj) {
          mx0 = fmaxf(mx0, fmaxf(s_acc[4 * jj + 0], s_acc[4 * jj + 1]));
          mx1 = fmaxf(mx1, fmaxf(s_acc[4 * jj + 2], s_acc[4 * jj + 3]));
        }
        const float mn0 = fmaxf(m0, quad_max(mx0) * c);
        const float mn1 = fmaxf(m1, quad_max(mx1) * c);
        const float mu0 = finite_or_zero(mn0);
        const float mu1 = finite_or_zero(mn1);
        sc0 = ptx::ex2_approx(m0 - mu0);  // 0 if m0 = -inf (O, l are 0 then anyway)
        sc1 = ptx::ex2_approx(m1 - mu1);
        m0 = mn0;
        m1 = mn1;
        float a0 = 0.f, b0 = 0.f, a1 = 0.f, b1 = 0.f;
#pragma unroll
        for (int jj = 0; jj < 16; ++jj) {
          s_acc[4 * jj + 0] = ptx::ex2_approx(fmaf(s_acc[4 * jj + 0], c, -mu0));
          s_acc[4 * jj + 1] = ptx::ex2_approx(fmaf(s_acc[4 * jj + 1], c, -mu0));
          s_acc[4 * jj + 2] = ptx::ex2_approx(fmaf(s_acc[4 * jj + 2], c, -mu1));
          s_acc[4 * jj + 3] = ptx::ex2_approx(fmaf(s_acc[4 * jj + 3], c, -mu1));
          a0 += s_acc[4 * jj + 0];
          b0 += s_acc[4 * jj + 1];
          a1 += s_acc[4 * jj + 2];
          b1 += s_acc[4 * jj + 3];
        }
        l0 = fmaf(l0, sc0, a0 + b0);
        l1 = fmaf(l1, sc1, a1 + b1);
      }

      // As in the causal kernel: a K_{j+1} wait here keeps ptxas from hoisting the DEPBAR of
      // the wait below above the softmax's MUFU.EX2 (re-waiting a completed phase is safe).
      if (j + 1 < n_kv) ptx::mbar_wait(&k_full[kst], kph);
      ptx::wgmma_wait<0>();  // G_PV(j-1) done
      ptx::fence_regs(o_acc);
      fence_frag(pf);
      if (warp_leader) ptx::mbar_arrive(&v_empty[vst]);
      if (++vst == kStages) { vst = 0; vph ^= 1u; }
#pragma unroll
      for (int s = 0; s < 8; ++s) {
        pf[s][0] = ptx::pack_bf16x2(s_acc[8 * s + 0], s_acc[8 * s + 1]);
        pf[s][1] = ptx::pack_bf16x2(s_acc[8 * s + 2], s_acc[8 * s + 3]);
        pf[s][2] = ptx::pack_bf16x2(s_acc[8 * s + 4], s_acc[8 * s + 5]);
        pf[s][3] = ptx::pack_bf16x2(s_acc[8 * s + 6], s_acc[8 * s + 7]);
      }
    }

    // ---- 2c. tail: P_{n-1} V_{n-1} (K/V tile 0) ----
#pragma unroll
    for (int i = 0; i < 64; i += 4) {
      o_acc[i + 0] *= sc0;
      o_acc[i + 1] *= sc0;
      o_acc[i + 2] *= sc1;
      o_acc[i + 3] *= sc1;
    }
    ptx::mbar_wait(&v_full[vst], vph);
    ptx::fence_regs(o_acc);
    fence_frag(pf);
    ptx::wgmma_fence();
    issue_pv(o_acc, pf, ptx::make_desc_mnmajor_sw128(sV + vst * kTileBytes, kBoxBytes));
    ptx::wgmma_commit();
    ptx::wgmma_wait<0>();
    ptx::fence_regs(o_acc);
    fence_frag(pf);
    // persistent: needed now, the producer refills this stage for a later unit.
    if (warp_leader) ptx::mbar_arrive(&v_empty[vst]);
    if (++vst == kStages) { vst = 0; vph ^= 1u; }

    // ---- 2d. epilogue: rows < q_len only ----
    l0 = quad_sum(l0);
    l1 = quad_sum(l1);
    // l >= 1 for every row: key 0 (tile 0, processed last) is kept by every row (i + d >= 0),
    // and the row maximum contributes ex2(0) = 1.
    const float inv0 = 1.f / l0;
    const float inv1 = 1.f / l1;
    const int row0 = t * kBM + row_t;  // row within the sequence
    const int row1 = row0 + 8;
    const size_t tok_stride = static_cast<size_t>(kQoHeads) * kD;
    __nv_bfloat16* o0 =
        O + static_cast<size_t>(q_start + row0) * tok_stride + static_cast<size_t>(h) * kD;
    __nv_bfloat16* o1 = o0 + 8 * tok_stride;
    const bool ok0 = row0 < q_len;
    const bool ok1 = row1 < q_len;
#pragma unroll
    for (int jj = 0; jj < 16; ++jj) {
      const int col = 8 * jj + 2 * static_cast<int>(q);
      if (ok0)
        *reinterpret_cast<uint32_t*>(o0 + col) =
            ptx::pack_bf16x2(o_acc[4 * jj + 0] * inv0, o_acc[4 * jj + 1] * inv0);
      if (ok1)
        *reinterpret_cast<uint32_t*>(o1 + col) =
            ptx::pack_bf16x2(o_acc[4 * jj + 2] * inv1, o_acc[4 * jj + 3] * inv1);
    }
    if (q == 0) {
      if (ok0) LSE[static_cast<size_t>(q_start + row0) * kQoHeads + h] = (m0 + log2f(l0)) * kLn2;
      if (ok1) LSE[static_cast<size_t>(q_start + row1) * kQoHeads + h] = (m1 + log2f(l1)) * kLn2;
    }
  }
}

// 3-D tensor map over a [tokens, heads, 128] bf16 tensor: dims {128, heads, tokens}, strides
// {256 B, heads*256 B}, box {64, 1, 128}, 128B swizzle.
CUresult make_map(CUtensorMap* map, const __nv_bfloat16* p, int tokens, int heads) {
  return ptx::make_tmap_3d(map, p, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, kD,
                           static_cast<uint64_t>(heads), static_cast<uint64_t>(tokens),
                           static_cast<uint64_t>(kD) * 2, static_cast<uint64_t>(heads) * kD * 2,
                           64, 1, kBN, CU_TENSOR_MAP_SWIZZLE_128B);
}

}  // namespace

extern "C" int gqa_prefill(const __nv_bfloat16* q, const __nv_bfloat16* k,
                           const __nv_bfloat16* v, const int* qo_indptr, const int* kv_indptr,
                           __nv_bfloat16* o, float* lse, int batch_size, int total_q,
                           int total_kv, cudaStream_t stream) {
  if (batch_size < 0 || total_q < 0 || total_kv < 0) return static_cast<int>(cudaErrorInvalidValue);
  if (batch_size == 0 || total_q == 0) return static_cast<int>(cudaGetLastError());
  if (total_kv == 0) return static_cast<int>(cudaErrorInvalidValue);  // q_len <= kv_len
  if ((reinterpret_cast<uintptr_t>(o) % 4) != 0) return static_cast<int>(cudaErrorInvalidValue);

  // Host state kept across calls: SM count, smem opt-in, the tensor maps of the last pointers,
  // the work list buffer (grown rarely) and the scheduling buffer (ticket counter + tile count).
  // Stream-ordered use, one call at a time on one stream assumed (as in gqa_decode.cu).
  static int num_sms = 0;
  static bool smem_set = false;
  static int2* items = nullptr;
  static size_t items_cap = 0;
  static int* sched = nullptr;
  static CUtensorMap tmQ, tmK, tmV;
  static const void* map_q = nullptr;
  static const void* map_k = nullptr;
  static const void* map_v = nullptr;
  static int map_tq = -1, map_tkv = -1;
  cudaError_t err;

  if (num_sms == 0) {
    int dev = 0;
    if ((err = cudaGetDevice(&dev)) != cudaSuccess) return static_cast<int>(err);
    int n = 0;
    if ((err = cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev)) != cudaSuccess)
      return static_cast<int>(err);
    if (n <= 0) return static_cast<int>(cudaErrorInvalidValue);
    num_sms = n;
  }
  if (!smem_set) {
    if ((err = ptx::set_max_dynamic_smem(gqa_prefill_persistent_kernel,
                                         static_cast<int>(kSmemBytes))) != cudaSuccess)
      return static_cast<int>(err);
    smem_set = true;
  }
  if (sched == nullptr) {
    // persistent: zeroed once, stream-ordered before the first launch; every launch leaves the
    // counter at 0 again (step 4), and the plan rewrites the tile count and re-zeroes the
    // counter on every call.
    if ((err = cudaMalloc(&sched, kSchedInts * sizeof(int))) != cudaSuccess)
      return static_cast<int>(err);
    if ((err = cudaMemsetAsync(sched, 0, kSchedInts * sizeof(int), stream)) != cudaSuccess) {
      cudaFree(sched);
      sched = nullptr;
      return static_cast<int>(err);
    }
  }
  if (map_q != q || map_k != k || map_v != v || map_tq != total_q || map_tkv != total_kv) {
    map_q = nullptr;  // invalid until all three are made
    if (make_map(&tmQ, q, total_q, kQoHeads) != CUDA_SUCCESS ||
        make_map(&tmK, k, total_kv, kKvHeads) != CUDA_SUCCESS ||
        make_map(&tmV, v, total_kv, kKvHeads) != CUDA_SUCCESS)
      return static_cast<int>(cudaErrorInvalidValue);
    map_q = q;
    map_k = k;
    map_v = v;
    map_tq = total_q;
    map_tkv = total_kv;
  }

  // plan: sum_b ceil(q_len_b / 128) <= (total_q + 127 * batch_size) / 128 (floor is exact: the
  // left side is an integer).
  const long long max_items_ll =
      (static_cast<long long>(total_q) + 127LL * batch_size) / kBM;
  // persistent: units (32 per item) and tickets (< gridDim.x + n_units) must stay below 2^31.
  if (max_items_ll * kUnitsPerItem + num_sms >= 0x7fffffffLL)
    return static_cast<int>(cudaErrorInvalidValue);
  const int max_items = static_cast<int>(max_items_ll);
  if (static_cast<size_t>(max_items) > items_cap) {
    if (items != nullptr) cudaFree(items);  // first call (or a larger batch) only
    items = nullptr;
    items_cap = 0;
    const size_t cap = max_items > 65536 ? static_cast<size_t>(max_items) : 65536u;
    if ((err = cudaMalloc(&items, cap * sizeof(int2))) != cudaSuccess) return static_cast<int>(err);
    items_cap = cap;
  }

  gqa_prefill_plan_kernel<<<1, kPlanThreads, 0, stream>>>(qo_indptr, kv_indptr, batch_size, items,
                                                         max_items, sched);
  if ((err = cudaGetLastError()) != cudaSuccess) return static_cast<int>(err);

  const float scale_log2 =
      static_cast<float>(1.4426950408889634 / std::sqrt(static_cast<double>(kD)));
  // persistent: one CTA per SM, never more than the host bound on the units (step 3).
  const long long units_bound = max_items_ll * kUnitsPerItem;
  const unsigned grid =
      static_cast<unsigned>(units_bound < num_sms ? units_bound : static_cast<long long>(num_sms));
  gqa_prefill_persistent_kernel<<<grid, kThreads, kSmemBytes, stream>>>(
      tmQ, tmK, tmV, qo_indptr, kv_indptr, items, sched, o, lse, scale_log2);
  return static_cast<int>(cudaGetLastError());
}
