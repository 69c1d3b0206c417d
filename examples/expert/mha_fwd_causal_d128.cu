// Expert CAUSAL attention forward, head_dim 128, FlashAttention-3 style, for Hopper (sm_90a).
//
// H200, 2026-12-02, `ptxgym eval` with default settings (docs/benchmarks.md, eighteenth session):
// PASSED, qualified (HGMMA 4,325,376 warps, FLOP coverage 1.03), memcheck clean, 0.4778 ms against
// cuDNN 0.4754 ms: 0.995x. It is derived from examples/expert/mha_fwd_d128.cu; everything not
// marked "causal" below is that kernel's code, unchanged.
//
//   Q, K, V, O: [B, S, H, 128] bf16 (D contiguous, heads interleaved: one head's consecutive
//   tokens are H*128 elements apart);  LSE: [B, H, S] fp32, natural log of sum_{j<=i} exp(scale*
//   q_i.k_j), scale = 1/sqrt(128), causal: query i attends keys j <= i (S_q = S_k, so the
//   diagonal is the main diagonal). S must be a multiple of 128 (cudaErrorInvalidValue otherwise).
//
// Design (packs/h100/scheduling.md §2, causal §2.5):
//   * One CTA per (128-query tile, head, batch); grid (S/128, H, B), query tile fastest so the
//     CTAs of one head run together and re-read that head's K/V from L2.
//   * causal, load balance: blockIdx.x = 0 takes the LAST query tile (the heaviest one, with
//     S/128 K/V tiles) and blockIdx.x = S/128-1 the first (1 K/V tile). See "Load balance" at the
//     kernel's first lines for why, and why the query tile stays the fastest grid dimension.
//   * causal, tile skipping: query tile qt (rows 128qt .. 128qt+127) needs K/V tiles 0..qt only
//     (tile j > qt starts at key 128j > 128qt+127, every row of it is masked). The producer loads
//     exactly n_kv = qt + 1 tiles and the consumers run exactly n_kv iterations; both compute
//     n_kv from the same q_tile before the warpgroups split.
//   * causal, order: K/V tiles are processed DOWNWARDS, j = qt, qt-1, .., 0 (FA3's order). With
//     128-row query tiles aligned to 128-key tiles the only tile that crosses the diagonal is
//     j = qt, so the mask is applied once, in the prologue, and the steady-state loop is exactly
//     the verified non-causal loop (no mask, no branch). No row is ever fully masked: the
//     diagonal tile holds key 128qt <= every query row of the tile, so every row keeps at least
//     one finite score and its running max is finite from the first block on (no -inf - -inf).
//   * 384 threads = 3 warpgroups. WG0 is the producer (setmaxnreg.dec 40): one elected thread loads
//     Q once and streams K_j and V_j (128 keys each) through two separate 3-stage rings of
//     full/empty mbarriers, with TMA. WG1 and WG2 are consumers (setmaxnreg.inc 232), each owning
//     64 query rows (wgmma M = 64).
//   * Tensor maps are 3-D {D=128, H, B*S} with strides {256 B, H*256 B}; box {64, 1, 128} gives a
//     [128 tokens][64 d] tile, 128B-swizzled, i.e. one K-major swizzle-atom column. Each 128-wide
//     operand tile is two such boxes placed one after the other (16 KB apart). Since S % 128 == 0
//     a tile never straddles two batches, so the flattened B*S dimension is safe.
//   * S = Q K^T: wgmma m64n128k16 SS, both operands K-major (trans 0/0), 8 k-steps over D: k-step
//     kk uses box kk/4 at +32 B * (kk%4) (contracts §3).
//   * Online softmax on the fp32 accumulator in registers, base 2 with scale*log2(e) folded into
//     one FFMA; row max quad-reduced each block, row sum kept as per-thread partials until the end.
//   * O += P V: wgmma m64n128k16 RS, P packed to bf16 straight from the S accumulator (k-step s
//     takes S registers 8s..8s+7, contracts §2), V is the MN-major B operand (trans-b = 1,
//     LBO = one box = 16 KB between the two 64-wide d blocks, SBO = 1024, k-step = +2048 B).
//   * Intra-warpgroup overlap (FA3 Algorithm 2): the P V_{j-1} wgmma runs while the softmax of
//     block j is computed; O is rescaled by the previous block's factor right after issuing the
//     S_j GEMM (the O registers are idle then), before the P V_{j-1} GEMM.
//   * Inter-warpgroup ping-pong (FA3 scheduler barrier): named barriers 1/2 make the two
//     consumers take turns issuing their GEMMs, so one warpgroup's softmax runs while the other's
//     GEMMs occupy the tensor cores. The hand-over count stays balanced for every n_kv >= 1
//     (causal makes n_kv = 1 real: the CTA of query tile 0); see the comments at the arrives.
//     The softmax stays ahead of that wgmma's wait only because a K_{j+1} mbarrier wait sits
//     between them (see the comment at the wgmma_wait<0> in the loop).
//   * Empty barriers count one arrival per consumer warp (8), each after that warp's own
//     wgmma.wait_group retired the group that read the stage.
//   * Barrier phases: every CTA initialises its own mbarriers and runs once (not persistent), so
//     a ring's (stage, parity) starts at (0, 0) in every CTA and producer and consumers advance it
//     n_kv times each; a per-CTA n_kv therefore needs no cross-CTA phase bookkeeping.
//   * Epilogue: quad-reduce the row sums, O /= l, store bf16 O directly from registers,
//     LSE = (m + log2 l) * ln2 from the lane owning column 0 of the row.
// Shared memory: Q 32 KB + 3 stages x (K 32 KB + V 32 KB) = 224 KB (+ 13 barriers = 104 B,
// + 1 KB for alignment) = 230504 B of the 232448 B allowed (same budget as the non-causal
// kernel). Three stages let the producer run two K/V tiles ahead, which hides L2/HBM latency (one
// CTA per SM; nothing else needs the shared memory).
//
// Not done (ideas for after the first GPU run): a persistent kernel with a longest-first work
// list (FA3's causal scheduler), which would also hide the prologue/epilogue of the many short
// CTAs; skipping the all-masked key half of the diagonal tile for consumer 0 (rows 0..63 never
// see keys 64..127 of it).

#include "ptxgym_h100.cuh"

#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cstdint>
#include <cmath>

namespace {

constexpr int kD = 128;         // head dimension (fixed)
constexpr int kBM = 128;        // query rows per CTA: 2 consumer warpgroups x 64
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
constexpr uint32_t kNumBars = 1 + 4 * kStages;  // q_full, k_full[], k_empty[], v_full[], v_empty[]
constexpr uint32_t kSmemBytes = kOffBar + 8 * kNumBars + 1024;  // +1 KB to round the base up
static_assert(kSmemBytes <= 232448, "dynamic shared memory over the 227 KB limit");

// Empty barriers: one arrival per consumer warp (2 warpgroups x 4 warps). Each warp arrives after
// its own wgmma.wait_group retired the group that read the stage (a warp's HGMMA reads the whole
// B tile, so per-warp completion is the safe granularity).
constexpr uint32_t kEmptyArrivals = 8;

// Named barrier ids for the ping-pong: kTurnBar + g is "consumer g may issue its GEMMs".
constexpr uint32_t kTurnBar = 1;

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
// jj and e are compile-time constants after unrolling: 64 compare+select pairs, once per CTA.
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
    mha_fwd_causal_d128_kernel(const __grid_constant__ CUtensorMap tmQ,
                               const __grid_constant__ CUtensorMap tmK,
                               const __grid_constant__ CUtensorMap tmV,
                               __nv_bfloat16* __restrict__ O, float* __restrict__ LSE, int S,
                               int H, float scale_log2) {
  extern __shared__ uint8_t smem_raw[];
  // The dynamic smem base is not guaranteed 1024-aligned: round it up (1 KB extra requested).
  uint8_t* sm = reinterpret_cast<uint8_t*>(
      (reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~static_cast<uintptr_t>(1023));
  uint8_t* sQ = sm + kOffQ;
  uint8_t* sK = sm + kOffK;
  uint8_t* sV = sm + kOffV;
  uint64_t* bars = reinterpret_cast<uint64_t*>(sm + kOffBar);
  uint64_t* q_full = bars;
  uint64_t* k_full = bars + 1;
  uint64_t* k_empty = bars + 1 + kStages;
  uint64_t* v_full = bars + 1 + 2 * kStages;
  uint64_t* v_empty = bars + 1 + 3 * kStages;

  // ---- 0. causal work assignment ----
  // Load balance: query tile qt costs qt + 1 K/V iterations (1 .. S/128, i.e. 1 .. 32 at S=4096).
  // The block scheduler hands out CTAs roughly in linear block order (x fastest) as SMs free up.
  // In natural order the last CTAs handed out would be the longest ones (qt = S/128-1 of the last
  // head), starting in the final wave and running alone for up to 32 iterations: a tail of about
  // one whole long CTA. Reversing x puts each head's heaviest tiles first and its 1-iteration
  // tiles last, so the final wave is made of short CTAs that pack around the long ones still
  // running (longest-processing-time-first, approximately).
  // Why the query tile stays the FASTEST dimension (rather than slowest, which would give a
  // global longest-first order): with x fastest the ~132 resident CTAs span only ~4-5 (b, h)
  // heads, whose K/V (2 MB each at S = 4096) stay in the 60 MB L2 while every query tile of the
  // head re-reads them. With the query tile slowest the resident CTAs would span ~132 heads, and
  // the K/V re-reads (528 tile loads of 64 KB per head instead of 32) would mostly come from HBM.
  const int n_q = static_cast<int>(gridDim.x);
  const int q_tile = n_q - 1 - static_cast<int>(blockIdx.x);
  const int h = blockIdx.y;
  const int b = blockIdx.z;
  // Tiles skipped: K/V tiles 0..q_tile are the only ones with a key <= some query of this tile.
  // Producer and consumers both use this n_kv; the K/V tile of iteration i is q_tile - i.
  const int n_kv = q_tile + 1;  // >= 1

  if (threadIdx.x == 0) {
    ptx::mbar_init(q_full, 1);
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
      // Token coordinate in the flattened [B*S] dimension of the 3-D maps.
      const int q_tok = b * S + q_tile * kBM;
      const int kv_tok0 = b * S;
      ptx::mbar_arrive_expect_tx(q_full, kTileBytes);
      ptx::tma_load_3d(sQ, &tmQ, q_full, 0, h, q_tok);               // d 0..63
      ptx::tma_load_3d(sQ + kBoxBytes, &tmQ, q_full, 64, h, q_tok);  // d 64..127
      int kst = 0, vst = 0;
      uint32_t kph = 0, vph = 0;
      // causal: n_kv loads, diagonal tile first, downwards; tiles above the diagonal never load.
      for (int i = 0; i < n_kv; ++i) {
        const int tok = kv_tok0 + (q_tile - i) * kBN;
        // K: wait until both consumers released this stage (fresh barrier: parity 1 passes).
        ptx::mbar_wait(&k_empty[kst], kph ^ 1u);
        ptx::mbar_arrive_expect_tx(&k_full[kst], kTileBytes);
        uint8_t* dk = sK + kst * kTileBytes;
        ptx::tma_load_3d(dk, &tmK, &k_full[kst], 0, h, tok);
        ptx::tma_load_3d(dk + kBoxBytes, &tmK, &k_full[kst], 64, h, tok);
        if (++kst == kStages) { kst = 0; kph ^= 1u; }
        // V: its own ring (it is released later than K of the same tile).
        ptx::mbar_wait(&v_empty[vst], vph ^ 1u);
        ptx::mbar_arrive_expect_tx(&v_full[vst], kTileBytes);
        uint8_t* dv = sV + vst * kTileBytes;
        ptx::tma_load_3d(dv, &tmV, &v_full[vst], 0, h, tok);
        ptx::tma_load_3d(dv + kBoxBytes, &tmV, &v_full[vst], 64, h, tok);
        if (++vst == kStages) { vst = 0; vph ^= 1u; }
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
  float sc0 = 1.f, sc1 = 1.f;  // pending O rescale factors (applied before the next P V)

#pragma unroll
  for (int i = 0; i < 64; ++i) o_acc[i] = 0.f;

  int kst = 0, vst = 0;
  uint32_t kph = 0, vph = 0;

  // Ping-pong priming: consumer 0 issues first, so consumer 1 opens consumer 0's turn.
  if (g == 1) ptx::named_bar_arrive(kTurnBar + 0, 256);

  ptx::mbar_wait(q_full, 0);

  // ---- 2a. prologue: S = Q K_qt^T (the diagonal tile) and its softmax ----
  ptx::mbar_wait(&k_full[kst], kph);
  ptx::named_bar_sync(kTurnBar + g, 256);
  ptx::fence_regs(s_acc);
  ptx::wgmma_fence();
  issue_qk(s_acc, dq, ptx::make_desc_kmajor_sw128(sK + kst * kTileBytes));
  ptx::wgmma_commit();
  // Hand the turn to the other consumer. Consumer 1's last hand-over would have no partner
  // (consumer 0 has no further sync), so it is skipped to keep the barriers balanced. Count per
  // CTA: consumer 0 syncs bar 1 n_kv times, matched by consumer 1's priming arrive + its n_kv - 1
  // loop/prologue arrives; consumer 1 syncs bar 2 n_kv times, matched by consumer 0's n_kv
  // arrives. With n_kv = 1 (query tile 0) consumer 1 arrives only in the priming.
  if (!(g == 1 && n_kv == 1)) ptx::named_bar_arrive(kTurnBar + (1 - g), 256);
  ptx::wgmma_wait<0>();
  ptx::fence_regs(s_acc);
  if (warp_leader) ptx::mbar_arrive(&k_empty[kst]);
  if (++kst == kStages) { kst = 0; kph ^= 1u; }
  // ---- 2b. causal mask: the first processed tile is always the diagonal one ----
  // Set S = -inf where key > query, before the max. Column 0 of the tile (key 128 qt) is kept in
  // every row, and quad lane q = 0 holds it, so quad_max below is finite even for a thread whose
  // own values of a row are all masked (rows 0..7 of consumer 0); ex2(-inf * c - m) = +0 then.
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
  // j counts blocks in processing order: block j is K/V tile q_tile - j, strictly below the
  // diagonal for j >= 1, so no mask here. The ring stages follow the same order as the producer.
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
    if (!(g == 1 && j == n_kv - 1)) ptx::named_bar_arrive(kTurnBar + (1 - g), 256);

    ptx::wgmma_wait<1>();  // the older group G_S(j) is done; G_PV(j-1) may still run
    ptx::fence_regs(s_acc);
    if (warp_leader) ptx::mbar_arrive(&k_empty[kst]);
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

    // Wait for K_{j+1} here rather than only at the top of the next iteration (where the wait
    // is repeated and then passes at once). Its try_wait loop ends a basic block: without it,
    // ptxas (nvcc 13.0) hoists the WARPGROUP.DEPBAR of the wait below above all the MUFU.EX2 of
    // the softmax, which serialises the softmax behind the running P V wgmma and loses the
    // intra-warpgroup overlap. K_{j+1} is needed next anyway, so this costs nothing. Re-waiting
    // a completed phase is safe: this stage cannot complete another phase before we release it.
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
  if (warp_leader) ptx::mbar_arrive(&v_empty[vst]);  // hygiene: the producer is already done

  // ---- 2e. epilogue ----
  l0 = quad_sum(l0);
  l1 = quad_sum(l1);
  // l >= 1: the row maximum (an unmasked score, see 2b) contributes ex2(0) = 1. Masked scores
  // contributed exact zeros, so l and LSE sum over keys j <= i only, as the causal LSE requires.
  const float inv0 = 1.f / l0;
  const float inv1 = 1.f / l1;
  const int row0 = q_tile * kBM + static_cast<int>(g * 64u + r0);  // token index within the batch
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
  if (H > 65535 || B > 65535) return static_cast<int>(cudaErrorInvalidValue);
  if ((reinterpret_cast<uintptr_t>(O) % 4) != 0) return static_cast<int>(cudaErrorInvalidValue);

  CUtensorMap tmQ, tmK, tmV;
  if (make_qkv_map(&tmQ, Q, B, S, H) != CUDA_SUCCESS ||
      make_qkv_map(&tmK, K, B, S, H) != CUDA_SUCCESS ||
      make_qkv_map(&tmV, V, B, S, H) != CUDA_SUCCESS) {
    return static_cast<int>(cudaErrorInvalidValue);
  }

  const cudaError_t attr =
      ptx::set_max_dynamic_smem(mha_fwd_causal_d128_kernel, static_cast<int>(kSmemBytes));
  if (attr != cudaSuccess) return static_cast<int>(attr);

  const float scale_log2 =
      static_cast<float>(1.4426950408889634 / std::sqrt(static_cast<double>(kD)));
  // gridDim.x = number of query tiles; the kernel maps blockIdx.x to query tile S/128-1-x.
  const dim3 grid(S / kBM, H, B);
  mha_fwd_causal_d128_kernel<<<grid, kThreads, kSmemBytes, stream>>>(tmQ, tmK, tmV, O, LSE, S, H,
                                                                    scale_log2);
  return static_cast<int>(cudaGetLastError());
}
