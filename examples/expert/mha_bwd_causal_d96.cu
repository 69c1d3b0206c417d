// Expert CAUSAL attention backward, head_dim 96, FlashAttention-3 style, for Hopper (sm_90a).
// H200, 2026-12-02, `ptxgym eval PTX-H100-MHABwdCausal-d96` defaults: PASSED, qualified, 1.109 ms against
// cuDNN's 1.389 ms (1.252x; docs/benchmarks.md, twentieth session).
//
// Derived from examples/expert/mha_bwd_d96.cu (non-causal) with the causal changes of
// examples/expert/mha_bwd_causal_d128.cu, applied the same way; every place they change
// is marked "causal" (the rest of this header is the d96 kernel's, unchanged):
//   * causal, tile skipping: key tile kt (keys 128kt .. 128kt+127) is attended only by queries
//     >= 128kt, i.e. 64-row query tiles qt >= 2kt. The CTA visits qt = 2kt, 2kt+1, .., S/64-1
//     in that order (n_it = S/64 - 2kt >= 2 tiles, always even; producer and consumers share
//     the count). Query tiles before 2kt get no dQ from this CTA.
//   * causal, mask: only iterations it = 0, 1 contain a key > query pair, and only where
//     it <= g: (g, it) = (0, 0) and (1, 1) are diagonal tiles, (1, 0) is ALL masked (still
//     computed: one code path; G5 reads a zero half), (0, 1) has no masked pair. Masked scores
//     are set to -inf before the exp: ex2(-inf) = +0, dS^T = 0 * finite = 0. The S^T tile is
//     [64 keys][64 queries] whatever D is, so the register predicate is the causal d128 kernel's.
//   * causal, G5 alternation: warpgroup it & 1 still runs G5 (the iteration index, not the query
//     tile), so over the even n_it each warpgroup runs G5 on exactly half of its CTA's tiles.
//   * causal, LSE: the causal forward's; every query row keeps its own key, so it is finite.
//   * causal, CTA order: 1-D grid cut into groups of kHeadGroup (b, h) heads, the key tile the
//     slower index inside a group (heaviest kt = 0 first), as in the causal d128 kernel.
//   * causal, no query stagger (kStaggerQ removed): the CTAs of a head already start at 2kt.
//
//   Q, K, V, O, dO, dQ, dK, dV: [B, S, H, 96] bf16 (D contiguous; one head's consecutive tokens
//   are H*96 elements apart);  LSE: [B, H, S] fp32, natural log, CAUSAL, scale = 1/sqrt(96).
//   P = exp(scale Q K^T - LSE) for key j <= query i, 0 otherwise,  Dr = rowsum(dO * O),
//   dS = P * (dO V^T - Dr),  dV = P^T dO,  dK = scale dS^T Q,  dQ = scale dS K.
//   S must be a multiple of 128 (cudaErrorInvalidValue otherwise).
//
// Derived from examples/expert/mha_bwd_d128.cu with the smallest changes; every changed
// place is marked "d96". The structure (pre kernel, memset, main kernel with 1 producer + 2
// consumer warpgroups keeping dK_g/dV_g in registers, one dS^T barrier per tile, double-buffered
// dS^T, fp32 dQ through a TMA reduce-add, post kernel) is the d128 kernel's. The d-layout is the
// one of the GPU-verified forward examples/expert/mha_fwd_d96.cu; the dQ split is the one of
// mha_bwd_d64.cu. What changes:
//   * d96, boxes: a 96-wide row is 192 B, 1.5 atoms of the 128B swizzle, so every tile is THREE
//     32-wide TMA boxes with CU_TENSOR_MAP_SWIZZLE_64B (64-B rows, d 0-31 | 32-63 | 64-95, one
//     after another, nothing padded), as in mha_fwd_d96.cu (its header explains why not padding
//     to 128 and not a 64 + 32 split). K, V: 3 x [128][32] = 3 x 8 KB; Q, dO: 3 x [64][32] =
//     3 x 4 KB. Tensor maps {96, H, B*S}, strides {192 B, H*192 B}, box {32, 1, rows}.
//   * d96, descriptors of Q, K, V, dO: layout type 2 (64B swizzle, Swizzle<2,4,3>, period 512 B;
//     every box starts on a 1024-B boundary, so base_offset = 0).
//     K-major (G1/G2 A and B): SBO = 8 rows x 64 B = 512, LBO unused; k-step kk (16 d) = box kk/2
//     (+8 KB in K/V, +4 KB in Q/dO) + 32 B x (kk % 2); 6 k-steps. Warpgroup g's 64 key rows start
//     64 x 64 B = 4 KB into each K/V box.
//     MN-major (G3/G4 B = dO/Q, G5 B = K): N = d = 96 = three 32-element atoms, LBO = one box
//     (4 KB for dO/Q, 8 KB for K), SBO = 512; k-step of 16 rows = +1024 B.
//   * d96, G1/G2 (S^T = K_g Q^T, dP^T = V_g dO^T): m64n64k16 SS, 6 k-steps.
//   * d96, G3/G4 (dV += P^T dO, dK += dS^T Q): m64n96k16 RS (the forward's P V shape), 4 k-steps.
//     dK_g and dV_g are 48 fp32 registers each (64 at d128).
//   * d96, G5 (dQ_i = dS K_j, [64 q][96 d] over 128 keys): the d128 split by d (warpgroup g takes
//     d columns 64g..) would need N = 48, which the pack does not provide and which is not a
//     canonical 64B-swizzle MN layout (1.5 atoms). So, as in the d64 kernel, ONE warpgroup
//     computes the whole tile, alternating g = it & 1: m64n96k16 SS, trans-a/trans-b, 8 k-steps
//     over the 128 keys; A = dS MN-major from the (128B-swizzled, unchanged) dS^T buffer, B = the
//     K tile MN-major (64B swizzle: A and B descriptors carry their own swizzle mode). The other
//     warpgroup skips G5 and its staging. 24 KB reduced into dQacc per tile (the d128 kernel's
//     bytes per FLOP). Both warpgroups still sync (not just arrive) at the dS^T barrier (an
//     arrive-only warpgroup could run a tile ahead and arrive twice in one generation).
//   * d96, dQacc: per (b, h, query tile) 6144 floats, chunk c (registers 4c..4c+3 of the m64n96
//     accumulator, c < 12) at +512c, thread t at +4t; the staging buffer (24 KB per warpgroup) is
//     one [96][64] fp32 TMA box of a 2-D map {64, B*S*H*3/2}.
//   * d96, stages: kStages = 3 (a stage is 24 KB: 72 KB in flight, the d128 kernel's 2 x 32 KB and
//     the d64 kernel's 4 x 16 KB are 64 KB; 4 stages would need 232,520 B, 72 B over the limit).
//     Registers at the G5 issue: dK/dV 48 + 48, P^T/dS^T fragments 16 + 16, dQ 48 (S^T and dP^T
//     are dead by then); under G2-G4: dK/dV 96 + S^T/dP^T 64 + fragments 32.
//   * d96, pre kernel: one warp per row, 3 elements per lane (a bf16 pair for every lane, a
//     second pair for lanes 0-15).
//
// Three kernels on `stream` (packs/h100/scheduling.md §3), as at d128:
//   1. bwd_pre_kernel: Dr[b, h, s] = sum_d dO * O (fp32); dQacc zeroed by cudaMemsetAsync.
//   2. mha_bwd_causal_d96_kernel, one CTA per (128-key tile, head, batch), 1-D grid (causal:
//      see "CTA order" above), query tiles i >= 2kt only: WG0
//      producer (setmaxnreg.dec 24; one thread loads K_j, V_j once on kv_full, then Q_i, dO_i,
//      LSE_i, Dr_i per 64-query tile through the kStages ring), WG1/WG2 consumers (setmaxnreg.inc
//      240; consumer g owns keys 64g..64g+63, keys are the wgmma M dimension):
//        G1  S^T  = K_g Q_i^T      m64n64k16 SS          P^T = ex2(S^T c - LSE log2e)  (under G2)
//        G2  dP^T = V_g dO_i^T     m64n64k16 SS
//        G3  dV  += P^T dO_i       m64n96k16 RS          dS^T = P^T (dP^T - Dr) -> regs + smem
//        G4  dK  += dS^T Q_i       m64n96k16 RS          (dS^T math and store under G3)
//            named barrier over both consumers: the whole [128 keys][64 q] dS^T is in smem
//        G5  dQ_i = dS K_j         m64n96k16 SS tnspA tnspB, warpgroup it & 1 only
//   3. bwd_post_kernel: dQ = bf16(scale * dQacc) in [B, S, H, 96], one float4 per thread.
//
// Shared memory (from a 1024-aligned base): K 24 KB + V 24 KB + kStages x (Q 12 KB + dO 12 KB)
// + dS^T 2 x 16 KB + dQ staging 2 x 24 KB + kStages x 512 B (LSE, Dr) + mbarriers; kStages = 3:
// 206,392 B + 1 KB alignment slack = 207,416 B.
//
// Scratch (allocated once, grown on demand, kept across calls): dQacc (B*H*S*96 fp32) and Dr
// (B*H*S fp32).

#include "ptxgym_h100.cuh"

#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cstdint>
#include <cmath>

namespace {

constexpr int kD = 96;         // head dimension (fixed; d96)
constexpr int kBN = 128;       // keys per CTA: 2 consumer warpgroups x 64
constexpr int kBM = 64;        // queries per streamed tile
constexpr int kStages = 3;     // d96: depth of the (Q, dO, LSE, Dr) ring (2 at d128, 4 at d64)
constexpr int kThreads = 384;  // producer WG + 2 consumer WGs
// causal: (b, h) heads per group of the CTA order (key tile slower than head inside a group).
constexpr int kHeadGroup = 4;
static_assert(kBN == 2 * kBM, "causal: the diagonal logic assumes 2 query tiles per key tile");

// d96: TMA boxes are [rows][32 bf16] = rows x 64 B, 64B-swizzled; a tile is 3 boxes (d 0-31,
// 32-63, 64-95) one after the other.
constexpr int kBoxD = 32;                           // d elements per box row
constexpr int kNumBoxes = kD / kBoxD;               // 3
constexpr uint32_t kRowBytes = kBoxD * 2u;          // 64 B: one swizzled row
constexpr uint32_t kSbo = 8u * kRowBytes;           // 512 B between 8-row groups
constexpr uint32_t kKBox = 128u * kRowBytes;        // K/V box: 128 keys x 32 d = 8 KB
constexpr uint32_t kKTile = kNumBoxes * kKBox;      // K or V tile: 24 KB
constexpr uint32_t kQBox = 64u * kRowBytes;         // Q/dO box: 64 queries x 32 d = 4 KB
constexpr uint32_t kQTile = kNumBoxes * kQBox;      // Q or dO tile: 12 KB
constexpr uint32_t kDsBytes = 128u * 128u;          // dS^T buffer [128 keys][64 q] bf16 = 16 KB
constexpr uint32_t kDqTile = 64u * kD * 4u;         // d96: the whole dQ partial [64 q][96 d] fp32

// Byte offsets from the 1024-aligned base. Every operand box starts on a 1024-B boundary, so the
// swizzle phase of TMA / the dS^T stores and wgmma agree (descriptor base_offset = 0).
constexpr uint32_t kOffK = 0;
constexpr uint32_t kOffV = kOffK + kKTile;
constexpr uint32_t kOffQ = kOffV + kKTile;                 // stage s at + s * kQTile
constexpr uint32_t kOffDO = kOffQ + kStages * kQTile;      // stage s at + s * kQTile
constexpr uint32_t kOffDS = kOffDO + kStages * kQTile;     // buffer (it & 1) at + buf * kDsBytes
constexpr uint32_t kOffDQ = kOffDS + 2 * kDsBytes;         // consumer g at + g * kDqTile
constexpr uint32_t kOffLSE = kOffDQ + 2 * kDqTile;         // stage s: 64 floats at + s * 256
constexpr uint32_t kOffDR = kOffLSE + kStages * 256;       // stage s: 64 floats at + s * 256
constexpr uint32_t kOffBar = kOffDR + kStages * 256;
constexpr uint32_t kNumBars = 1 + 2 * kStages;             // kv_full, q_full[], q_empty[]
constexpr uint32_t kSmemBytes = kOffBar + 8 * kNumBars + 1024;  // +1 KB to round the base up
static_assert(kSmemBytes <= 232448, "dynamic shared memory over the 227 KB limit");
static_assert(kKBox % 1024 == 0 && kQBox % 1024 == 0 && kOffDQ % 1024 == 0 &&
                  kOffDS % 1024 == 0 && kOffQ % 1024 == 0 && kOffDO % 1024 == 0,
              "operand boxes must be 1024-B aligned");
static_assert(kOffBar % 8 == 0, "mbarriers need 8-B alignment");

// Bytes landing on one q_full barrier: Q and dO tiles (3 boxes each) plus 64 LSE and 64 Dr floats.
constexpr uint32_t kQStageTx = 2u * kQTile + 2u * 256u;
constexpr uint32_t kKvTx = 2u * kKTile;

// q_empty: one arrival per consumer warp (2 warpgroups x 4 warps), each after its own
// wgmma.wait_group retired the last group that read the stage (G4).
constexpr uint32_t kEmptyArrivals = 8;

// Named barriers: 1 = both consumers (dS^T complete), 2 + g = consumer g alone (dQ staging).
constexpr uint32_t kDsBar = 1;
constexpr uint32_t kStageBar = 2;

constexpr float kLog2e = 1.4426950408889634f;

// dQacc: floats per (b, h, query tile); d96: one warpgroup writes all of it.
constexpr int kDqTileFloats = kBM * kD;  // 6144 = 96 rows of the 64-float reduce map
constexpr int kDqChunks = kD / 8;        // 12 float4 chunks per thread (m64n96 accumulator)

template <int R>
__device__ __forceinline__ void fence_frag(uint32_t (&f)[R][4]) {
#pragma unroll
  for (int s = 0; s < R; ++s) ptx::fence_regs(f[s]);
}

// d96: 64B-swizzle descriptors (layout type 2). K-major: SBO 512, LBO unused (16 -> field 1).
// MN-major: LBO = one box (the next 32-wide d block), SBO 512 between 8-row groups along K.
__device__ __forceinline__ uint64_t make_desc_kmajor_sw64(const void* smem_box) {
  return ptx::make_smem_desc(smem_box, ptx::kSwizzle64B, 16, kSbo);
}
__device__ __forceinline__ uint64_t make_desc_mnmajor_sw64(const void* smem_tile,
                                                           uint32_t box_bytes) {
  return ptx::make_smem_desc(smem_tile, ptx::kSwizzle64B, box_bytes, kSbo);
}

// X_g Y^T over D = 96 (S^T = K_g Q^T or dP^T = V_g dO^T): d96: 6 k-steps of m64n64k16 SS, both
// operands K-major 64B-swizzled. da: this warpgroup's 64 rows of the K/V tile (box 0); db: the
// Q/dO stage (box 0). k-step kk lives in box kk/2 at +32 B x (kk % 2) inside the 64-B row; the
// A boxes are 8 KB apart (128 rows) and the B boxes 4 KB (64 rows). scale_d = 0 on the first
// k-step.
__device__ __forceinline__ void issue_xyT(float (&acc)[32], uint64_t da, uint64_t db) {
#pragma unroll
  for (int kk = 0; kk < kD / 16; ++kk) {
    const uint32_t in_row = static_cast<uint32_t>(kk % 2) * 32u;
    const uint32_t box = static_cast<uint32_t>(kk / 2);
    ptx::wgmma_ss<64, 0, 0>(acc, ptx::desc_advance(da, box * kKBox + in_row),
                            ptx::desc_advance(db, box * kQBox + in_row), kk > 0 ? 1 : 0);
  }
}

// acc[64 keys][96 d] += F[64 keys][64 q] Y[64 q][96 d] (dV += P^T dO, dK += dS^T Q):
// d96: 4 k-steps of m64n96k16 RS. F's k-step s = accumulator registers 8s..8s+7 (queries 16s..);
// Y is the MN-major B: k-step s = query rows 16s.. = +16 x 64 B = +1024 B; the d 32-63 and 64-95
// boxes are one and two LBO (= kQBox) further.
__device__ __forceinline__ void issue_rs(float (&acc)[48], const uint32_t (&f)[4][4],
                                         uint64_t db) {
#pragma unroll
  for (int s = 0; s < 4; ++s) {
    ptx::wgmma_rs<96, 1>(acc, f[s],
                         ptx::desc_advance(db, 16u * kRowBytes * static_cast<uint32_t>(s)), 1);
  }
}

// dQ[64 q][96 d] = dS[64 q][128 keys] K[128 keys][96 d]: d96: 8 k-steps of m64n96k16 SS.
// A = dS, MN-major (trans-a 1), 128B swizzle: the dS^T buffer row = key, 64 queries = one 128-B
// swizzled row, k-step s = keys 16s.. = +2048 B. B = the K tile, MN-major (trans-b 1), 64B
// swizzle: N = 96 = three 32-wide boxes (LBO = kKBox), k-step s = 16 keys = +1024 B.
__device__ __forceinline__ void issue_dq(float (&acc)[48], uint64_t da, uint64_t db) {
#pragma unroll
  for (int s = 0; s < 8; ++s) {
    const uint32_t ss = static_cast<uint32_t>(s);
    ptx::wgmma_ss<96, 1, 1>(acc, ptx::desc_advance(da, 2048u * ss),
                            ptx::desc_advance(db, 16u * kRowBytes * ss), s > 0 ? 1 : 0);
  }
}

// Writes the G5 warpgroup's dQ tile (m64n96 accumulator) to its 24 KB staging buffer, chunk c of
// thread t at (128c + t) * 16 B (consecutive 16 B per warp store: no bank conflicts), and adds the
// buffer into dQacc rows [row, row + 96) of 64 floats with one TMA reduce-add.
// Thread 0 of the warpgroup issues every reduce, so its bulk-group wait covers the previous one:
// the staging buffer is rewritten only after that reduce finished reading it.
__device__ __forceinline__ void store_dq(const float (&dq)[48], float4* stage_t, void* stage,
                                         const CUtensorMap* tm, int row, uint32_t t,
                                         uint32_t bar) {
  if (t == 0) ptx::bulk_wait_group_read<0>();
  ptx::named_bar_sync(bar, 128);
#pragma unroll
  for (int cc = 0; cc < kDqChunks; ++cc) {
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
// d96: 48 bf16 pairs per row: every lane takes pair `lane` (d 0..63), lanes 0..15 also pair
// 32 + lane (d 64..95); 4-B loads, coalesced.
__global__ void __launch_bounds__(256) bwd_pre_kernel(const __nv_bfloat16* __restrict__ O,
                                                      const __nv_bfloat16* __restrict__ dO,
                                                      float* __restrict__ Dr, int S, int H,
                                                      long long rows) {
  const long long row = static_cast<long long>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;
  const unsigned int* o_row = reinterpret_cast<const unsigned int*>(O + static_cast<size_t>(row) * kD);
  const unsigned int* g_row =
      reinterpret_cast<const unsigned int*>(dO + static_cast<size_t>(row) * kD);
  unsigned int o_raw = __ldg(o_row + lane);
  unsigned int g_raw = __ldg(g_row + lane);
  float2 o0 = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&o_raw));
  float2 g0 = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&g_raw));
  float sum = o0.x * g0.x + o0.y * g0.y;
  if (lane < 16) {
    o_raw = __ldg(o_row + 32 + lane);
    g_raw = __ldg(g_row + 32 + lane);
    o0 = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&o_raw));
    g0 = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&g_raw));
    sum += o0.x * g0.x + o0.y * g0.y;
  }
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
    mha_bwd_causal_d96_kernel(const __grid_constant__ CUtensorMap tmQ,
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
  const int n_q = S / kBM;    // query tiles (>= 2, even)
  const int grp = static_cast<int>(blockIdx.x) / (n_kt * kHeadGroup);
  const int gsize = min(kHeadGroup, BH - grp * kHeadGroup);
  const int in_grp = static_cast<int>(blockIdx.x) - grp * n_kt * kHeadGroup;
  const int kt = in_grp / gsize;  // key tile: 0 (heaviest) first
  const int bh = grp * kHeadGroup + in_grp % gsize;
  const int h = bh % H;
  const int b = bh / H;
  // causal: query tiles 2kt .. n_q-1, the first two with the diagonal (see the header).
  const int q_off = 2 * kt;
  const int n_it = n_q - q_off;  // >= 2, even

  // ---- 0. barrier initialisation (one thread), then a CTA-wide barrier ----
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
#pragma unroll
      for (int x = 0; x < kNumBoxes; ++x) {  // d96: 3 boxes of 32 d per tile
        ptx::tma_load_3d(sK + x * kKBox, &tmK, kv_full, x * kBoxD, h, k_tok);
        ptx::tma_load_3d(sV + x * kKBox, &tmV, kv_full, x * kBoxD, h, k_tok);
      }
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
#pragma unroll
        for (int x = 0; x < kNumBoxes; ++x) {  // d96: 3 boxes of 32 d per tile
          ptx::tma_load_3d(dq + x * kQBox, &tmQ, &q_full[st], x * kBoxD, h, q_tok);
          ptx::tma_load_3d(ddo + x * kQBox, &tmdO, &q_full[st], x * kBoxD, h, q_tok);
        }
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
  // S^T / dP^T A operand: d96: this warpgroup's 64 key rows start 64 * 64 B = 4 KB into each box.
  const uint64_t dk_a = make_desc_kmajor_sw64(sK + g * 64u * kRowBytes);
  const uint64_t dv_a = make_desc_kmajor_sw64(sV + g * 64u * kRowBytes);
  // dQ B operand: d96: the whole K tile (d 0..95 = 3 boxes, LBO = one box), MN-major.
  const uint64_t dk_b = make_desc_mnmajor_sw64(sK, kKBox);

  // dS^T store addresses: rows (keys) 64g + r0 and 64g + r0 + 8 of the [128][64] bf16 buffer,
  // 128 B per row. Both rows are = r0 = lane/4 (mod 8), so the 128B swizzle XORs the 16-B chunk
  // index with lane/4 in both. (Unchanged from d128: the buffer's width is the 64 queries.)
  const uint32_t ds_row0 = (64u * g + r0) * 128u;
  const uint32_t ds_row1 = ds_row0 + 8u * 128u;
  const uint32_t ds_xor = (lane / 4u) << 4;
  // dQ staging: this warpgroup's [64][96] fp32 buffer (d96: the whole tile, on the iterations
  // this warpgroup runs G5), float4 chunk c of thread t at (128c + t)*16.
  float4* dq_stage = reinterpret_cast<float4*>(sDQ + g * kDqTile) + t;
  // dQacc tensor-map row (64 floats per row) of query tile qt: ((b*H + h) * n_q + qt) * 6144 / 64.
  const int dq_row_bh = (b * H + h) * n_q * (kDqTileFloats / 64);

  float dk_acc[48];   // dK_g (unscaled), [64 keys][96 d]  (d96: 48 registers)
  float dv_acc[48];   // dV_g, [64 keys][96 d]
  float s_acc[32];    // S^T, overwritten in place by P^T
  float dp_acc[32];   // dP^T, overwritten in place by dS^T
  float dq_acc[48];   // dQ [64 q][96 d] of this query tile (d96: all d, every 2nd tile)
  uint32_t pf[4][4];  // P^T as bf16 RS A-fragments, one [4] per k-step of 16 queries
  uint32_t df[4][4];  // dS^T as bf16 RS A-fragments

#pragma unroll
  for (int i = 0; i < 48; ++i) {
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
    issue_xyT(s_acc, dk_a, make_desc_kmajor_sw64(q_stage));
    ptx::wgmma_commit();  // G1
    issue_xyT(dp_acc, dv_a, make_desc_kmajor_sw64(do_stage));
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
    issue_rs(dv_acc, pf, make_desc_mnmajor_sw64(do_stage, kQBox));
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
    // Reuse of this buffer (written two iterations ago): the consumer whose G5 read it (only
    // warpgroup (it - 2) & 1) retired that G5 before it arrived at the kDsBar barrier of the
    // previous iteration, which this warpgroup has passed.
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
    issue_rs(dk_acc, df, make_desc_mnmajor_sw64(q_stage, kQBox));
    ptx::wgmma_commit();  // G4

    // ---- 6. G5: dQ_i = dS K_j once both halves of dS^T are stored ----
    // d96: only warpgroup (it & 1) runs G5 and stages/reduces dQ_i (see the header); both sync.
    // Steps 7-8 sit in ONE if/else on do_dq, the stage release duplicated in both arms (the d64
    // kernel's lesson: with two separate `if (do_dq)` blocks ptxas cannot tell that G5's wait<0>
    // always follows its issue and injects a wait at the loop back-edge, C7517).
    ptx::named_bar_sync(kDsBar, 256);
    const bool do_dq = static_cast<uint32_t>(it & 1) == g;
    // ---- 7. release the stage once G3 and G4 (the last readers of Q_i and dO_i) retired ----
    auto release_stage = [&]() {
      ptx::fence_regs(dv_acc);
      ptx::fence_regs(dk_acc);
      fence_frag(pf);  // keeps the fragments unclobbered until their GEMMs retired
      fence_frag(df);
      if (lane == 0) ptx::mbar_arrive(&q_empty[st]);
      if (++st == kStages) { st = 0; ph ^= 1u; }
    };
    if (do_dq) {
      ptx::fence_regs(dq_acc);
      ptx::wgmma_fence();
      issue_dq(dq_acc, ptx::make_desc_mnmajor_sw128(sDS + buf * kDsBytes, kDsBytes), dk_b);
      ptx::wgmma_commit();  // G5
      ptx::wgmma_wait<1>();  // G3, G4 retired (G5 may still run)
      release_stage();
      // ---- 8. dQ_i -> smem staging -> TMA reduce-add into dQacc ----
      ptx::wgmma_wait<0>();  // G5 retired
      ptx::fence_regs(dq_acc);
      store_dq(dq_acc, dq_stage, sDQ + g * kDqTile, &tmDQ, dq_row_bh + qt * (kDqTileFloats / 64),
               t, kStageBar + g);
    } else {
      ptx::wgmma_wait<0>();  // no G5 on this tile; G3, G4 retired
      release_stage();
    }
    ++qt;  // causal: no wrap
  }

  // ---- 9. epilogue: dK = scale * dK_acc, dV; bf16 straight from registers ----
  const size_t tok_stride = static_cast<size_t>(H) * kD;
  const int key0 = kt * kBN + static_cast<int>(64u * g + r0);  // token index within the batch
  const size_t off0 = (static_cast<size_t>(b) * S + key0) * tok_stride + static_cast<size_t>(h) * kD;
  const size_t off1 = off0 + 8 * tok_stride;
#pragma unroll
  for (int j = 0; j < kD / 8; ++j) {  // d96: 12 column groups of the m64n96 accumulator
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
// d96: index = (((b*H + h) * n_q + qt) * 12 + c) * 128 + t holds registers 4c..4c+3 of thread t
// of the G5 warpgroup: (row r0, col 8c + 2q4 + e) for e = 0, 1, then (row r0 + 8, same cols),
// r0 = 16 (t/32) + (t%32)/4, q4 = t%4, row offset 64 qt.
__global__ void __launch_bounds__(256) bwd_post_kernel(const float4* __restrict__ acc,
                                                       __nv_bfloat16* __restrict__ dQ, int S,
                                                       int H, float scale, long long n4) {
  const long long idx = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= n4) return;
  const int t = static_cast<int>(idx % 128);
  const int cc = static_cast<int>((idx / 128) % kDqChunks);
  const long long tile = idx / (128 * kDqChunks);  // d96: 1536 float4 per query tile
  const int n_q = S / kBM;
  const int qt = static_cast<int>(tile % n_q);
  const long long bh = tile / n_q;
  const int h = static_cast<int>(bh % H);
  const long long b = bh / H;
  const int r0 = 16 * (t / 32) + (t % 32) / 4;
  const int col = 8 * cc + 2 * (t % 4);
  const int row = qt * kBM + r0;
  const float4 v = acc[idx];
  const size_t tok_stride = static_cast<size_t>(H) * kD;
  __nv_bfloat16* p0 =
      dQ + (static_cast<size_t>(b) * S + row) * tok_stride + static_cast<size_t>(h) * kD + col;
  *reinterpret_cast<uint32_t*>(p0) = ptx::pack_bf16x2(v.x * scale, v.y * scale);
  *reinterpret_cast<uint32_t*>(p0 + 8 * tok_stride) = ptx::pack_bf16x2(v.z * scale, v.w * scale);
}

// d96: 3-D tensor map over a [B, S, H, 96] bf16 tensor: dims {96, H, B*S}, strides {192 B,
// H*192 B}, box {32, 1, rows} (64-B box rows = the swizzle span), 64B swizzle (mha_fwd_d96.cu).
CUresult make_qkv_map(CUtensorMap* map, const __nv_bfloat16* p, int B, int S, int H,
                      uint32_t rows) {
  return ptx::make_tmap_3d(map, p, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, kD,
                           static_cast<uint64_t>(H), static_cast<uint64_t>(B) * S,
                           static_cast<uint64_t>(kD) * 2, static_cast<uint64_t>(H) * kD * 2,
                           kBoxD, 1, rows, CU_TENSOR_MAP_SWIZZLE_64B);
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
  // TMA / bulk-copy sources need 16-B alignment (LSE rows: 256-B steps from the base; d96: the
  // row pitch 192 B is a multiple of 16); the epilogues store 4-B pairs.
  const uintptr_t align = reinterpret_cast<uintptr_t>(Q) | reinterpret_cast<uintptr_t>(K) |
                          reinterpret_cast<uintptr_t>(V) | reinterpret_cast<uintptr_t>(O) |
                          reinterpret_cast<uintptr_t>(dO) | reinterpret_cast<uintptr_t>(LSE) |
                          reinterpret_cast<uintptr_t>(dQ) | reinterpret_cast<uintptr_t>(dK) |
                          reinterpret_cast<uintptr_t>(dV);
  if (align % 16 != 0) return static_cast<int>(cudaErrorInvalidValue);
  const long long rows = static_cast<long long>(B) * S * H;  // token rows = Dr entries
  // dQacc rows of 64 floats (d96: 3 per 2 token rows) must fit the int32 coordinate.
  if (rows / 2 * 3 > 0x7fffffffLL) return static_cast<int>(cudaErrorInvalidValue);

  // Host state kept across calls: the smem opt-in and the scratch (dQacc, then Dr).
  static bool smem_set = false;
  static float* scratch = nullptr;
  static size_t scratch_floats = 0;
  cudaError_t err;
  if (!smem_set) {
    if ((err = ptx::set_max_dynamic_smem(mha_bwd_causal_d96_kernel,
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
  float* dr = scratch + acc_floats;  // acc_floats is a multiple of 96 * 128: 16-B aligned rows

  CUtensorMap tmQ, tmK, tmV, tmdO, tmDQ;
  if (make_qkv_map(&tmQ, Q, B, S, H, kBM) != CUDA_SUCCESS ||
      make_qkv_map(&tmdO, dO, B, S, H, kBM) != CUDA_SUCCESS ||
      make_qkv_map(&tmK, K, B, S, H, kBN) != CUDA_SUCCESS ||
      make_qkv_map(&tmV, V, B, S, H, kBN) != CUDA_SUCCESS) {
    return static_cast<int>(cudaErrorInvalidValue);
  }
  // dQacc as a 2-D fp32 [rows*3/2][64] tensor (d96), box {64, 96} = one query tile's 24 KB,
  // no swizzle (the staging buffer is the same 24 KB, linear).
  if (ptx::make_tmap_2d(&tmDQ, dq_acc, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 4, 64,
                        static_cast<uint64_t>(rows) / 2 * 3, 256, 64, kDqTileFloats / 64,
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
  mha_bwd_causal_d96_kernel<<<grid, kThreads, kSmemBytes, stream>>>(
      tmQ, tmK, tmV, tmdO, tmDQ, LSE, dr, dK, dV, S, H, BH, scale, scale_log2);
  if ((err = cudaGetLastError()) != cudaSuccess) return static_cast<int>(err);

  const long long n4 = static_cast<long long>(acc_floats / 4);
  bwd_post_kernel<<<static_cast<unsigned>((n4 + 255) / 256), 256, 0, stream>>>(
      reinterpret_cast<const float4*>(dq_acc), dQ, S, H, scale, n4);
  return static_cast<int>(cudaGetLastError());
}
