// Expert CAUSAL attention forward, head_dim 128, FlashAttention-3 style, PERSISTENT, for Hopper
// (sm_90a).
//
// H200, 2026-12-03, `ptxgym eval` with default settings (benchmarks/experts.py, docs/benchmarks.md,
// twenty-second session): PASSED on its first GPU run, qualified (HGMMA 4,325,376 warps, UTMALDG
// 139,264), memcheck clean, 0.4606 ms against cuDNN's 0.4895 ms: 1.063x, where the non-persistent
// kernel it replaces ran 0.4878 ms (1.004x) on the same host; 0.4549 ms against 0.4868 ms (1.070x)
// in the table of every expert on a second host. Its desk check is
// examples/expert/drafts/causal_persistent_check.py (work decomposition, a barrier model over
// several units per CTA, the schedule model behind the work order).
//
// Derived from the GPU-verified non-persistent causal kernel this file held before (git history;
// H200: 0.4778 ms against cuDNN 0.4754 ms, 0.995x). The tiling, the wgmma descriptors, the mask, the online softmax, the
// intra-warpgroup overlap and the epilogue are that kernel's code; the unit loop, the Q handshake
// and the ring counters carried across units follow the GPU-verified examples/expert/gqa_prefill.cu
// (its loop over heads). What is new is marked "persistent".
//
//   Q, K, V, O: [B, S, H, 128] bf16 (D contiguous, heads interleaved: one head's consecutive
//   tokens are H*128 elements apart);  LSE: [B, H, S] fp32, natural log of sum_{j<=i} exp(scale*
//   q_i.k_j), scale = 1/sqrt(128), causal: query i attends keys j <= i (S_q = S_k, so the
//   diagonal is the main diagonal). S must be a multiple of 128 (cudaErrorInvalidValue otherwise).
//
// Design (packs/h100/scheduling.md §1.5, §2, causal §2.5):
//   * persistent: grid = min(number of SMs, number of units) CTAs, one per SM (224 KB of shared
//     memory each); a WORK UNIT is one (128-query tile qt, head h, batch b) and costs qt + 1 K/V
//     tiles. Each CTA loops over units until the list is exhausted.
//   * persistent, order (the list the units are handed out in): the B*H heads bh = b*H + h are
//     cut into SECTIONS of G consecutive heads; sections run one after another, and inside a
//     section the units go heaviest first, query tile outer (qt = n_q-1 .. 0), head inner. If G
//     does not divide B*H the SMALLER section is the first one, so the list always ends with a
//     full section of light units. G = ceil(2 * num_SMs / (n_q + 1)) (8 for the task): a section
//     then holds about twice the work of one 132-SM wave of its heaviest units, so the end of
//     the list is longest-first over enough units to even out the tail, while few heads are in
//     flight (8 on average, 16 at most: 2 MB of K/V each at S = 4096, against the 50 MB L2), so
//     each head's K/V is re-read from L2 by its 32 query tiles. The schedule model in the desk
//     check (list scheduling of the 2048 units over 132 SMs, per-unit overhead 0.3-1 tile) puts
//     this order at 1.0006-1.0018x the perfect split, against 1.068x for the order the
//     non-persistent kernel gets from the block scheduler (head-major, heaviest tile of each
//     head first: the last heads' heavy tiles start too late), 1.031x (snake) and 1.12x (plain)
//     for static striding over the head-major list, and 1.0006-1.0018x (static snake) or
//     1.0044-1.0055x (dynamic) for a global longest-first list, which keeps all 64 heads
//     (128 MB of K/V) in flight, so the K/V re-reads would come from HBM.
//   * persistent, dispatch: DYNAMIC, because no static split was both balanced and L2-friendly
//     in the model (see above). Unit blockIdx.x is each CTA's first unit; later units come from
//     a global ticket counter: unit = gridDim.x + atomicAdd(counter, 1), taken by the producer's
//     elected thread. A CTA stops at its first ticket >= n_units, so a launch takes exactly
//     n_units atomic tickets (values 0 .. n_units-1: n_units - grid real units plus one final
//     ticket per CTA; with grid > n_units, one final ticket per CTA that had a first unit), and
//     the thread that draws ticket value n_units - 1 draws the launch's LAST one: every other CTA
//     has already drawn its final ticket, so it resets the counter to 0 for the next launch (no
//     memset in the call: the timed span would include it). The counter is zeroed once, when it
//     is allocated. One call at a time on one stream is assumed (as in gqa_decode.cu).
//   * persistent, claim point: the producer claims unit k+1 right after it issued unit k's last
//     K/V load, about kStages tiles before the consumers finish unit k, so the atomic's latency
//     is hidden and the claim is still late enough to follow the real finishing order.
//   * persistent, hand-over: one Q buffer and one unit slot (an int in shared memory). The
//     producer waits q_empty (8 consumer-warp arrivals, each after that warp's LAST S = Q K^T
//     wgmma of the unit retired), writes the unit index into the slot, then arrives on q_full with
//     the Q tile's TMA bytes. The consumers wait q_full, read the slot and decode the unit. So the
//     next unit's Q load and its first K/V loads overlap the current unit's last softmax, P V and
//     epilogue. The end is a slot value -1 with a plain arrive on q_full (no bytes).
//   * persistent, phases: the K and V rings' (stage, parity), and q_full/q_empty's parity (unit
//     counter & 1), continue across units; they are never reset. Every unit advances each ring
//     n_kv times on both sides.
//   * causal, tile skipping: unit (qt, h, b) needs K/V tiles 0..qt only; producer and consumers
//     both derive n_kv = qt + 1 from the same unit index.
//   * causal, order: K/V tiles are processed DOWNWARDS, j = qt, qt-1, .., 0 (FA3's order); only
//     the diagonal tile j = qt needs the mask, applied once, in the prologue, and the steady-state
//     loop is the verified non-causal loop. No row is ever fully masked (key 128qt is kept).
//   * 384 threads = 3 warpgroups. WG0 is the producer (setmaxnreg.dec 40): one elected thread
//     claims units, loads Q and streams K_j and V_j (128 keys each) through two separate 3-stage
//     rings of full/empty mbarriers, with TMA. WG1 and WG2 are consumers (setmaxnreg.inc 232),
//     each owning 64 query rows (wgmma M = 64).
//   * Tensor maps are 3-D {D=128, H, B*S} with strides {256 B, H*256 B}; box {64, 1, 128} gives a
//     [128 tokens][64 d] tile, 128B-swizzled. Each 128-wide operand tile is two such boxes.
//   * S = Q K^T: wgmma m64n128k16 SS, both operands K-major; O += P V: m64n128k16 RS, P packed to
//     bf16 straight from the S accumulator, V the MN-major B operand (contracts §2, §3).
//   * Intra-warpgroup overlap (FA3 Algorithm 2): P V_{j-1} runs while the softmax of block j is
//     computed; O is rescaled right after issuing the S_j GEMM.
//   * Inter-warpgroup ping-pong, persistent: named barriers 1/2 make the two consumers take turns
//     issuing their GEMMs. The turns now run CONTINUOUSLY across units: consumer 1 primes bar 1
//     once per CTA, every hand-over arrive is made (none skipped: the last one of a unit opens
//     consumer 0's first turn of the next unit), and consumer 0 makes one extra sync on bar 1
//     when it reads the end of the list, for consumer 1's last hand-over. So consumer 0 can start
//     the next unit's first S GEMM as soon as Q is there, without waiting for consumer 1's
//     epilogue (the per-unit priming of gqa_prefill.cu would make it wait). Counts per CTA: bar 1
//     gets consumer 1's 1 + sum(n_kv) arrives and consumer 0's sum(n_kv) + 1 syncs; bar 2
//     consumer 0's sum(n_kv) arrives and consumer 1's sum(n_kv) syncs.
//   * Empty barriers (and q_empty) count one arrival per consumer warp (8), each after that
//     warp's own wgmma.wait_group retired the group that read the stage.
//   * Epilogue: quad-reduce the row sums, O /= l, store bf16 O directly from registers,
//     LSE = (m + log2 l) * ln2 from the lane owning column 0 of the row.
// Shared memory: Q 32 KB + 3 stages x (K 32 KB + V 32 KB) = 224 KB, + 14 mbarriers (112 B) + the
// unit slot (16 B) + 1 KB alignment slack = 230528 B of the 232448 B allowed. The ring depth
// stays 3 (two K/V tiles in flight ahead of the consumers); a second Q buffer, which would let
// the next Q load before the last S GEMM of a unit, does not fit beside it.
//
// What the first GPU run should look at: correctness over the whole workload (every unit path,
// n_kv = 1 .. 32, runs in one launch), the time against 0.4778 ms, and repeated calls (the
// counter's self-reset: a wrong reset shows as unwritten tiles from the second call on).

#include "ptxgym_h100.cuh"

#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cstdint>
#include <cmath>

namespace {

constexpr int kD = 128;         // head dimension (fixed)
constexpr int kBM = 128;        // query rows per unit: 2 consumer warpgroups x 64
constexpr int kBN = 128;        // keys per K/V tile
constexpr int kStages = 3;      // depth of each of the K and V rings (3 x 64 KB still fits)
constexpr int kThreads = 384;   // producer WG + 2 consumer WGs

// causal: the mask logic assumes the diagonal crosses exactly one K/V tile per query tile, the
// tile with the same index (query tile qt and key tile qt cover the same 128 token positions).
static_assert(kBM == kBN, "causal tiling assumes square 128 x 128 diagonal tiles");

// One TMA box: [128 rows][64 bf16] = 16 KB, 128B-swizzled. A 128-wide tile is two boxes.
constexpr uint32_t kBoxBytes = 128u * 64u * 2u;
constexpr uint32_t kTileBytes = 2u * kBoxBytes;  // 32 KB: Q tile, one K stage or one V stage

// Byte offsets from the 1024-aligned base. Every tile starts on a 1024-B boundary so the swizzle
// phase of TMA and wgmma agree (descriptor base_offset = 0).
constexpr uint32_t kOffQ = 0;
constexpr uint32_t kOffK = kOffQ + kTileBytes;
constexpr uint32_t kOffV = kOffK + kStages * kTileBytes;
constexpr uint32_t kOffBar = kOffV + kStages * kTileBytes;
// q_full, q_empty, k_full[], k_empty[], v_full[], v_empty[]
constexpr uint32_t kNumBars = 2 + 4 * kStages;
constexpr uint32_t kOffSlot = kOffBar + 8 * kNumBars;  // persistent: the unit slot (one int)
constexpr uint32_t kSmemBytes = kOffSlot + 16 + 1024;  // +1 KB to round the base up
static_assert(kSmemBytes <= 232448, "dynamic shared memory over the 227 KB limit");

// Empty barriers (and q_empty): one arrival per consumer warp (2 warpgroups x 4 warps). Each warp
// arrives after its own wgmma.wait_group retired the group that read the stage (a warp's HGMMA
// reads the whole B tile, so per-warp completion is the safe granularity).
constexpr uint32_t kEmptyArrivals = 8;

// Named barrier ids for the ping-pong: kTurnBar + g is "consumer g may issue its GEMMs".
constexpr uint32_t kTurnBar = 1;

// persistent: section size G = ceil(kSectionWaves * num_SMs / (n_q + 1)) heads (see the header).
constexpr int kSectionWaves = 2;

constexpr float kLn2 = 0.69314718055994531f;

__device__ __forceinline__ void fence_frag(uint32_t (&p)[8][4]) {
#pragma unroll
  for (int s = 0; s < 8; ++s) ptx::fence_regs(p[s]);
}

__device__ __forceinline__ float quad_max(float x) {
  // The 4 threads of a quad (lanes 4k..4k+3) share an accumulator row; xor 1, 2 stay inside it.
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
  return x;
}

__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  x += __shfl_xor_sync(0xffffffffu, x, 2);
  return x;
}

// persistent: the work list. Unit u (0 <= u < B*H*n_q) -> query tile qt and head bh = b*H + h.
// The first section holds r = B*H % G heads (none if G divides B*H), every later one G heads;
// inside a section, units go query tile descending (outer), head ascending (inner). Producer
// and consumers both call this with the same u, so they agree on qt (hence n_kv), h and b.
struct Unit {
  int qt;
  int bh;
};
__device__ __forceinline__ Unit decode_unit(int u, int n_q, int sec_heads, int first_heads) {
  const int first_units = first_heads * n_q;
  int idx, nh, bh0;
  if (u < first_units) {
    idx = u;
    nh = first_heads;
    bh0 = 0;
  } else {
    const int v = u - first_units;
    const int sec = v / (sec_heads * n_q);
    idx = v - sec * sec_heads * n_q;
    nh = sec_heads;
    bh0 = first_heads + sec * sec_heads;
  }
  Unit w;
  w.qt = n_q - 1 - idx / nh;
  w.bh = bh0 + idx % nh;
  return w;
}

// S = Q_g K^T over D = 128: 8 k-steps of m64n128k16, both operands K-major 128B-swizzled.
// dq: descriptor of this warpgroup's 64 Q rows in box 0; dk: descriptor of K stage box 0.
// k-step kk lives in box kk/4 (the next 64 d are one whole box further, not +128 B) at +32 B per
// 16 d inside the 128-B swizzled row. scale_d = 0 on the first k-step overwrites the old S/P.
__device__ __forceinline__ void issue_qk(float (&s_acc)[64], uint64_t dq, uint64_t dk) {
#pragma unroll
  for (int kk = 0; kk < 8; ++kk) {
    const uint32_t off = static_cast<uint32_t>(kk / 4) * kBoxBytes + static_cast<uint32_t>(kk % 4) * 32u;
    ptx::wgmma_ss<128, 0, 0>(s_acc, ptx::desc_advance(dq, off), ptx::desc_advance(dk, off),
                             kk > 0 ? 1 : 0);
  }
}

// O += P V over the 128 keys of one tile: 8 k-steps of m64n128k16 RS. P's k-step s = S columns
// 16s..16s+15 = keys 16s..16s+15 = V rows 16s..16s+15, i.e. +16 rows * 128 B = +2048 B into both
// d-boxes (the second box is reached by the descriptor's LBO).
__device__ __forceinline__ void issue_pv(float (&o_acc)[64], const uint32_t (&pf)[8][4],
                                         uint64_t dv) {
#pragma unroll
  for (int s = 0; s < 8; ++s) {
    ptx::wgmma_rs<128, 1>(o_acc, pf[s], ptx::desc_advance(dv, 2048u * static_cast<uint32_t>(s)), 1);
  }
}

// causal: mask the diagonal tile. Thread (r0, q) of consumer g holds, in register 4jj+e
// (e = 0, 1), the score of tile row 64g + r0 and tile column 8jj + 2q + e, and in register
// 4jj+2+e that of row 64g + r0 + 8 (contracts §2). Query tile qt and key tile qt start at the
// same token, so the global offsets cancel and "key > query" is "column > row" inside the tile:
//   8jj + 2q + e > row  <=>  8jj + e > row - 2q = lim.
// jj and e are compile-time constants after unrolling: 64 compare+select pairs, once per unit.
__device__ __forceinline__ void mask_diagonal(float (&s_acc)[64], int row0, int q) {
  const float kNegInf = -INFINITY;
  const int lim0 = row0 - 2 * q;  // row r0 (+ 64g)
  const int lim1 = lim0 + 8;      // row r0 + 8 (+ 64g)
#pragma unroll
  for (int jj = 0; jj < 16; ++jj) {
    if (8 * jj + 0 > lim0) s_acc[4 * jj + 0] = kNegInf;
    if (8 * jj + 1 > lim0) s_acc[4 * jj + 1] = kNegInf;
    if (8 * jj + 0 > lim1) s_acc[4 * jj + 2] = kNegInf;
    if (8 * jj + 1 > lim1) s_acc[4 * jj + 3] = kNegInf;
  }
}

__global__ void __launch_bounds__(kThreads, 1)
    mha_fwd_causal_d128_persistent_kernel(const __grid_constant__ CUtensorMap tmQ,
                                          const __grid_constant__ CUtensorMap tmK,
                                          const __grid_constant__ CUtensorMap tmV,
                                          __nv_bfloat16* __restrict__ O, float* __restrict__ LSE,
                                          int* __restrict__ counter, int S, int H, int n_units,
                                          int sec_heads, int first_heads, float scale_log2) {
  extern __shared__ uint8_t smem_raw[];
  // The dynamic smem base is not guaranteed 1024-aligned: round it up (1 KB extra requested).
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
  // persistent: the unit the Q buffer holds (or -1: end of the list). Written by the producer
  // before its q_full arrive (release), read by the consumers after their q_full wait (acquire),
  // rewritten only after q_empty, i.e. after every consumer warp has read it.
  volatile int* unit_slot = reinterpret_cast<volatile int*>(sm + kOffSlot);

  const int n_q = S / kBM;  // query tiles per head = K/V tiles per head

  // ---- 0. barriers ----
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
  __syncthreads();  // barriers initialised before anyone arrives, waits or is targeted by TMA

  const uint32_t wg = ptx::warpgroup_idx();
  if (wg == 0) {
    // ------------------------------------------------------------------ 1. producer warpgroup
    ptx::setmaxnreg_dec<40>();
    if (ptx::warp_idx() == 0 && ptx::elect_one_sync()) {
      int kst = 0, vst = 0;
      uint32_t kph = 0, vph = 0;
      // 1a. persistent: the first unit is blockIdx.x (no atomic); later ones are tickets.
      int unit = static_cast<int>(blockIdx.x);
#pragma unroll 1
      for (uint32_t it = 0;; ++it) {
        // 1b. Q buffer and unit slot free: every consumer warp's last S GEMM of the previous
        // unit retired (and the slot was read before that). Fresh barrier at it = 0: parity 1
        // passes at once.
        ptx::mbar_wait(q_empty, (it & 1u) ^ 1u);
        if (unit >= n_units) {
          // End of the list: slot -1, q_full's phase completes on this arrival alone (no tx).
          *unit_slot = -1;
          ptx::mbar_arrive(q_full);
          break;
        }
        *unit_slot = unit;
        const Unit w = decode_unit(unit, n_q, sec_heads, first_heads);
        const int h = w.bh % H;
        const int b = w.bh / H;
        const int q_tile = w.qt;
        const int n_kv = q_tile + 1;  // causal: K/V tiles 0..qt
        // 1c. Q of this unit (token coordinate in the flattened [B*S] dimension of the maps).
        const int q_tok = b * S + q_tile * kBM;
        const int kv_tok0 = b * S;
        ptx::mbar_arrive_expect_tx(q_full, kTileBytes);
        ptx::tma_load_3d(sQ, &tmQ, q_full, 0, h, q_tok);               // d 0..63
        ptx::tma_load_3d(sQ + kBoxBytes, &tmQ, q_full, 64, h, q_tok);  // d 64..127
        // 1d. causal: n_kv loads, diagonal tile first, downwards; the ring continues from the
        // previous unit (its stages free up as the consumers finish that unit).
        for (int i = 0; i < n_kv; ++i) {
          const int tok = kv_tok0 + (q_tile - i) * kBN;
          ptx::mbar_wait(&k_empty[kst], kph ^ 1u);
          ptx::mbar_arrive_expect_tx(&k_full[kst], kTileBytes);
          uint8_t* dk = sK + kst * kTileBytes;
          ptx::tma_load_3d(dk, &tmK, &k_full[kst], 0, h, tok);
          ptx::tma_load_3d(dk + kBoxBytes, &tmK, &k_full[kst], 64, h, tok);
          if (++kst == kStages) { kst = 0; kph ^= 1u; }
          ptx::mbar_wait(&v_empty[vst], vph ^ 1u);
          ptx::mbar_arrive_expect_tx(&v_full[vst], kTileBytes);
          uint8_t* dv = sV + vst * kTileBytes;
          ptx::tma_load_3d(dv, &tmV, &v_full[vst], 0, h, tok);
          ptx::tma_load_3d(dv + kBoxBytes, &tmV, &v_full[vst], 64, h, tok);
          if (++vst == kStages) { vst = 0; vph ^= 1u; }
        }
        // 1e. persistent: claim the next unit now, about kStages tiles before the consumers
        // finish this one (the atomic's latency hides behind them). The draw of ticket value
        // n_units - 1 is the launch's last draw: reset the counter for the next launch.
        const int ticket = atomicAdd(counter, 1);
        if (ticket == n_units - 1) atomicExch(counter, 0);
        unit = static_cast<int>(gridDim.x) + ticket;
      }
    }
    // The other producer threads have nothing to do; no CTA-wide barrier follows.
    return;
  }

  // -------------------------------------------------------------------- 2. consumer warpgroups
  ptx::setmaxnreg_inc<232>();
  const uint32_t g = wg - 1;                  // 0 or 1: query rows 64g .. 64g+63 of the tile
  const uint32_t t = threadIdx.x % 128u;      // thread in the warpgroup
  const uint32_t warp = t / 32u;
  const uint32_t lane = t % 32u;
  const bool warp_leader = (lane == 0);
  const float c = scale_log2;                 // scale * log2(e)
  const uint32_t r0 = 16u * warp + lane / 4u;  // accumulator rows r0 and r0 + 8 (contracts §2)
  const uint32_t q = lane % 4u;                // accumulator columns 8j + 2q, 8j + 2q + 1

  // This warpgroup's A descriptor: its 64 Q rows start 64 * 128 B = 8 KB into each Q box.
  const uint64_t dq = ptx::make_desc_kmajor_sw128(sQ + g * 8192u);

  float s_acc[64];      // S block (fp32), overwritten in place by P (fp32)
  float o_acc[64];      // O accumulator, unnormalised
  uint32_t pf[8][4];    // P as bf16 RS A-fragments, one [4] per k-step of 16 keys
  float m0, m1;         // running max (log2 units, scaled) of rows r0 and r0 + 8
  float l0, l1;         // per-thread partial row sums
  float sc0, sc1;       // pending O rescale factors (applied before the next P V)

  int kst = 0, vst = 0;
  uint32_t kph = 0, vph = 0;

  // Ping-pong priming, persistent: ONCE per CTA, consumer 0 issues first. From then on the
  // turns alternate across unit boundaries (see the header); consumer 0 takes the last turn
  // consumer 1 hands over when it reads the end of the list (2f).
  if (g == 1) ptx::named_bar_arrive(kTurnBar + 0, 256);

#pragma unroll 1
  for (uint32_t it = 0;; ++it) {
    // ---- 2a. persistent: next unit (Q and its index arrive together on q_full) ----
    ptx::mbar_wait(q_full, it & 1u);
    const int unit = *unit_slot;
    if (unit < 0) {
      // 2f. End: consumer 1's last hand-over (or its priming, for a CTA with no unit) is still
      // pending on bar 1; consumer 0 takes it so no named-barrier generation is left open.
      if (g == 0) ptx::named_bar_sync(kTurnBar + 0, 256);
      break;
    }
    const Unit w = decode_unit(unit, n_q, sec_heads, first_heads);
    const int q_tile = w.qt;
    const int n_kv = q_tile + 1;  // >= 1; the K/V tile of block j is q_tile - j

#pragma unroll
    for (int i = 0; i < 64; ++i) o_acc[i] = 0.f;
    sc0 = 1.f;
    sc1 = 1.f;

    // ---- 2b. prologue: S = Q K_qt^T (the diagonal tile) and its softmax ----
    ptx::mbar_wait(&k_full[kst], kph);
    ptx::named_bar_sync(kTurnBar + g, 256);
    ptx::fence_regs(s_acc);
    ptx::wgmma_fence();
    issue_qk(s_acc, dq, ptx::make_desc_kmajor_sw128(sK + kst * kTileBytes));
    ptx::wgmma_commit();
    // persistent: the hand-over is never skipped (the last one of a unit opens the other
    // consumer's first turn of the next unit, or consumer 0's final sync in 2f).
    ptx::named_bar_arrive(kTurnBar + (1 - g), 256);
    ptx::wgmma_wait<0>();
    ptx::fence_regs(s_acc);
    if (warp_leader) {
      ptx::mbar_arrive(&k_empty[kst]);
      if (n_kv == 1) ptx::mbar_arrive(q_empty);  // persistent: this unit's last Q K^T retired
    }
    if (++kst == kStages) { kst = 0; kph ^= 1u; }
    // causal mask: the first processed tile is always the diagonal one. Column 0 of the tile (key
    // 128 qt) is kept in every row, and quad lane q = 0 holds it, so quad_max below is finite even
    // for a thread whose own values of a row are all masked; ex2(-inf * c - m) = +0 then.
    mask_diagonal(s_acc, static_cast<int>(64u * g + r0), static_cast<int>(q));
    {
      float mx0 = fmaxf(s_acc[0], s_acc[1]);
      float mx1 = fmaxf(s_acc[2], s_acc[3]);
#pragma unroll
      for (int j = 1; j < 16; ++j) {
        mx0 = fmaxf(mx0, fmaxf(s_acc[4 * j + 0], s_acc[4 * j + 1]));
        mx1 = fmaxf(mx1, fmaxf(s_acc[4 * j + 2], s_acc[4 * j + 3]));
      }
      // c > 0, so max(s) * c == max(s * c).
      m0 = quad_max(mx0) * c;
      m1 = quad_max(mx1) * c;
      float a0 = 0.f, b0 = 0.f, a1 = 0.f, b1 = 0.f;
#pragma unroll
      for (int j = 0; j < 16; ++j) {
        s_acc[4 * j + 0] = ptx::ex2_approx(fmaf(s_acc[4 * j + 0], c, -m0));
        s_acc[4 * j + 1] = ptx::ex2_approx(fmaf(s_acc[4 * j + 1], c, -m0));
        s_acc[4 * j + 2] = ptx::ex2_approx(fmaf(s_acc[4 * j + 2], c, -m1));
        s_acc[4 * j + 3] = ptx::ex2_approx(fmaf(s_acc[4 * j + 3], c, -m1));
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
      pf[s][0] = ptx::pack_bf16x2(s_acc[8 * s + 0], s_acc[8 * s + 1]);  // row r0,   k 2q, 2q+1
      pf[s][1] = ptx::pack_bf16x2(s_acc[8 * s + 2], s_acc[8 * s + 3]);  // row r0+8, k 2q, 2q+1
      pf[s][2] = ptx::pack_bf16x2(s_acc[8 * s + 4], s_acc[8 * s + 5]);  // row r0,   k 2q+8, 2q+9
      pf[s][3] = ptx::pack_bf16x2(s_acc[8 * s + 6], s_acc[8 * s + 7]);  // row r0+8, k 2q+8, 2q+9
    }

    // ---- 2c. steady state: block j's S GEMM and block j-1's P V GEMM in flight together ----
    // Block j is K/V tile q_tile - j, strictly below the diagonal for j >= 1, so no mask here.
#pragma unroll 1
    for (int j = 1; j < n_kv; ++j) {
      ptx::mbar_wait(&k_full[kst], kph);
      ptx::named_bar_sync(kTurnBar + g, 256);
      ptx::fence_regs(s_acc);
      ptx::wgmma_fence();
      issue_qk(s_acc, dq, ptx::make_desc_kmajor_sw128(sK + kst * kTileBytes));
      ptx::wgmma_commit();                                   // group G_S(j)
      // O holds sum_{t<j-1} with max m_{j-2}; bring it to m_{j-1} before adding P_{j-1} V_{j-1}.
      // No wgmma in flight touches O here (G_PV(j-2) retired at the end of the last iteration).
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
      ptx::wgmma_fence();  // O and P were written by ordinary instructions since the last wgmma
      issue_pv(o_acc, pf, ptx::make_desc_mnmajor_sw128(sV + vst * kTileBytes, kBoxBytes));
      ptx::wgmma_commit();                                   // group G_PV(j-1)
      ptx::named_bar_arrive(kTurnBar + (1 - g), 256);        // persistent: never skipped

      ptx::wgmma_wait<1>();  // the older group G_S(j) is done; G_PV(j-1) may still run
      ptx::fence_regs(s_acc);
      if (warp_leader) {
        ptx::mbar_arrive(&k_empty[kst]);
        if (j == n_kv - 1) ptx::mbar_arrive(q_empty);  // persistent: last Q K^T of the unit
      }
      if (++kst == kStages) { kst = 0; kph ^= 1u; }

      // Online softmax of block j (overlaps the running P V wgmma; touches only S, m, l, sc).
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
        sc0 = ptx::ex2_approx(m0 - mn0);  // factor for the old O and l (recorded before m moves)
        sc1 = ptx::ex2_approx(m1 - mn1);
        m0 = mn0;
        m1 = mn1;
        float a0 = 0.f, b0 = 0.f, a1 = 0.f, b1 = 0.f;
#pragma unroll
        for (int jj = 0; jj < 16; ++jj) {
          s_acc[4 * jj + 0] = ptx::ex2_approx(fmaf(s_acc[4 * jj + 0], c, -mn0));
          s_acc[4 * jj + 1] = ptx::ex2_approx(fmaf(s_acc[4 * jj + 1], c, -mn0));
          s_acc[4 * jj + 2] = ptx::ex2_approx(fmaf(s_acc[4 * jj + 2], c, -mn1));
          s_acc[4 * jj + 3] = ptx::ex2_approx(fmaf(s_acc[4 * jj + 3], c, -mn1));
          a0 += s_acc[4 * jj + 0];
          b0 += s_acc[4 * jj + 1];
          a1 += s_acc[4 * jj + 2];
          b1 += s_acc[4 * jj + 3];
        }
        l0 = fmaf(l0, sc0, a0 + b0);
        l1 = fmaf(l1, sc1, a1 + b1);
      }

      // As in the shipped kernel: the K_{j+1} wait keeps ptxas (nvcc 13.0) from hoisting the
      // DEPBAR of the wait below above the softmax's MUFU.EX2, which would serialise the softmax
      // behind the running P V wgmma. Re-waiting a completed phase is safe: this stage cannot
      // complete another phase before we release it.
      if (j + 1 < n_kv) ptx::mbar_wait(&k_full[kst], kph);
      ptx::wgmma_wait<0>();  // G_PV(j-1) done: O may be touched, P fragments may be rewritten
      ptx::fence_regs(o_acc);
      fence_frag(pf);        // keeps the old fragments live (unclobbered) until the wait
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

    // ---- 2d. tail: P_{n-1} V_{n-1} (K/V tile 0) ----
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

    // ---- 2e. epilogue ----
    l0 = quad_sum(l0);
    l1 = quad_sum(l1);
    // l >= 1: the row maximum (an unmasked score, see 2b) contributes ex2(0) = 1. Masked scores
    // contributed exact zeros, so l and LSE sum over keys j <= i only, as the causal LSE requires.
    const float inv0 = 1.f / l0;
    const float inv1 = 1.f / l1;
    const int h = w.bh % H;
    const int b = w.bh / H;
    const int row0 = q_tile * kBM + static_cast<int>(g * 64u + r0);  // token index in the batch
    const int row1 = row0 + 8;
    const size_t tok_stride = static_cast<size_t>(H) * kD;
    __nv_bfloat16* o0 = O + (static_cast<size_t>(b) * S + row0) * tok_stride + static_cast<size_t>(h) * kD;
    __nv_bfloat16* o1 = o0 + 8 * tok_stride;
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      const int col = 8 * j + 2 * static_cast<int>(q);
      *reinterpret_cast<uint32_t*>(o0 + col) =
          ptx::pack_bf16x2(o_acc[4 * j + 0] * inv0, o_acc[4 * j + 1] * inv0);
      *reinterpret_cast<uint32_t*>(o1 + col) =
          ptx::pack_bf16x2(o_acc[4 * j + 2] * inv1, o_acc[4 * j + 3] * inv1);
    }
    if (q == 0) {
      float* lse = LSE + (static_cast<size_t>(b) * H + h) * S;
      lse[row0] = (m0 + log2f(l0)) * kLn2;  // m is max(s) * scale * log2(e): back to natural log
      lse[row1] = (m1 + log2f(l1)) * kLn2;
    }
  }
}

// 3-D tensor map over a [B, S, H, 128] bf16 tensor: dims {128, H, B*S}, strides {256 B, H*256 B},
// box {64, 1, 128}, 128B swizzle.
CUresult make_qkv_map(CUtensorMap* map, const __nv_bfloat16* p, int B, int S, int H) {
  return ptx::make_tmap_3d(map, p, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, kD,
                           static_cast<uint64_t>(H), static_cast<uint64_t>(B) * S,
                           static_cast<uint64_t>(kD) * 2, static_cast<uint64_t>(H) * kD * 2, 64,
                           1, kBN, CU_TENSOR_MAP_SWIZZLE_128B);
}

}  // namespace

extern "C" int mha_fwd(const __nv_bfloat16* Q, const __nv_bfloat16* K, const __nv_bfloat16* V,
                       __nv_bfloat16* O, float* LSE, int B, int S, int H, int D,
                       cudaStream_t stream) {
  if (D != kD || B < 0 || S < 0 || H < 0) return static_cast<int>(cudaErrorInvalidValue);
  if (B == 0 || S == 0 || H == 0) return static_cast<int>(cudaSuccess);
  // Tiles of 128 queries / 128 keys must not straddle batches in the flattened B*S map, and the
  // causal tiling needs query tile t and key tile t to cover the same tokens.
  if (S % kBM != 0 || S % kBN != 0) return static_cast<int>(cudaErrorInvalidValue);
  if ((reinterpret_cast<uintptr_t>(O) % 4) != 0) return static_cast<int>(cudaErrorInvalidValue);

  // ---- 3. host state kept across calls: SM count, smem opt-in, the ticket counter ----
  static int num_sms = 0;
  static bool smem_set = false;
  static int* counter = nullptr;
  cudaError_t err;
  if (num_sms == 0) {
    int dev = 0;
    if ((err = cudaGetDevice(&dev)) != cudaSuccess) return static_cast<int>(err);
    if ((err = cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, dev)) !=
        cudaSuccess)
      return static_cast<int>(err);
    if (num_sms <= 0) return static_cast<int>(cudaErrorInvalidValue);
  }
  if (!smem_set) {
    if ((err = ptx::set_max_dynamic_smem(mha_fwd_causal_d128_persistent_kernel,
                                         static_cast<int>(kSmemBytes))) != cudaSuccess)
      return static_cast<int>(err);
    smem_set = true;
  }
  if (counter == nullptr) {
    // Zeroed once, stream-ordered before the first launch; every launch leaves it at 0 again
    // (the last ticket's drawer resets it, see 1e).
    if ((err = cudaMalloc(&counter, sizeof(int))) != cudaSuccess) return static_cast<int>(err);
    if ((err = cudaMemsetAsync(counter, 0, sizeof(int), stream)) != cudaSuccess) {
      cudaFree(counter);
      counter = nullptr;
      return static_cast<int>(err);
    }
  }

  // ---- 4. work list: units, grid, sections ----
  const int n_q = S / kBM;
  const long long heads = static_cast<long long>(B) * H;
  const long long units_ll = heads * n_q;
  // Tickets reach gridDim.x + n_units - 1 and heads index ints: all must stay below 2^31.
  if (units_ll + num_sms >= 0x7fffffffLL) return static_cast<int>(cudaErrorInvalidValue);
  const int n_units = static_cast<int>(units_ll);
  const int grid = n_units < num_sms ? n_units : num_sms;
  // Section size G = ceil(kSectionWaves * SMs / (n_q + 1)), at most B*H; the remainder section
  // (B*H % G heads) goes first so that the list ends with a full section.
  long long sec = (static_cast<long long>(kSectionWaves) * num_sms + n_q) / (n_q + 1);
  if (sec < 1) sec = 1;
  if (sec > heads) sec = heads;
  const int sec_heads = static_cast<int>(sec);
  const int first_heads = static_cast<int>(heads % sec);

  CUtensorMap tmQ, tmK, tmV;
  if (make_qkv_map(&tmQ, Q, B, S, H) != CUDA_SUCCESS ||
      make_qkv_map(&tmK, K, B, S, H) != CUDA_SUCCESS ||
      make_qkv_map(&tmV, V, B, S, H) != CUDA_SUCCESS) {
    return static_cast<int>(cudaErrorInvalidValue);
  }

  const float scale_log2 =
      static_cast<float>(1.4426950408889634 / std::sqrt(static_cast<double>(kD)));
  mha_fwd_causal_d128_persistent_kernel<<<grid, kThreads, kSmemBytes, stream>>>(
      tmQ, tmK, tmV, O, LSE, counter, S, H, n_units, sec_heads, first_heads, scale_log2);
  return static_cast<int>(cudaGetLastError());
}
