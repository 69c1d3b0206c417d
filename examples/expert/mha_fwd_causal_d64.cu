// Expert CAUSAL attention forward, head_dim 64, 192-row query tiles (FlashAttention-3's hdim-64
// shape), for Hopper (sm_90a). Task PTX-H100-MHAFwdCausal-d64. H200, 2026-12-02, `ptxgym eval`
// defaults: PASSED, qualified, 0.3187 ms against cuDNN's 0.3472 ms (1.089x). Desk-checked
// before its first run (examples/expert/drafts/causal_fwd_check.py:
// which K/V tiles each query tile and warpgroup visits, which scores the mask keeps, the ring
// bookkeeping of a skipped tile, the query-tile hand-out order).
//
//   Q, K, V, O: [B, S, H, 64] bf16 (D contiguous, heads interleaved: one head's consecutive
//   tokens are H*64 elements apart);  LSE: [B, H, S] fp32, natural log of sum_{j<=i} exp(scale*
//   q_i.k_j), scale = 1/sqrt(64), causal: query i attends keys j <= i (S_q = S_k, so the
//   diagonal is the main diagonal). S must be a multiple of 64 (cudaErrorInvalidValue
//   otherwise) and B*S must fit in int32 (TMA coordinates).
//
// Derived from the GPU-verified examples/expert/mha_fwd_d64.cu (1.112x cuDNN on an H200) by the
// changes that turned examples/expert/mha_fwd_d128.cu into examples/expert/mha_fwd_causal_d128.cu
// (0.995x cuDNN, GPU-verified), adapted to 192-row query tiles against 128-key tiles.
// Everything not marked "causal" below is the d64 kernel's code, unchanged. What changed:
//   * causal, the diagonal per warpgroup. A 192-row query tile is not aligned to the 128-key
//     tiles (it starts at 0 or 64 modulo 128) and straddles two of them, so "the diagonal tile"
//     is a per-warpgroup notion: warpgroup g owns rows a .. a+63 (a = q_start + 64g, a multiple
//     of 64), needs key tiles 0 .. kt_g = floor(a/128) (tile kt_g starts at 128 kt_g <= a, tile
//     kt_g + 1 at > a + 63), and exactly one of them crosses its diagonal: tile kt_g, where it
//     keeps column c of row r iff c <= r + (a mod 128). That is mha_fwd_causal_d128.cu's
//     mask_diagonal() with the row offset a mod 128 in place of 64g (the same number there).
//     Tiles below kt_g are entirely kept (last key 128 kt_g - 1 < a).
//   * causal, tile skipping. The CTA loads key tiles 0 .. kt_hi only, kt_hi = floor(last row /
//     128) = the last warpgroup's kt_g: n_kv = kt_hi + 1 (instead of ceil(S/128)). Tiles above
//     kt_hi hold no key <= any row of the CTA and never load.
//   * causal, order: K/V tiles are processed downwards, kt_hi, kt_hi - 1, .., 0 (as in the d128
//     causal kernel), so each warpgroup's one masked tile is its FIRST one, masked in the
//     prologue; the steady-state loop is the non-causal loop (no mask, no branch). Column 0 of
//     the diagonal tile (key 128 kt_g <= a) is kept in every row, so every running max is finite
//     from the first block on (no -inf - -inf).
//   * causal, per-warpgroup trip count. kt_g is kt_hi or kt_hi - 1 (a 192-row tile spans two key
//     tiles at most). A warpgroup with kt_g = kt_hi - 1 has NO key <= any of its rows in the
//     CTA's first tile (it would be all -inf, and its max -inf): it releases that stage of both
//     rings without reading it (its 4 warps arrive on k_empty/v_empty, exactly as if it had
//     consumed it) and runs n_g = kt_g + 1 iterations from the next stage on. The producer never
//     waits for the stage (tile 0's phase on a fresh barrier, and the last warpgroup, which
//     never skips, still waits for the TMA bytes before it releases it). No ping-pong in this
//     kernel, so different trip counts per warpgroup need no named-barrier bookkeeping.
//   * causal, the half key tile. When S % 128 == 64 the top key tile kt = (S-64)/128 has 64 real
//     keys. It is only ever processed as a diagonal tile, where columns 64..127 (keys >= S) are
//     masked by the causal condition itself, so the non-causal kernel's special first tile
//     (kv_half, mask_upper_half) is gone. Its box 1 re-loads box 0's keys (real keys of this
//     head, never another batch's), which the mask discards.
//   * causal, query tiling and hand-out order. The same 192/128-row tiles, but the 128-row ones
//     are now the FIRST tiles of the sequence (rows 0..127, 128..255) and blockIdx.x = 0 takes
//     the LAST query tile: per head, CTAs are handed out heaviest first (a CTA's work, the sum
//     of its warpgroups' n_g, falls with every step down the sequence, and the 128-row tiles at
//     the start are the lightest of all), so the final wave is made of short CTAs
//     (longest-processing-time-first, as in the d128 causal kernel).
//     With the parent's tiling (128-row tiles at the end) the reversed order would start with
//     two 128-row tiles lighter than the 192-row tiles after them.
//   * FLOPs: the task counts 2 B H S (S+1) D (the S(S+1)/2 kept pairs x 4 D). The kernel runs
//     n_g 64 x 128 blocks per warpgroup, i.e. the masked part of each warpgroup's diagonal tile
//     as well: 1.031x the counted pairs at S = 4096, as in the d128 causal kernel (each 64-row
//     unit of queries runs the same blocks there; the desk check prints the figure).
//
// The non-causal kernel's description follows (its figures are the non-causal grid's):
//
// Derived from the previous examples/expert/mha_fwd_d64.cu, "the 128-row kernel" below (in git
// history; GPU-verified, 0.957x cuDNN on an H200: 128-row query tile, 2 consumer warpgroups, no
// ping-pong). What changed, and why:
//   * 3 consumer warpgroups of 64 query rows each: a CTA owns up to 192 query rows, so each K/V
//     tile brought into shared memory feeds 192 rows instead of 128, and each SM sub-partition
//     holds 3 consumer warps instead of 2. At D = 64 the exp work per block (MUFU.EX2, 16/clk/SM)
//     equals the MMA work, and one warpgroup's softmax cannot overlap its own S GEMM (it needs
//     the result), so the tensor core and the MUFU are both busy only when another warpgroup has
//     work of the other kind ready; with three warpgroups there is one more candidate at every
//     moment. FlashAttention-3 uses 192-row tiles with 3 consumer warpgroups for head_dim 64.
//   * 512 threads = 4 warpgroups: 512 x 128 registers at launch = the whole 64K register file.
//     setmaxnreg moves it: the producer drops to 32, the consumers rise to 160
//     (32 x 128 + 160 x 384 = 65536; FA3's split for 3 consumer warpgroups). 160 is enough for
//     the overlapped loop: S 64 + P fragments 32 + O 32 fp32 = 128 live registers plus
//     max/sum/scale state and addresses (ptxas: 0 spills).
//   * Query tiling with 192- and 128-row tiles only. S = 4096 is 21.33 x 192; a 64-row last tile
//     would leave 1344 full 192-row CTAs for 132 SMs, i.e. some SM runs 11 of them = 33 units of
//     64 rows, against 32 units (16 x 128 rows) for the 128-row kernel. Splitting each head's
//     u = S/64 row units as 3+3+...+3 (+2, or +2+2) instead gives 20 x 192 + 2 x 128 rows per
//     head at S = 4096, the same 22 CTAs per head, and a best-case makespan of 32 units (see the
//     README for the list-scheduling model). The 128-row tiles are the last ones of each head, so
//     the tail of the grid is made of the smaller CTAs (causal: they come first in the sequence
//     now, and last in the hand-out order). Only S = 64 gets a 64-row tile.
//     In a CTA with fewer than 3 active warpgroups the idle ones exit at once; the empty
//     barriers count only the active warps, and only the active warpgroups' Q rows are loaded.
//   * All TMA boxes are [64 tokens][64 d] (8 KB): Q is 1..3 boxes, a K or V tile 2 boxes, placed
//     back to back (rows 64..127 at +8 KB, a multiple of the 1024-B swizzle atom), which is
//     byte-for-byte the [128][64] tile of the 128-row box, so descriptors and k-steps are the
//     128-row kernel's. Since S % 64 == 0, no box ever straddles two batches in the flattened
//     B*S map: no row of another batch is ever loaded, and no zero fill is needed.
//   * Keys: 128-key tiles, n_kv = ceil(S/128) (causal: see above, n_kv and the half tile
//     changed). When S % 128 == 64 the last 64 keys form a half
//     tile, and it is processed FIRST (key order does not matter without a causal mask), so its
//     mask lives in the prologue and the steady loop is the 128-row kernel's, unchanged. Its stage
//     is still filled with 128 real keys of the same (batch, head): box 0 = keys S-64..S-1,
//     box 1 = keys S-128..S-65 again (keys 0..63 again when S == 64). The prologue overwrites S
//     columns 64..127 (registers 32..63, contracts §2) with -inf, so P is exactly +0 there, and
//     the duplicated V rows (finite whenever the output is) add exactly 0 in P V. Every P V
//     therefore has all 8 k-steps, and tx is 16 KB for every stage.
//   * Everything else is the 128-row kernel: S = Q K^T m64n128k16 SS (4 k-steps of +32 B), online
//     softmax in base 2 with scale*log2(e) folded into one FFMA, O += P V m64n64k16 RS with V
//     MN-major (SBO 1024, k-step +2048 B), P V_{j-1} overlapped with the softmax of block j
//     (FA3 intra-warpgroup overlap), no inter-warpgroup ping-pong (it cost 3 % at D = 64 with 2
//     consumers), separate 6-stage K and V rings, O and LSE stored from registers.
//   * Stages: each tile now feeds 192 rows, so it is consumed 1.5x slower than in the 128-row
//     kernel and 4 stages would already cover the same time; 6 still fit (below), and one CTA
//     per SM is resident anyway (512 threads x 128 registers), so they cost nothing.
// Shared memory: Q 24 KB + 6 stages x (K 16 KB + V 16 KB) = 216 KB = 221184 B, + 25 mbarriers
// (200 B), + 1 KB to round the base up to 1024 = 222408 B of the 232448 B allowed.

#include "ptxgym_h100.cuh"

#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cstdint>
#include <cmath>
#include <climits>

namespace {

constexpr int kD = 64;          // head dimension (fixed)
constexpr int kConsumers = 3;   // consumer warpgroups, 64 query rows each
constexpr int kBM = 64 * kConsumers;  // 192 query rows per full CTA
constexpr int kBN = 128;        // keys per K/V tile
constexpr int kBoxRows = 64;    // tokens per TMA box (one warpgroup's Q rows, half a K/V tile)
constexpr int kStages = 6;      // depth of each of the K and V rings
constexpr int kThreads = 128 * (1 + kConsumers);  // 512: producer WG + 3 consumer WGs
constexpr uint32_t kProducerRegs = 32;
constexpr uint32_t kConsumerRegs = 160;
static_assert(kProducerRegs * 128 + kConsumerRegs * 128 * kConsumers <= 65536,
              "setmaxnreg budget: the register file holds 64K registers");

// One TMA box: [64 rows][64 bf16] = 8 KB, 128B-swizzled (a row is exactly 128 B).
constexpr uint32_t kBoxBytes = kBoxRows * kD * 2;        // 8192
constexpr uint32_t kQBytes = kConsumers * kBoxBytes;     // 24576: three warpgroups' Q rows
constexpr uint32_t kKVTileBytes = 2 * kBoxBytes;         // 16384: one K or V stage, 128 keys

// Byte offsets from the 1024-aligned base; every box starts on a 1024-B boundary, so TMA's and
// wgmma's swizzle phases agree (descriptor base_offset 0).
constexpr uint32_t kOffQ = 0;
constexpr uint32_t kOffK = kOffQ + kQBytes;
constexpr uint32_t kOffV = kOffK + kStages * kKVTileBytes;
constexpr uint32_t kOffBar = kOffV + kStages * kKVTileBytes;
constexpr uint32_t kNumBars = 1 + 4 * kStages;  // q_full, k_full[], k_empty[], v_full[], v_empty[]
constexpr uint32_t kSmemBytes = kOffBar + 8 * kNumBars + 1024;  // +1 KB to round the base up
static_assert(kBoxBytes % 1024 == 0 && kQBytes % 1024 == 0, "boxes must stay 1024-B aligned");
static_assert(kSmemBytes <= 232448, "dynamic shared memory over the 227 KB limit");

constexpr float kLn2 = 0.69314718055994531f;

// Query tiling of one head (host and device). u = S/64 row units are cut into n3 tiles of 3
// units (192 rows) and 0, 1 or 2 tiles of 2 units (128 rows); u == 1 is one 1-unit tile.
// causal: the smaller tiles come FIRST in the sequence (see the kernel's step 0).
//   u % 3 == 0: n3 = u/3.   u % 3 == 2: n3 = u/3, one 128-row tile.
//   u % 3 == 1: n3 = u/3 - 1, two 128-row tiles (u == 1: n3 = 0, one 64-row tile).
__host__ __device__ inline int num_full_tiles(int units) {
  return (units % 3 == 1) ? (units >= 4 ? units / 3 - 1 : 0) : units / 3;
}
__host__ __device__ inline int num_q_tiles(int units) {
  const int n3 = num_full_tiles(units);
  return n3 + (units - 3 * n3 + 1) / 2;  // remainder 0, 1, 2, 4 -> 0, 1, 1, 2 smaller tiles
}

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

// S = Q K^T over D = 64: 4 k-steps of m64n128k16, both operands K-major 128B-swizzled.
// dq: descriptor of this warpgroup's 64 Q rows; dk: descriptor of the K stage (its two 64-row
// boxes back to back read as one [128][64] tile: SBO 1024 walks all 16 eight-row groups).
// scale_d = 0 on the first k-step overwrites the old S/P.
__device__ __forceinline__ void issue_qk(float (&s_acc)[64], uint64_t dq, uint64_t dk) {
#pragma unroll
  for (int kk = 0; kk < kD / 16; ++kk) {
    const uint32_t off = static_cast<uint32_t>(kk) * 32u;
    ptx::wgmma_ss<128, 0, 0>(s_acc, ptx::desc_advance(dq, off), ptx::desc_advance(dk, off),
                             kk > 0 ? 1 : 0);
  }
}

// O += P V over the 128 keys of one tile: 8 k-steps of m64n64k16 RS. P's k-step s = S columns
// 16s..16s+15 = keys 16s..16s+15 = V rows 16s..16s+15, i.e. +16 rows * 128 B = +2048 B (a
// multiple of the 1024-B swizzle atom, so base_offset stays 0).
__device__ __forceinline__ void issue_pv(float (&o_acc)[32], const uint32_t (&pf)[8][4],
                                         uint64_t dv) {
#pragma unroll
  for (int s = 0; s < 8; ++s) {
    ptx::wgmma_rs<64, 1>(o_acc, pf[s], ptx::desc_advance(dv, 2048u * static_cast<uint32_t>(s)), 1);
  }
}

// causal: mask a warpgroup's diagonal tile (replaces the non-causal mask_upper_half; this is
// mha_fwd_causal_d128.cu's mask_diagonal, unchanged). Thread (r0, q) holds, in register 4jj+e
// (e = 0, 1), the score of warpgroup row r0 and tile column 8jj + 2q + e, and in register
// 4jj+2+e that of row r0 + 8 (contracts §2). Warpgroup row r is query a + r, tile column c is
// key 128 kt_g + c, and a - 128 kt_g = a mod 128 = off (0 or 64), so "key > query" is
// c > r + off:   8jj + 2q + e > r + off  <=>  8jj + e > r + off - 2q = lim.
// The caller passes row0 = off + r0. An overwrite makes the scores exactly -inf whatever they
// were (also for the half tile's re-loaded keys), so P = ex2(-inf) = +0 there.
// jj and e are compile-time constants after unrolling: 64 compare+select pairs, once per CTA.
__device__ __forceinline__ void mask_diagonal(float (&s_acc)[64], int row0, int q) {
  const float kNegInf = -INFINITY;
  const int lim0 = row0 - 2 * q;  // row r0
  const int lim1 = lim0 + 8;      // row r0 + 8
#pragma unroll
  for (int jj = 0; jj < 16; ++jj) {
    if (8 * jj + 0 > lim0) s_acc[4 * jj + 0] = kNegInf;
    if (8 * jj + 1 > lim0) s_acc[4 * jj + 1] = kNegInf;
    if (8 * jj + 0 > lim1) s_acc[4 * jj + 2] = kNegInf;
    if (8 * jj + 1 > lim1) s_acc[4 * jj + 3] = kNegInf;
  }
}

__global__ void __launch_bounds__(kThreads, 1)
    mha_fwd_causal_d64_m192_kernel(const __grid_constant__ CUtensorMap tmQ,
                            const __grid_constant__ CUtensorMap tmK,
                            const __grid_constant__ CUtensorMap tmV,
                            __nv_bfloat16* __restrict__ O, float* __restrict__ LSE, int S, int H,
                            int n_full, float scale_log2) {
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

  const int h = blockIdx.y;
  const int b = blockIdx.z;
  // ---- step 0: this CTA's query rows (see num_full_tiles) ----
  // causal: hand-out order. blockIdx.x = 0 takes the LAST query tile of the head (the heaviest:
  // it needs the most K/V tiles) and blockIdx.x = n_q - 1 the first (the lightest), so each
  // head's CTAs are handed out heaviest first and the final wave is made of short CTAs.
  // x stays the fastest grid dimension so the resident CTAs span only a few heads, whose K/V
  // stay in L2 (mha_fwd_causal_d128.cu explains).
  const int n_q = static_cast<int>(gridDim.x);
  const int x = n_q - 1 - static_cast<int>(blockIdx.x);  // query tile index in sequence order
  // causal: the n_small = n_q - n_full smaller tiles (128 rows, or 64 when S == 64) come first
  // in the sequence, then the 192-row tiles, so cost grows with x. Because S % 64 == 0 and every
  // tile starts on a multiple of 64, the tile's valid rows are exactly the rows of its first
  // n_active warpgroups: an active warpgroup never holds a row >= S.
  const int n_small = n_q - n_full;  // 0, 1 or 2
  const int q_start = x < n_small ? 128 * x : 128 * n_small + kBM * (x - n_small);
  const int n_active = x < n_small ? min(2, S / 64) : kConsumers;  // 1..3
  // causal: tiles skipped. The CTA's last row is q_start + 64 n_active - 1; key tiles
  // 0..kt_hi are the only ones with a key <= some row of the CTA. The producer loads them
  // downwards (the K/V tile of load i is kt_hi - i); each consumer warpgroup uses its own part.
  const int kt_hi = (q_start + 64 * n_active - 1) / kBN;
  const int n_kv = kt_hi + 1;  // >= 1

  // ---- step 1: barrier initialisation (one thread), then a CTA-wide barrier ----
  if (threadIdx.x == 0) {
    ptx::mbar_init(q_full, 1);
#pragma unroll
    for (int s = 0; s < kStages; ++s) {
      ptx::mbar_init(&k_full[s], 1);
      // One arrival per ACTIVE consumer warp, after its own wgmma_wait retired the group that
      // read the stage (idle warpgroups exit without ever arriving).
      ptx::mbar_init(&k_empty[s], 4u * static_cast<uint32_t>(n_active));
      ptx::mbar_init(&v_full[s], 1);
      ptx::mbar_init(&v_empty[s], 4u * static_cast<uint32_t>(n_active));
    }
    ptx::fence_mbarrier_init();
    ptx::prefetch_tmap(&tmQ);
    ptx::prefetch_tmap(&tmK);
    ptx::prefetch_tmap(&tmV);
  }
  __syncthreads();  // barriers initialised before anyone arrives, waits or is targeted by TMA

  const uint32_t wg = ptx::warpgroup_idx();
  if (wg == 0) {
    // ---- step 2: producer warpgroup: Q once, then K_j / V_j through their rings ----
    ptx::setmaxnreg_dec<kProducerRegs>();
    if (ptx::warp_idx() == 0 && ptx::elect_one_sync()) {
      // Token coordinates in the flattened [B*S] dimension of the 3-D maps.
      const int q_tok = b * S + q_start;
      const int kv_tok0 = b * S;
      // Only the active warpgroups' rows: every loaded row is < S, so tx = n_active boxes.
      ptx::mbar_arrive_expect_tx(q_full, kBoxBytes * static_cast<uint32_t>(n_active));
      for (int i = 0; i < n_active; ++i) {
        ptx::tma_load_3d(sQ + i * kBoxBytes, &tmQ, q_full, 0, h, q_tok + kBoxRows * i);
      }
      int kst = 0, vst = 0;
      uint32_t kph = 0, vph = 0;
      // causal: n_kv loads, the top (diagonal) tile first, downwards; tiles above never load.
      for (int i = 0; i < n_kv; ++i) {
        // causal: box 1 of a half tile (S % 128 == 64, top tile only) would start at key S, in
        // the next batch: it re-loads box 0's keys instead (real keys of this head; they sit in
        // columns 64..127, keys >= S for the mask, so they are discarded).
        int tok0 = (kt_hi - i) * kBN;
        int tok1 = tok0 + kBoxRows < S ? tok0 + kBoxRows : tok0;
        tok0 += kv_tok0;
        tok1 += kv_tok0;
        // K: wait until every active consumer warp released this stage (fresh: parity 1 passes).
        ptx::mbar_wait(&k_empty[kst], kph ^ 1u);
        ptx::mbar_arrive_expect_tx(&k_full[kst], kKVTileBytes);
        uint8_t* kdst = sK + kst * kKVTileBytes;
        ptx::tma_load_3d(kdst, &tmK, &k_full[kst], 0, h, tok0);
        ptx::tma_load_3d(kdst + kBoxBytes, &tmK, &k_full[kst], 0, h, tok1);
        if (++kst == kStages) { kst = 0; kph ^= 1u; }
        // V: its own ring (it is released later than K of the same tile).
        ptx::mbar_wait(&v_empty[vst], vph ^ 1u);
        ptx::mbar_arrive_expect_tx(&v_full[vst], kKVTileBytes);
        uint8_t* vdst = sV + vst * kKVTileBytes;
        ptx::tma_load_3d(vdst, &tmV, &v_full[vst], 0, h, tok0);
        ptx::tma_load_3d(vdst + kBoxBytes, &tmV, &v_full[vst], 0, h, tok1);
        if (++vst == kStages) { vst = 0; vph ^= 1u; }
      }
    }
    // The other producer threads have nothing to do; no CTA-wide barrier follows.
    return;
  }

  const uint32_t g = wg - 1;  // 0, 1 or 2: query rows q_start + 64g .. + 63
  // An idle warpgroup (past the end of the sequence) leaves before taking registers: it never
  // waits, never arrives (the empty counts exclude it) and stores nothing.
  if (static_cast<int>(g) >= n_active) return;

  // ---- step 3: consumer warpgroups: set-up ----
  ptx::setmaxnreg_inc<kConsumerRegs>();
  const uint32_t t = threadIdx.x % 128u;      // thread in the warpgroup
  const uint32_t warp = t / 32u;
  const uint32_t lane = t % 32u;
  const bool warp_leader = (lane == 0);
  const float c = scale_log2;                 // scale * log2(e)
  // causal: r0 and q are needed by the diagonal mask in step 4 (moved up from the epilogue).
  const uint32_t r0 = 16u * warp + lane / 4u;  // accumulator rows r0 and r0 + 8 (contracts §2)
  const uint32_t q = lane % 4u;                // accumulator columns 8j + 2q, 8j + 2q + 1
  // causal: this warpgroup's diagonal key tile and trip count (see the header). Its rows are
  // a .. a+63; key tile kt_g = floor(a / 128) is the last one with a key <= a + 63.
  const int a = q_start + 64 * static_cast<int>(g);
  const int kt_g = a / kBN;
  const int n_g = kt_g + 1;           // K/V tiles this warpgroup processes: kt_g, .., 0
  const int n_skip = n_kv - n_g;      // 0 or 1 leading CTA tiles entirely above its rows

  // This warpgroup's A descriptor: its 64 Q rows are box g, 8 KB into the Q region.
  const uint64_t dq = ptx::make_desc_kmajor_sw128(sQ + g * kBoxBytes);

  float s_acc[64];      // S block (fp32), overwritten in place by P (fp32)
  float o_acc[32];      // O accumulator (m64n64), unnormalised
  uint32_t pf[8][4];    // P as bf16 RS A-fragments, one [4] per k-step of 16 keys
  float m0, m1;         // running max (log2 units, scaled) of rows r0 and r0 + 8
  float l0, l1;         // per-thread partial row sums
  float sc0 = 1.f, sc1 = 1.f;  // pending O rescale factors (applied before the next P V)

#pragma unroll
  for (int i = 0; i < 32; ++i) o_acc[i] = 0.f;

  int kst = 0, vst = 0;
  uint32_t kph = 0, vph = 0;

  // causal: release the stages of the leading tiles that hold no key <= any of this warpgroup's
  // rows without reading them (one arrival per warp, as after a read), and move on to the next
  // stage. Not waiting on their full barriers is safe: the producer refills a stage only after
  // every active warp released it, and the last warpgroup (n_skip = 0 always) reads each of
  // these tiles after its TMA completed.
  for (int i = 0; i < n_skip; ++i) {
    if (warp_leader) {
      ptx::mbar_arrive(&k_empty[kst]);
      ptx::mbar_arrive(&v_empty[vst]);
    }
    if (++kst == kStages) { kst = 0; kph ^= 1u; }
    if (++vst == kStages) { vst = 0; vph ^= 1u; }
  }

  ptx::mbar_wait(q_full, 0);

  // ---- step 4: prologue: S = Q K_kt_g^T (causal: this warpgroup's diagonal tile), softmax ----
  ptx::mbar_wait(&k_full[kst], kph);
  ptx::fence_regs(s_acc);
  ptx::wgmma_fence();
  issue_qk(s_acc, dq, ptx::make_desc_kmajor_sw128(sK + kst * kKVTileBytes));
  ptx::wgmma_commit();
  ptx::wgmma_wait<0>();
  ptx::fence_regs(s_acc);
  if (warp_leader) ptx::mbar_arrive(&k_empty[kst]);
  if (++kst == kStages) { kst = 0; kph ^= 1u; }
  // causal: the first tile processed is always this warpgroup's diagonal one: set S = -inf where
  // key > query, before the max (this also drops a half tile's re-loaded keys). Row offset
  // a mod 128 = a - 128 kt_g (0 or 64).
  mask_diagonal(s_acc, (a - kt_g * kBN) + static_cast<int>(r0), static_cast<int>(q));
  {
    float mx0 = fmaxf(s_acc[0], s_acc[1]);
    float mx1 = fmaxf(s_acc[2], s_acc[3]);
#pragma unroll
    for (int j = 1; j < 16; ++j) {
      mx0 = fmaxf(mx0, fmaxf(s_acc[4 * j + 0], s_acc[4 * j + 1]));
      mx1 = fmaxf(mx1, fmaxf(s_acc[4 * j + 2], s_acc[4 * j + 3]));
    }
    // c > 0, so max(s) * c == max(s * c). causal: column 0 (key 128 kt_g <= a) is kept in every
    // row and quad lane q = 0 holds it, so m is finite; masked scores give ex2(-inf) = +0.
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

  // ---- step 5: steady state: block j's S GEMM and block j-1's P V GEMM in flight together ----
  // causal: j counts this warpgroup's blocks in processing order: block j is K/V tile kt_g - j,
  // entirely below its diagonal for j >= 1, so no mask here; n_g blocks instead of n_kv.
#pragma unroll 1
  for (int j = 1; j < n_g; ++j) {
    // 5a. issue S_j = Q K_j^T
    ptx::mbar_wait(&k_full[kst], kph);
    ptx::fence_regs(s_acc);
    ptx::wgmma_fence();
    issue_qk(s_acc, dq, ptx::make_desc_kmajor_sw128(sK + kst * kKVTileBytes));
    ptx::wgmma_commit();                                   // group G_S(j)
    // 5b. O holds sum_{t<j-1} with max m_{j-2}; bring it to m_{j-1} before adding P_{j-1} V_{j-1}.
    // No wgmma in flight touches O here (G_PV(j-2) retired at the end of the last iteration).
#pragma unroll
    for (int i = 0; i < 32; i += 4) {
      o_acc[i + 0] *= sc0;
      o_acc[i + 1] *= sc0;
      o_acc[i + 2] *= sc1;
      o_acc[i + 3] *= sc1;
    }
    // 5c. issue O += P_{j-1} V_{j-1}
    ptx::mbar_wait(&v_full[vst], vph);
    ptx::fence_regs(o_acc);
    fence_frag(pf);
    ptx::wgmma_fence();  // O and P were written by ordinary instructions since the last wgmma
    issue_pv(o_acc, pf, ptx::make_desc_mnmajor_sw128(sV + vst * kKVTileBytes, kKVTileBytes));
    ptx::wgmma_commit();                                   // group G_PV(j-1)

    // 5d. S_j ready: release K stage
    ptx::wgmma_wait<1>();  // the older group G_S(j) is done; G_PV(j-1) may still run
    ptx::fence_regs(s_acc);
    if (warp_leader) ptx::mbar_arrive(&k_empty[kst]);
    if (++kst == kStages) { kst = 0; kph ^= 1u; }

    // 5e. online softmax of block j (overlaps the running P V wgmma; touches only S, m, l, sc)
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

    // 5f. P V_{j-1} done: release V stage, pack P_j for the next iteration.
    // Wait for K_{j+1} here as well as at the top of the next iteration: its try_wait loop ends
    // a basic block, which keeps ptxas (nvcc 13.0) from hoisting the WARPGROUP.DEPBAR of the
    // wait below above the softmax's MUFU.EX2 (measured in the 128-row kernel).
    if (j + 1 < n_g) ptx::mbar_wait(&k_full[kst], kph);  // causal: n_g
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

  // ---- step 6: tail: P_{n-1} V_{n-1} (causal: K/V tile 0) ----
#pragma unroll
  for (int i = 0; i < 32; i += 4) {
    o_acc[i + 0] *= sc0;
    o_acc[i + 1] *= sc0;
    o_acc[i + 2] *= sc1;
    o_acc[i + 3] *= sc1;
  }
  ptx::mbar_wait(&v_full[vst], vph);
  ptx::fence_regs(o_acc);
  fence_frag(pf);
  ptx::wgmma_fence();
  issue_pv(o_acc, pf, ptx::make_desc_mnmajor_sw128(sV + vst * kKVTileBytes, kKVTileBytes));
  ptx::wgmma_commit();
  ptx::wgmma_wait<0>();
  ptx::fence_regs(o_acc);
  fence_frag(pf);
  if (warp_leader) ptx::mbar_arrive(&v_empty[vst]);  // hygiene: the producer is already done

  // ---- step 7: epilogue: normalise, store O (bf16) and LSE ----
  l0 = quad_sum(l0);
  l1 = quad_sum(l1);
  // l >= 1: the row maximum (an unmasked score, see step 4) contributes ex2(0) = 1.
  // causal: masked scores contributed exact zeros, so l and LSE sum over keys j <= i only.
  const float inv0 = 1.f / l0;
  const float inv1 = 1.f / l1;
  // Token index within the batch; < S because this warpgroup is active (step 0).
  const int row0 = q_start + static_cast<int>(g * 64u + r0);
  const int row1 = row0 + 8;
  const size_t tok_stride = static_cast<size_t>(H) * kD;
  __nv_bfloat16* o0 = O + (static_cast<size_t>(b) * S + row0) * tok_stride + static_cast<size_t>(h) * kD;
  __nv_bfloat16* o1 = o0 + 8 * tok_stride;
#pragma unroll
  for (int j = 0; j < kD / 8; ++j) {
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

// 3-D tensor map over a [B, S, H, 64] bf16 tensor: dims {64, H, B*S}, strides {128 B, H*128 B},
// box {64, 1, 64}, 128B swizzle (box row = 64 bf16 = 128 B = the swizzle span). With
// S % 64 == 0 a box starting at a multiple of 64 tokens stays inside one batch.
CUresult make_qkv_map(CUtensorMap* map, const __nv_bfloat16* p, int B, int S, int H) {
  return ptx::make_tmap_3d(map, p, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, kD,
                           static_cast<uint64_t>(H), static_cast<uint64_t>(B) * S,
                           static_cast<uint64_t>(kD) * 2, static_cast<uint64_t>(H) * kD * 2, 64,
                           1, kBoxRows, CU_TENSOR_MAP_SWIZZLE_128B);
}

}  // namespace

extern "C" int mha_fwd(const __nv_bfloat16* Q, const __nv_bfloat16* K, const __nv_bfloat16* V,
                       __nv_bfloat16* O, float* LSE, int B, int S, int H, int D,
                       cudaStream_t stream) {
  if (D != kD || B < 0 || S < 0 || H < 0) return static_cast<int>(cudaErrorInvalidValue);
  if (B == 0 || S == 0 || H == 0) return static_cast<int>(cudaSuccess);
  // 64-token boxes must not straddle batches in the flattened B*S map; TMA coordinates are int32.
  if (S % kBoxRows != 0) return static_cast<int>(cudaErrorInvalidValue);
  if (static_cast<int64_t>(B) * S > INT_MAX) return static_cast<int>(cudaErrorInvalidValue);
  if (H > 65535 || B > 65535) return static_cast<int>(cudaErrorInvalidValue);
  if ((reinterpret_cast<uintptr_t>(O) % 4) != 0) return static_cast<int>(cudaErrorInvalidValue);

  CUtensorMap tmQ, tmK, tmV;
  if (make_qkv_map(&tmQ, Q, B, S, H) != CUDA_SUCCESS ||
      make_qkv_map(&tmK, K, B, S, H) != CUDA_SUCCESS ||
      make_qkv_map(&tmV, V, B, S, H) != CUDA_SUCCESS) {
    return static_cast<int>(cudaErrorInvalidValue);
  }

  const cudaError_t attr =
      ptx::set_max_dynamic_smem(mha_fwd_causal_d64_m192_kernel, static_cast<int>(kSmemBytes));
  if (attr != cudaSuccess) return static_cast<int>(attr);

  const float scale_log2 =
      static_cast<float>(1.4426950408889634 / std::sqrt(static_cast<double>(kD)));
  const int units = S / 64;
  const int n_full = num_full_tiles(units);
  // causal: gridDim.x = number of query tiles; the kernel maps blockIdx.x to query tile
  // n_q - 1 - x (heaviest first) and puts the smaller tiles first in the sequence.
  const dim3 grid(num_q_tiles(units), H, B);
  mha_fwd_causal_d64_m192_kernel<<<grid, kThreads, kSmemBytes, stream>>>(
      tmQ, tmK, tmV, O, LSE, S, H, n_full, scale_log2);
  return static_cast<int>(cudaGetLastError());
}
