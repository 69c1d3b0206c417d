// Expert CAUSAL attention backward, head_dim 128, FlashAttention-3 style, for Hopper (sm_90a).
// H200, 2026-12-02, `ptxgym eval PTX-H100-MHABwdCausal-d128` defaults: PASSED, qualified, 1.481 ms against
// cuDNN's 1.460 ms (0.986x; docs/benchmarks.md, twentieth session).
//
// Derived from examples/expert/mha_bwd_d128.cu (non-causal) with the smallest changes;
// every changed place is marked "causal" (the rest of this header is that kernel's, unchanged):
//   * causal, tile skipping: key tile kt (keys 128kt .. 128kt+127) is attended only by queries
//     >= 128kt, i.e. 64-row query tiles qt >= 2kt (tile 2kt-1 ends at query 128kt-1 < 128kt).
//     The CTA visits qt = 2kt, 2kt+1, .., S/64-1 in that order (n_it = S/64 - 2kt >= 2 tiles;
//     producer and consumers share the count). Query tiles before 2kt get no dQ from this CTA.
//   * causal, mask: only qt = 2kt and 2kt+1 (iterations it = 0, 1) contain a key > query pair
//     (tile 2kt+2 starts at query 128kt+128 > every key of the tile). Consumer g holds keys
//     64g + r, iteration it queries 64it + c (both relative to token 128kt), so it needs the
//     mask only when it <= g: (g, it) = (0, 0) the diagonal, (1, 0) ALL masked (keys 64..127 vs
//     queries 0..63: P^T = dS^T = 0, still computed so both warpgroups keep one code path and
//     G5 reads a zero half), (1, 1) the diagonal; (0, 1) has no masked pair. Masked scores are
//     set to -inf before the exp: ex2(-inf) = +0, dS^T = 0 * finite = 0.
//   * causal, LSE: the task's LSE is the causal forward's (logsumexp over keys j <= i); every
//     query row keeps at least its own key, so it is finite and P^T = ex2(S c - LSE log2e) is the
//     causal P for every unmasked pair.
//   * causal, CTA order (load balance): key tile kt costs S/64 - 2kt query tiles (64 .. 2 at
//     S = 4096). A 1-D grid is cut into groups of kHeadGroup (b, h) heads; inside a group the key
//     tile is the SLOWER index (heaviest kt = 0 of every head in the group first, then kt = 1, ..)
//     and the head the faster one. A group (4 heads x 32 key tiles = 128 CTAs at S = 4096) is
//     about one wave, so the resident CTAs still span only ~4-5 heads that share their Q/dO in
//     L2 (the d128 kernel's reason for key-tile-fastest), while the hand-out order is close to
//     longest-first globally: list-scheduling model (bwd_causal_sync_sim.py) makespan / perfect
//     split 1.001 at B = 4, H = 16, S = 4096 vs 1.069 for the d128 kernel's (kt, h, b) grid.
//   * causal, no query stagger (kStaggerQ removed): CTAs of one head already start at different
//     query tiles (2kt).
//
//   Q, K, V, O, dO, dQ, dK, dV: [B, S, H, 128] bf16 (D contiguous; one head's consecutive tokens
//   are H*128 elements apart);  LSE: [B, H, S] fp32, natural log, CAUSAL, scale = 1/sqrt(128).
//   P = exp(scale Q K^T - LSE) for key j <= query i, 0 otherwise,  Dr = rowsum(dO * O),
//   dS = P * (dO V^T - Dr),  dV = P^T dO,  dK = scale dS^T Q,  dQ = scale dS K.
//   S must be a multiple of 128 (cudaErrorInvalidValue otherwise).
//
// Three kernels on `stream` (packs/h100/scheduling.md §3):
//   1. bwd_pre_kernel: Dr[b, h, s] = sum_d dO * O (fp32), one warp per token row. The fp32 dQ
//      accumulator is zeroed by cudaMemsetAsync just before.
//   2. mha_bwd_causal_d128_kernel, one CTA per (128-key tile, head, batch), 1-D grid
//      (causal: see "CTA order" above for the block -> (kt, h, b) map).
//      384 threads = 3 warpgroups:
//      * WG0 producer (setmaxnreg.dec 24): one thread loads K_j and V_j once (4 TMA boxes,
//        kv_full), then streams (Q_i, dO_i, LSE_i, Dr_i) for every 64-query tile i through a
//        kStages ring of full/empty mbarriers (4 TMA boxes + 2 bulk copies of 256 B per stage).
//      * WG1, WG2 consumers (setmaxnreg.inc 240); consumer g owns keys 64g .. 64g+63 of the tile
//        (wgmma M = 64) and keeps dK_g and dV_g (64 x 128 fp32 each) in registers for the whole
//        loop. Per query tile i >= 2kt (all products transposed so the keys are the M dimension):
//          G1  S^T  = K_g Q_i^T      m64n64k16 SS, 8 k-steps over d, both K-major
//          G2  dP^T = V_g dO_i^T     m64n64k16 SS, same form
//              P^T  = ex2(S^T c - LSE_i log2e)   (c = scale log2e; LSE indexed by the column)
//          G3  dV  += P^T dO_i       m64n128k16 RS, P^T packed to bf16 from the S^T registers,
//                                    dO_i is the MN-major B (trans-b 1), 4 k-steps of 16 queries
//              dS^T = P^T (dP^T - Dr_i), packed to bf16 and also stored to smem (dS^T buffer)
//          G4  dK  += dS^T Q_i       m64n128k16 RS, Q_i MN-major
//              named barrier over both consumers: the whole [128 keys][64 q] dS^T is in smem
//          G5  dQ_i[:, 64g..64g+63] = dS K_j[:, 64g..]   m64n64k16 SS, A = dS read MN-major
//                                    from the dS^T buffer (trans-a 1), B = K box g MN-major
//                                    (trans-b 1), 8 k-steps of 16 keys
//          the fp32 dQ partial goes to a per-warpgroup 16 KB smem staging buffer and one thread
//          adds it into the fp32 accumulator with a TMA reduce-add (cp.reduce.async.bulk.tensor
//          .add, ptx::tma_reduce_add_2d).
//        Overlap inside a warpgroup: the exp of P^T runs under G2, the dS^T math and its smem
//        store run under G3, the cross-warpgroup barrier under G3/G4. Across warpgroups the two
//        consumers' elementwise phases and GEMMs interleave freely except at the one barrier.
//      * The fp32 dQ accumulator uses a "fragment" layout: per (b, h, query tile) 8192 floats,
//        warpgroup half g at +4096, then chunk c (registers 4c..4c+3 of the m64n64 accumulator)
//        at +512c, then thread t at +4t. The staging writes are then one float4 per thread at
//        consecutive 16-B addresses (no bank conflicts), the 16 KB half is one contiguous
//        [64][64] fp32 TMA box, and kernel 3 undoes the permutation.
//   3. bwd_post_kernel: dQ = bf16(scale * dQacc) in [B, S, H, 128], one float4 per thread.
//
// Shared memory (from a 1024-aligned base): K 32 KB + V 32 KB + kStages x (Q 16 KB + dO 16 KB)
// + dS^T 2 x 16 KB (double-buffered, see the barrier argument at the dS^T store) + dQ staging
// 2 x 16 KB + kStages x 512 B (LSE, Dr) + mbarriers; kStages = 2: 197,672 B + 1 KB alignment
// slack.
//
// Scratch (allocated once, grown on demand, kept across calls): dQacc (B*H*S*128 fp32) and Dr
// (B*H*S fp32).

#include "ptxgym_h100.cuh"

#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cstdint>
#include <cmath>

namespace {

constexpr int kD = 128;        // head dimension (fixed)
constexpr int kBN = 128;       // keys per CTA: 2 consumer warpgroups x 64
constexpr int kBM = 64;        // queries per streamed tile
constexpr int kStages = 2;     // depth of the (Q, dO, LSE, Dr) ring; 3 also fits (231,992 B)
constexpr int kThreads = 384;  // producer WG + 2 consumer WGs
// causal: (b, h) heads per group of the CTA order (key tile slower than head inside a group).
constexpr int kHeadGroup = 4;
static_assert(kBN == 2 * kBM, "causal: the diagonal logic assumes 2 query tiles per key tile");

// TMA boxes, all [rows][64 bf16] = rows x 128 B, 128B-swizzled (one K-major swizzle-atom column).
constexpr uint32_t kKBox = 128u * 128u;      // K/V box: 128 keys x 64 d = 16 KB
constexpr uint32_t kKTile = 2u * kKBox;      // K or V tile (d 0..63 box, then d 64..127 box)
constexpr uint32_t kQBox = 64u * 128u;       // Q/dO box: 64 queries x 64 d = 8 KB
constexpr uint32_t kQTile = 2u * kQBox;      // Q or dO tile: 16 KB
constexpr uint32_t kDsBytes = 128u * 128u;   // dS^T buffer [128 keys][64 q] bf16 = 16 KB
constexpr uint32_t kDqHalf = 64u * 64u * 4u; // one warpgroup's dQ partial [64 q][64 d] fp32

// Byte offsets from the 1024-aligned base. Every operand tile starts on a 1024-B boundary so the
// swizzle phase of TMA / the dS^T stores and wgmma agree (descriptor base_offset = 0).
constexpr uint32_t kOffK = 0;
constexpr uint32_t kOffV = kOffK + kKTile;
constexpr uint32_t kOffQ = kOffV + kKTile;                 // stage s at + s * kQTile
constexpr uint32_t kOffDO = kOffQ + kStages * kQTile;      // stage s at + s * kQTile
constexpr uint32_t kOffDS = kOffDO + kStages * kQTile;     // buffer (it & 1) at + buf * kDsBytes
constexpr uint32_t kOffDQ = kOffDS + 2 * kDsBytes;         // consumer g at + g * kDqHalf
constexpr uint32_t kOffLSE = kOffDQ + 2 * kDqHalf;         // stage s: 64 floats at + s * 256
constexpr uint32_t kOffDR = kOffLSE + kStages * 256;       // stage s: 64 floats at + s * 256
constexpr uint32_t kOffBar = kOffDR + kStages * 256;
constexpr uint32_t kNumBars = 1 + 2 * kStages;             // kv_full, q_full[], q_empty[]
constexpr uint32_t kSmemBytes = kOffBar + 8 * kNumBars + 1024;  // +1 KB to round the base up
static_assert(kSmemBytes <= 232448, "dynamic shared memory over the 227 KB limit");
static_assert(kOffDQ % 1024 == 0 && kOffDS % 1024 == 0 && kOffQ % 1024 == 0 &&
                  kOffDO % 1024 == 0, "operand tiles must be 1024-B aligned");
static_assert(kOffBar % 8 == 0, "mbarriers need 8-B alignment");

// Bytes landing on one q_full barrier: Q and dO tiles plus 64 LSE and 64 Dr floats.
constexpr uint32_t kQStageTx = 2u * kQTile + 2u * 256u;
constexpr uint32_t kKvTx = 2u * kKTile;

// q_empty: one arrival per consumer warp (2 warpgroups x 4 warps), each after its own
// wgmma.wait_group retired the last group that read the stage (G4).
constexpr uint32_t kEmptyArrivals = 8;

// Named barriers: 1 = both consumers (dS^T complete), 2 + g = consumer g alone (dQ staging).
constexpr uint32_t kDsBar = 1;
constexpr uint32_t kStageBar = 2;

constexpr float kLog2e = 1.4426950408889634f;

// dQacc: floats per (b, h, query tile) and per warpgroup half.
constexpr int kDqTileFloats = kBM * kD;  // 8192

template <int R>
__device__ __forceinline__ void fence_frag(uint32_t (&f)[R][4]) {
#pragma unroll
  for (int s = 0; s < R; ++s) ptx::fence_regs(f[s]);
}

// X_g Y^T over D = 128 (S^T = K_g Q^T or dP^T = V_g dO^T): 8 k-steps of m64n64k16 SS, both
// operands K-major 128B-swizzled. da: this warpgroup's 64 rows of the K/V tile (box 0);
// db: the Q/dO stage (box 0). k-step kk lives in box kk/4 at +32 B per 16 d; the A boxes are
// 16 KB apart (128 rows) and the B boxes 8 KB (64 rows). scale_d = 0 on the first k-step.
__device__ __forceinline__ void issue_xyT(float (&acc)[32], uint64_t da, uint64_t db) {
#pragma unroll
  for (int kk = 0; kk < 8; ++kk) {
    const uint32_t in_row = static_cast<uint32_t>(kk % 4) * 32u;
    const uint32_t box = static_cast<uint32_t>(kk / 4);
    ptx::wgmma_ss<64, 0, 0>(acc, ptx::desc_advance(da, box * kKBox + in_row),
                            ptx::desc_advance(db, box * kQBox + in_row), kk > 0 ? 1 : 0);
  }
}

// acc[64 keys][128 d] += F[64 keys][64 q] Y[64 q][128 d] (dV += P^T dO, dK += dS^T Q):
// 4 k-steps of m64n128k16 RS. F's k-step s = accumulator registers 8s..8s+7 (queries 16s..);
// Y is the MN-major B: k-step s = query rows 16s.. = +16 * 128 B, the d 64..127 box one LBO
// (= kQBox) further.
__device__ __forceinline__ void issue_rs(float (&acc)[64], const uint32_t (&f)[4][4],
                                         uint64_t db) {
#pragma unroll
  for (int s = 0; s < 4; ++s) {
    ptx::wgmma_rs<128, 1>(acc, f[s], ptx::desc_advance(db, 2048u * static_cast<uint32_t>(s)), 1);
  }
}

// dQ_g[64 q][64 d] = dS[64 q][128 keys] K[128 keys][64g .. 64g+63]: 8 k-steps of m64n64k16 SS.
// A = dS, MN-major (trans-a 1): the dS^T buffer row = key, 64 queries = one 128-B swizzled row,
// k-step s = keys 16s.. = +2048 B. B = K box g, MN-major (trans-b 1), k-step s = +2048 B.
__device__ __forceinline__ void issue_dq(float (&acc)[32], uint64_t da, uint64_t db) {
#pragma unroll
  for (int s = 0; s < 8; ++s) {
    const uint32_t off = 2048u * static_cast<uint32_t>(s);
    ptx::wgmma_ss<64, 1, 1>(acc, ptx::desc_advance(da, off), ptx::desc_advance(db, off),
                            s > 0 ? 1 : 0);
  }
}

// Writes one consumer warpgroup's dQ partial (m64n64 accumulator) to its 16 KB staging buffer,
// chunk c of thread t at (128c + t) * 16 B (consecutive 16 B per warp store: no bank conflicts),
// and adds the buffer into dQacc rows [row, row + 64) of 64 floats with one TMA reduce-add.
// Thread 0 of the warpgroup issues every reduce, so its bulk-group wait covers the previous one:
// the staging buffer is rewritten only after that reduce finished reading it.
__device__ __forceinline__ void store_dq(const float (&dq)[32], float4* stage_t, void* stage,
                                         const CUtensorMap* tm, int row, uint32_t t,
                                         uint32_t bar) {
  if (t == 0) ptx::bulk_wait_group_read<0>();
  ptx::named_bar_sync(bar, 128);
#pragma unroll
  for (int cc = 0; cc < 8; ++cc) {
    stage_t[128 * cc] = make_float4(dq[4 * cc + 0], dq[4 * cc + 1], dq[4 * cc + 2], dq[4 * cc + 3]);
  }
  ptx::fence_proxy_async_smem();  // generic staging stores -> TMA (async proxy) reads
  ptx::named_bar_sync(bar, 128);
  if (t == 0) {
    ptx::tma_reduce_add_2d(tm, stage, 0, row);
    ptx::bulk_commit_group();
  }
}

// Dr[b, h, s] = sum_d dO[b, s, h, d] * O[b, s, h, d], one warp per (b, s, h) row.
__global__ void __launch_bounds__(256) bwd_pre_kernel(const __nv_bfloat16* __restrict__ O,
                                                      const __nv_bfloat16* __restrict__ dO,
                                                      float* __restrict__ Dr, int S, int H,
                                                      long long rows) {
  const long long row = static_cast<long long>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;
  const size_t base = static_cast<size_t>(row) * kD + lane * 4;
  const uint2 o_raw = __ldg(reinterpret_cast<const uint2*>(O + base));
  const uint2 g_raw = __ldg(reinterpret_cast<const uint2*>(dO + base));
  const __nv_bfloat162* o2 = reinterpret_cast<const __nv_bfloat162*>(&o_raw);
  const __nv_bfloat162* g2 = reinterpret_cast<const __nv_bfloat162*>(&g_raw);
  const float2 o0 = __bfloat1622float2(o2[0]), o1 = __bfloat1622float2(o2[1]);
  const float2 g0 = __bfloat1622float2(g2[0]), g1 = __bfloat1622float2(g2[1]);
  float sum = o0.x * g0.x + o0.y * g0.y + o1.x * g1.x + o1.y * g1.y;
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
  if (lane == 0) {
    // row enumerates [B, S, H]; Dr is [B, H, S].
    const int h = static_cast<int>(row % H);
    const long long bs = row / H;
    const int s = static_cast<int>(bs % S);
    const long long b = bs / S;
    Dr[(b * H + h) * S + s] = sum;
  }
}

__global__ void __launch_bounds__(kThreads, 1)
    mha_bwd_causal_d128_kernel(const __grid_constant__ CUtensorMap tmQ,
                               const __grid_constant__ CUtensorMap tmK,
                               const __grid_constant__ CUtensorMap tmV,
                               const __grid_constant__ CUtensorMap tmdO,
                               const __grid_constant__ CUtensorMap tmDQ,
                               const float* __restrict__ LSE, const float* __restrict__ Dr,
                               __nv_bfloat16* __restrict__ dK, __nv_bfloat16* __restrict__ dV,
                               int S, int H, int BH, float scale, float scale_log2) {
  extern __shared__ uint8_t smem_raw[];
  // The dynamic smem base is not guaranteed 1024-aligned: round it up (1 KB extra requested).
  // Offsetting smem_raw itself (instead of casting a rounded integer back to a pointer) keeps
  // the pointers visibly in the shared window, so the dS^T / dQ staging stores and the LSE/Dr
  // loads compile to STS/LDS rather than generic ST/LD.
  uint8_t* sm = smem_raw + ((1024u - (ptx::smem_u32(smem_raw) & 1023u)) & 1023u);
  uint8_t* sK = sm + kOffK;
  uint8_t* sV = sm + kOffV;
  uint8_t* sQ = sm + kOffQ;
  uint8_t* sdO = sm + kOffDO;
  uint8_t* sDS = sm + kOffDS;
  uint8_t* sDQ = sm + kOffDQ;
  float* sLSE = reinterpret_cast<float*>(sm + kOffLSE);
  float* sDR = reinterpret_cast<float*>(sm + kOffDR);
  uint64_t* bars = reinterpret_cast<uint64_t*>(sm + kOffBar);
  uint64_t* kv_full = bars;
  uint64_t* q_full = bars + 1;
  uint64_t* q_empty = bars + 1 + kStages;

  // causal: block -> (kt, b, h). Groups of kHeadGroup heads (the last one may be smaller), each
  // n_kt * group CTAs long; inside a group id = kt * group + head (key tile slower).
  const int n_kt = S / kBN;
  const int n_q = S / kBM;    // query tiles (>= 2)
  const int grp = static_cast<int>(blockIdx.x) / (n_kt * kHeadGroup);
  const int gsize = min(kHeadGroup, BH - grp * kHeadGroup);
  const int in_grp = static_cast<int>(blockIdx.x) - grp * n_kt * kHeadGroup;
  const int kt = in_grp / gsize;  // key tile: 0 (heaviest) first
  const int bh = grp * kHeadGroup + in_grp % gsize;
  const int h = bh % H;
  const int b = bh / H;
  // causal: query tiles 2kt .. n_q-1, the first two with the diagonal (see the header).
  const int q_off = 2 * kt;
  const int n_it = n_q - q_off;  // >= 2

  if (threadIdx.x == 0) {
    ptx::mbar_init(kv_full, 1);
#pragma unroll
    for (int s = 0; s < kStages; ++s) {
      ptx::mbar_init(&q_full[s], 1);
      ptx::mbar_init(&q_empty[s], kEmptyArrivals);
    }
    ptx::fence_mbarrier_init();
    ptx::prefetch_tmap(&tmQ);
    ptx::prefetch_tmap(&tmK);
    ptx::prefetch_tmap(&tmV);
    ptx::prefetch_tmap(&tmdO);
    ptx::prefetch_tmap(&tmDQ);
  }
  __syncthreads();  // barriers initialised before anyone arrives, waits or is targeted by TMA

  const uint32_t wg = ptx::warpgroup_idx();
  if (wg == 0) {
    // ------------------------------------------------------------------ producer warpgroup
    ptx::setmaxnreg_dec<24>();
    if (ptx::warp_idx() == 0 && ptx::elect_one_sync()) {
      // Token coordinates in the flattened [B*S] dimension of the 3-D maps.
      const int tok0 = b * S;
      const int k_tok = tok0 + kt * kBN;
      ptx::mbar_arrive_expect_tx(kv_full, kKvTx);
      ptx::tma_load_3d(sK, &tmK, kv_full, 0, h, k_tok);            // d 0..63
      ptx::tma_load_3d(sK + kKBox, &tmK, kv_full, 64, h, k_tok);   // d 64..127
      ptx::tma_load_3d(sV, &tmV, kv_full, 0, h, k_tok);
      ptx::tma_load_3d(sV + kKBox, &tmV, kv_full, 64, h, k_tok);
      // LSE and Dr rows of this (b, h): [B, H, S] fp32, 64 floats (256 B) per query tile.
      const float* lse_bh = LSE + (static_cast<size_t>(b) * H + h) * S;
      const float* dr_bh = Dr + (static_cast<size_t>(b) * H + h) * S;
      int st = 0;
      uint32_t ph = 0;
      int qt = q_off;
      for (int it = 0; it < n_it; ++it) {  // causal: n_it tiles from 2kt
        // Wait until all 8 consumer warps released this stage (fresh barrier: parity 1 passes).
        ptx::mbar_wait(&q_empty[st], ph ^ 1u);
        ptx::mbar_arrive_expect_tx(&q_full[st], kQStageTx);
        const int q_tok = tok0 + qt * kBM;
        uint8_t* dq = sQ + st * kQTile;
        uint8_t* ddo = sdO + st * kQTile;
        ptx::tma_load_3d(dq, &tmQ, &q_full[st], 0, h, q_tok);
        ptx::tma_load_3d(dq + kQBox, &tmQ, &q_full[st], 64, h, q_tok);
        ptx::tma_load_3d(ddo, &tmdO, &q_full[st], 0, h, q_tok);
        ptx::tma_load_3d(ddo + kQBox, &tmdO, &q_full[st], 64, h, q_tok);
        ptx::bulk_copy_g2s(sLSE + st * 64, lse_bh + qt * kBM, 256u, &q_full[st]);
        ptx::bulk_copy_g2s(sDR + st * 64, dr_bh + qt * kBM, 256u, &q_full[st]);
        if (++st == kStages) { st = 0; ph ^= 1u; }
        ++qt;  // causal: no wrap
      }
    }
    // The other producer threads have nothing to do; no CTA-wide barrier follows.
    return;
  }

  // -------------------------------------------------------------------- consumer warpgroups
  ptx::setmaxnreg_inc<240>();
  const uint32_t g = wg - 1;               // 0 or 1: keys 64g .. 64g+63 of the tile
  const uint32_t t = threadIdx.x % 128u;   // thread in the warpgroup
  const uint32_t warp = t / 32u;
  const uint32_t lane = t % 32u;
  const uint32_t r0 = 16u * warp + lane / 4u;  // accumulator rows r0 and r0 + 8 (contracts §2)
  const uint32_t q4 = lane % 4u;               // accumulator columns 8j + 2 q4 (+1)
  const float c = scale_log2;                  // scale * log2(e)

  // Descriptors that do not change over the loop.
  // S^T / dP^T A operand: this warpgroup's 64 key rows start 64 * 128 B = 8 KB into each box.
  const uint64_t dk_a = ptx::make_desc_kmajor_sw128(sK + g * 8192u);
  const uint64_t dv_a = ptx::make_desc_kmajor_sw128(sV + g * 8192u);
  // dQ B operand: K box g = d columns 64g .. 64g+63, MN-major, N = 64 (one MN block, LBO unused).
  const uint64_t dk_b = ptx::make_desc_mnmajor_sw128(sK + g * kKBox, kKBox);

  // dS^T store addresses: rows (keys) 64g + r0 and 64g + r0 + 8 of the [128][64] bf16 buffer,
  // 128 B per row. Both rows are = r0 = lane/4 (mod 8), so the 128B swizzle XORs the 16-B chunk
  // index with lane/4 in both.
  const uint32_t ds_row0 = (64u * g + r0) * 128u;
  const uint32_t ds_row1 = ds_row0 + 8u * 128u;
  const uint32_t ds_xor = (lane / 4u) << 4;
  // dQ staging: this warpgroup's [64][64] fp32 half, float4 chunk c of thread t at (128c + t)*16.
  float4* dq_stage = reinterpret_cast<float4*>(sDQ + g * kDqHalf) + t;
  // dQacc tensor-map row (64 floats per row) of this warpgroup's half of query tile qt:
  // (((b*H + h) * n_q + qt) * 8192 + g * 4096) / 64.
  const int dq_row_bh = (b * H + h) * n_q * (kDqTileFloats / 64) + static_cast<int>(g) * 64;

  float dk_acc[64];   // dK_g (unscaled), [64 keys][128 d]
  float dv_acc[64];   // dV_g, [64 keys][128 d]
  float s_acc[32];    // S^T, overwritten in place by P^T
  float dp_acc[32];   // dP^T, overwritten in place by dS^T
  float dq_acc[32];   // dQ partial [64 q][64 d] of this query tile
  uint32_t pf[4][4];  // P^T as bf16 RS A-fragments, one [4] per k-step of 16 queries
  uint32_t df[4][4];  // dS^T as bf16 RS A-fragments

#pragma unroll
  for (int i = 0; i < 64; ++i) {
    dk_acc[i] = 0.f;
    dv_acc[i] = 0.f;
  }

  ptx::mbar_wait(kv_full, 0);

  int st = 0;
  uint32_t ph = 0;
  int qt = q_off;
#pragma unroll 1
  for (int it = 0; it < n_it; ++it) {  // causal: n_it tiles from 2kt
    const uint32_t buf = static_cast<uint32_t>(it & 1);
    uint8_t* q_stage = sQ + st * kQTile;
    uint8_t* do_stage = sdO + st * kQTile;
    const float* lse = sLSE + st * 64;
    const float* dr = sDR + st * 64;

    // ---- 1. G1: S^T = K_g Q_i^T, G2: dP^T = V_g dO_i^T ----
    ptx::mbar_wait(&q_full[st], ph);
    ptx::fence_regs(s_acc);
    ptx::fence_regs(dp_acc);
    ptx::wgmma_fence();
    issue_xyT(s_acc, dk_a, ptx::make_desc_kmajor_sw128(q_stage));
    ptx::wgmma_commit();  // G1
    issue_xyT(dp_acc, dv_a, ptx::make_desc_kmajor_sw128(do_stage));
    ptx::wgmma_commit();  // G2

    // ---- 2. P^T = ex2(S^T c - LSE log2e) while G2 runs ----
    ptx::wgmma_wait<1>();  // G1 retired
    ptx::fence_regs(s_acc);
    // causal: mask key > query on the diagonal tiles (it <= g, warp-uniform; see the header).
    // Register 4j+e (e = 0, 1) holds key 64g + r0, query 64it + 8j + 2q4 + e; 4j+2+e key + 8.
    // key > query  <=>  8j + e < r0 + 64(g - it) - 2q4 = lim0 (lim1 = lim0 + 8 for row r0 + 8).
    if (it <= static_cast<int>(g)) {
      const float kNegInf = -INFINITY;
      const int lim0 =
          static_cast<int>(r0) + 64 * (static_cast<int>(g) - it) - 2 * static_cast<int>(q4);
      const int lim1 = lim0 + 8;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        if (8 * j + 0 < lim0) s_acc[4 * j + 0] = kNegInf;
        if (8 * j + 1 < lim0) s_acc[4 * j + 1] = kNegInf;
        if (8 * j + 0 < lim1) s_acc[4 * j + 2] = kNegInf;
        if (8 * j + 1 < lim1) s_acc[4 * j + 3] = kNegInf;
      }
    }
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      // Registers 4j+e (row r0) and 4j+2+e (row r0+8) hold query column 8j + 2 q4 + e.
      const float2 l = *reinterpret_cast<const float2*>(lse + 8 * j + 2 * q4);
      const float n0 = -l.x * kLog2e;
      const float n1 = -l.y * kLog2e;
      s_acc[4 * j + 0] = ptx::ex2_approx(fmaf(s_acc[4 * j + 0], c, n0));
      s_acc[4 * j + 1] = ptx::ex2_approx(fmaf(s_acc[4 * j + 1], c, n1));
      s_acc[4 * j + 2] = ptx::ex2_approx(fmaf(s_acc[4 * j + 2], c, n0));
      s_acc[4 * j + 3] = ptx::ex2_approx(fmaf(s_acc[4 * j + 3], c, n1));
    }
#pragma unroll
    for (int s = 0; s < 4; ++s) {
      pf[s][0] = ptx::pack_bf16x2(s_acc[8 * s + 0], s_acc[8 * s + 1]);  // key r0,   q 2q4, +1
      pf[s][1] = ptx::pack_bf16x2(s_acc[8 * s + 2], s_acc[8 * s + 3]);  // key r0+8, q 2q4, +1
      pf[s][2] = ptx::pack_bf16x2(s_acc[8 * s + 4], s_acc[8 * s + 5]);  // key r0,   q 2q4+8, +9
      pf[s][3] = ptx::pack_bf16x2(s_acc[8 * s + 6], s_acc[8 * s + 7]);  // key r0+8, q 2q4+8, +9
    }

    // ---- 3. G3: dV += P^T dO_i ----
    ptx::fence_regs(dv_acc);
    fence_frag(pf);
    ptx::wgmma_fence();
    issue_rs(dv_acc, pf, ptx::make_desc_mnmajor_sw128(do_stage, kQBox));
    ptx::wgmma_commit();  // G3

    // ---- 4. dS^T = P^T (dP^T - Dr) while G3 runs; store it for the dQ GEMM ----
    ptx::wgmma_wait<1>();  // G2 retired (G3 may still run)
    ptx::fence_regs(dp_acc);
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const float2 d = *reinterpret_cast<const float2*>(dr + 8 * j + 2 * q4);
      dp_acc[4 * j + 0] = s_acc[4 * j + 0] * (dp_acc[4 * j + 0] - d.x);
      dp_acc[4 * j + 1] = s_acc[4 * j + 1] * (dp_acc[4 * j + 1] - d.y);
      dp_acc[4 * j + 2] = s_acc[4 * j + 2] * (dp_acc[4 * j + 2] - d.x);
      dp_acc[4 * j + 3] = s_acc[4 * j + 3] * (dp_acc[4 * j + 3] - d.y);
    }
#pragma unroll
    for (int s = 0; s < 4; ++s) {
      df[s][0] = ptx::pack_bf16x2(dp_acc[8 * s + 0], dp_acc[8 * s + 1]);
      df[s][1] = ptx::pack_bf16x2(dp_acc[8 * s + 2], dp_acc[8 * s + 3]);
      df[s][2] = ptx::pack_bf16x2(dp_acc[8 * s + 4], dp_acc[8 * s + 5]);
      df[s][3] = ptx::pack_bf16x2(dp_acc[8 * s + 6], dp_acc[8 * s + 7]);
    }
    // Store dS^T[key][q] bf16 into buffer `buf`: df[s][0] = (key r0, q 16s + 2q4 .. +1),
    // df[s][1] = (key r0+8, same q), df[s][2] / df[s][3] = the same rows at q + 8. The byte
    // column 2q = 32s + 4q4 (+16) sits in 16-B chunk 2s (+1), XORed with the row's lane/4.
    // Each warp store covers 8 rows with 8 distinct chunks: all 32 banks, no conflict.
    // Reuse of this buffer (written two iterations ago): both consumers' G5 that read it retired
    // before each of them arrived at the kDsBar barrier of the previous iteration, which this
    // warpgroup has passed.
    {
      uint8_t* ds = sDS + buf * kDsBytes;
#pragma unroll
      for (int s = 0; s < 4; ++s) {
        const uint32_t col0 = ((32u * s + 4u * q4) ^ ds_xor);
        const uint32_t col1 = ((32u * s + 16u + 4u * q4) ^ ds_xor);
        *reinterpret_cast<uint32_t*>(ds + ds_row0 + col0) = df[s][0];
        *reinterpret_cast<uint32_t*>(ds + ds_row1 + col0) = df[s][1];
        *reinterpret_cast<uint32_t*>(ds + ds_row0 + col1) = df[s][2];
        *reinterpret_cast<uint32_t*>(ds + ds_row1 + col1) = df[s][3];
      }
    }
    ptx::fence_proxy_async_smem();  // generic dS^T stores -> wgmma (async proxy) reads

    // ---- 5. G4: dK += dS^T Q_i ----
    ptx::fence_regs(dk_acc);
    fence_frag(df);
    ptx::wgmma_fence();
    issue_rs(dk_acc, df, ptx::make_desc_mnmajor_sw128(q_stage, kQBox));
    ptx::wgmma_commit();  // G4

    // ---- 6. G5: dQ_i[:, 64g..] = dS K_j[:, 64g..] once both halves of dS^T are stored ----
    ptx::named_bar_sync(kDsBar, 256);
    ptx::fence_regs(dq_acc);
    ptx::wgmma_fence();
    issue_dq(dq_acc, ptx::make_desc_mnmajor_sw128(sDS + buf * kDsBytes, kDsBytes), dk_b);
    ptx::wgmma_commit();  // G5

    // ---- 7. release the stage once G3 and G4 (the last readers of Q_i and dO_i) retired ----
    ptx::wgmma_wait<1>();  // G3, G4 retired (G5 may still run)
    ptx::fence_regs(dv_acc);
    ptx::fence_regs(dk_acc);
    fence_frag(pf);  // keeps the fragments unclobbered until their GEMMs retired
    fence_frag(df);
    if (lane == 0) ptx::mbar_arrive(&q_empty[st]);
    if (++st == kStages) { st = 0; ph ^= 1u; }

    // ---- 8. dQ partial -> smem staging -> TMA reduce-add into dQacc ----
    ptx::wgmma_wait<0>();  // G5 retired
    ptx::fence_regs(dq_acc);
    // (Deferring this store into the next iteration, under G1/G2, keeps dq_acc live across
    // them: ptxas 13.0 then spills 128 B and serialises the wgmmas (C7512, C7517).)
    store_dq(dq_acc, dq_stage, sDQ + g * kDqHalf, &tmDQ, dq_row_bh + qt * (kDqTileFloats / 64), t,
             kStageBar + g);
    ++qt;  // causal: no wrap
  }

  // ---- epilogue: dK = scale * dK_acc, dV; bf16 straight from registers ----
  const size_t tok_stride = static_cast<size_t>(H) * kD;
  const int key0 = kt * kBN + static_cast<int>(64u * g + r0);  // token index within the batch
  const size_t off0 = (static_cast<size_t>(b) * S + key0) * tok_stride + static_cast<size_t>(h) * kD;
  const size_t off1 = off0 + 8 * tok_stride;
#pragma unroll
  for (int j = 0; j < 16; ++j) {
    const int col = 8 * j + 2 * static_cast<int>(q4);
    *reinterpret_cast<uint32_t*>(dK + off0 + col) =
        ptx::pack_bf16x2(dk_acc[4 * j + 0] * scale, dk_acc[4 * j + 1] * scale);
    *reinterpret_cast<uint32_t*>(dK + off1 + col) =
        ptx::pack_bf16x2(dk_acc[4 * j + 2] * scale, dk_acc[4 * j + 3] * scale);
    *reinterpret_cast<uint32_t*>(dV + off0 + col) =
        ptx::pack_bf16x2(dv_acc[4 * j + 0], dv_acc[4 * j + 1]);
    *reinterpret_cast<uint32_t*>(dV + off1 + col) =
        ptx::pack_bf16x2(dv_acc[4 * j + 2], dv_acc[4 * j + 3]);
  }
  // The last reduce must be complete before the CTA (and its shared memory) goes away.
  if (t == 0) ptx::bulk_wait_group<0>();
}

// dQ[b, s, h, d] = bf16(scale * dQacc) from the fragment layout. Thread = one float4 of dQacc:
// index = ((((b*H + h) * n_q + qt) * 2 + g) * 8 + c) * 128 + t holds registers 4c..4c+3 of
// thread t of consumer g: (row r0, col 8c + 2q4 + e) for e = 0, 1, then (row r0 + 8, same cols),
// r0 = 16 (t/32) + (t%32)/4, q4 = t%4, column offset 64g, row offset 64 qt.
__global__ void __launch_bounds__(256) bwd_post_kernel(const float4* __restrict__ acc,
                                                       __nv_bfloat16* __restrict__ dQ, int S,
                                                       int H, float scale, long long n4) {
  const long long idx = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= n4) return;
  const int t = static_cast<int>(idx % 128);
  const int cc = static_cast<int>((idx / 128) % 8);
  const int g = static_cast<int>((idx / 1024) % 2);
  const long long tile = idx / 2048;
  const int n_q = S / kBM;
  const int qt = static_cast<int>(tile % n_q);
  const long long bh = tile / n_q;
  const int h = static_cast<int>(bh % H);
  const long long b = bh / H;
  const int r0 = 16 * (t / 32) + (t % 32) / 4;
  const int col = 64 * g + 8 * cc + 2 * (t % 4);
  const int row = qt * kBM + r0;
  const float4 v = acc[idx];
  const size_t tok_stride = static_cast<size_t>(H) * kD;
  __nv_bfloat16* p0 =
      dQ + (static_cast<size_t>(b) * S + row) * tok_stride + static_cast<size_t>(h) * kD + col;
  *reinterpret_cast<uint32_t*>(p0) = ptx::pack_bf16x2(v.x * scale, v.y * scale);
  *reinterpret_cast<uint32_t*>(p0 + 8 * tok_stride) = ptx::pack_bf16x2(v.z * scale, v.w * scale);
}

// 3-D tensor map over a [B, S, H, 128] bf16 tensor: dims {128, H, B*S}, strides {256 B, H*256 B},
// box {64, 1, rows}, 128B swizzle.
CUresult make_qkv_map(CUtensorMap* map, const __nv_bfloat16* p, int B, int S, int H,
                      uint32_t rows) {
  return ptx::make_tmap_3d(map, p, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, kD,
                           static_cast<uint64_t>(H), static_cast<uint64_t>(B) * S,
                           static_cast<uint64_t>(kD) * 2, static_cast<uint64_t>(H) * kD * 2, 64,
                           1, rows, CU_TENSOR_MAP_SWIZZLE_128B);
}

}  // namespace

extern "C" int mha_bwd(const __nv_bfloat16* Q, const __nv_bfloat16* K, const __nv_bfloat16* V,
                       const __nv_bfloat16* O, const __nv_bfloat16* dO, const float* LSE,
                       __nv_bfloat16* dQ, __nv_bfloat16* dK, __nv_bfloat16* dV, int B, int S,
                       int H, int D, cudaStream_t stream) {
  if (D != kD || B < 0 || S < 0 || H < 0) return static_cast<int>(cudaErrorInvalidValue);
  if (B == 0 || S == 0 || H == 0) return static_cast<int>(cudaGetLastError());
  // Key tiles of 128 and query tiles of 64 must not straddle batches in the flattened B*S maps.
  if (S % kBN != 0) return static_cast<int>(cudaErrorInvalidValue);
  // causal: 1-D grid, S/128 * B * H CTAs, and int arithmetic on the block index.
  if (static_cast<long long>(S / kBN) * B * H > 0x7fffffffLL)
    return static_cast<int>(cudaErrorInvalidValue);
  // TMA / bulk-copy sources need 16-B alignment (LSE rows: 256-B steps from the base); the
  // epilogues store 4-B pairs.
  const uintptr_t align = reinterpret_cast<uintptr_t>(Q) | reinterpret_cast<uintptr_t>(K) |
                          reinterpret_cast<uintptr_t>(V) | reinterpret_cast<uintptr_t>(O) |
                          reinterpret_cast<uintptr_t>(dO) | reinterpret_cast<uintptr_t>(LSE) |
                          reinterpret_cast<uintptr_t>(dQ) | reinterpret_cast<uintptr_t>(dK) |
                          reinterpret_cast<uintptr_t>(dV);
  if (align % 16 != 0) return static_cast<int>(cudaErrorInvalidValue);
  const long long rows = static_cast<long long>(B) * S * H;  // token rows = Dr entries
  // dQacc rows of 64 floats (the reduce map's outer dimension) must fit the int32 coordinate.
  if (rows * 2 > 0x7fffffffLL) return static_cast<int>(cudaErrorInvalidValue);

  // Host state kept across calls: the smem opt-in and the scratch (dQacc, then Dr).
  static bool smem_set = false;
  static float* scratch = nullptr;
  static size_t scratch_floats = 0;
  cudaError_t err;
  if (!smem_set) {
    if ((err = ptx::set_max_dynamic_smem(mha_bwd_causal_d128_kernel,
                                         static_cast<int>(kSmemBytes))) != cudaSuccess)
      return static_cast<int>(err);
    smem_set = true;
  }
  const size_t acc_floats = static_cast<size_t>(rows) * kD;
  const size_t need = acc_floats + static_cast<size_t>(rows);
  if (need > scratch_floats) {
    if (scratch != nullptr) cudaFree(scratch);  // first call (or a bigger problem) only
    scratch = nullptr;
    scratch_floats = 0;
    if ((err = cudaMalloc(&scratch, need * sizeof(float))) != cudaSuccess)
      return static_cast<int>(err);
    scratch_floats = need;
  }
  float* dq_acc = scratch;
  float* dr = scratch + acc_floats;  // acc_floats is a multiple of 128: 16-B aligned rows

  CUtensorMap tmQ, tmK, tmV, tmdO, tmDQ;
  if (make_qkv_map(&tmQ, Q, B, S, H, kBM) != CUDA_SUCCESS ||
      make_qkv_map(&tmdO, dO, B, S, H, kBM) != CUDA_SUCCESS ||
      make_qkv_map(&tmK, K, B, S, H, kBN) != CUDA_SUCCESS ||
      make_qkv_map(&tmV, V, B, S, H, kBN) != CUDA_SUCCESS) {
    return static_cast<int>(cudaErrorInvalidValue);
  }
  // dQacc as a 2-D fp32 [rows*2][64] tensor, box {64, 64} = one warpgroup's 16 KB half-tile,
  // no swizzle (the staging buffer is the same 16 KB, linear).
  if (ptx::make_tmap_2d(&tmDQ, dq_acc, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 4, 64,
                        static_cast<uint64_t>(rows) * 2, 256, 64, 64,
                        CU_TENSOR_MAP_SWIZZLE_NONE) != CUDA_SUCCESS) {
    return static_cast<int>(cudaErrorInvalidValue);
  }

  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(kD)));
  const float scale_log2 = static_cast<float>(1.4426950408889634 / std::sqrt(static_cast<double>(kD)));

  if ((err = cudaMemsetAsync(dq_acc, 0, acc_floats * sizeof(float), stream)) != cudaSuccess)
    return static_cast<int>(err);
  constexpr int kRowsPerBlock = 256 / 32;
  bwd_pre_kernel<<<static_cast<unsigned>((rows + kRowsPerBlock - 1) / kRowsPerBlock), 256, 0,
                   stream>>>(O, dO, dr, S, H, rows);
  if ((err = cudaGetLastError()) != cudaSuccess) return static_cast<int>(err);

  // causal: 1-D grid of S/128 * B * H CTAs, decoded in the kernel (groups of kHeadGroup heads).
  const int BH = B * H;
  const dim3 grid(static_cast<unsigned>(S / kBN) * static_cast<unsigned>(BH));
  mha_bwd_causal_d128_kernel<<<grid, kThreads, kSmemBytes, stream>>>(
      tmQ, tmK, tmV, tmdO, tmDQ, LSE, dr, dK, dV, S, H, BH, scale, scale_log2);
  if ((err = cudaGetLastError()) != cudaSuccess) return static_cast<int>(err);

  const long long n4 = static_cast<long long>(acc_floats / 4);
  bwd_post_kernel<<<static_cast<unsigned>((n4 + 255) / 256), 256, 0, stream>>>(
      reinterpret_cast<const float4*>(dq_acc), dQ, S, H, scale, n4);
  return static_cast<int>(cudaGetLastError());
}
