// Expert attention forward, head_dim 64, FlashAttention-3 style, for Hopper (sm_90a).
//
// H200, 2026-12-02, `ptxgym eval` with default settings (docs/benchmarks.md, eighteenth session):
// PASSED, qualified (HGMMA 6,291,456 warps, FLOP coverage 1.00), memcheck clean, 0.6315 ms against
// cuDNN 0.6045 ms: 0.957x (0.915-0.928x with the ping-pong, below). examples/expert/README.md has
// the design checks.
//
//   Q, K, V, O: [B, S, H, 64] bf16 (D contiguous, heads interleaved: one head's consecutive
//   tokens are H*64 elements apart);  LSE: [B, H, S] fp32, natural log of sum_j exp(scale*q.k_j),
//   scale = 1/sqrt(64), non-causal.  S must be a multiple of 128 (cudaErrorInvalidValue otherwise).
//
// Derived from the GPU-verified examples/expert/mha_fwd_d128.cu (1.02x cuDNN on an H200). The
// structure is the same; only the head-dimension-dependent parts changed:
//   * One CTA per (128-query tile, head, batch); grid (S/128, H, B), query tile fastest so the 32
//     CTAs of one head run together and re-read that head's K/V from L2.
//   * 384 threads = 3 warpgroups. WG0 is the producer (setmaxnreg.dec 40): one elected thread loads
//     Q once and streams K_j and V_j (128 keys each) through two separate 6-stage rings of
//     full/empty mbarriers, with TMA. WG1 and WG2 are consumers (setmaxnreg.inc 232), each owning
//     64 query rows (wgmma M = 64).
//   * Tensor maps are 3-D {D=64, H, B*S} with strides {128 B, H*128 B}; box {64, 1, 128} gives a
//     [128 tokens][64 d] tile, 128B-swizzled. At D = 64 a row is exactly 128 B, i.e. one
//     swizzle-atom column, so every Q, K or V tile is ONE TMA box (16 KB), not two as at D = 128.
//     Since S % 128 == 0 a tile never straddles two batches, so the flattened B*S dim is safe.
//   * S = Q K^T: wgmma m64n128k16 SS, both operands K-major (trans 0/0), 4 k-steps over D: k-step
//     kk is +32 B * kk inside the 128-B swizzled row (contracts §3), no box change.
//   * Online softmax on the fp32 accumulator in registers, base 2 with scale*log2(e) folded into
//     one FFMA; row max quad-reduced each block, row sum kept as per-thread partials until the end.
//   * O += P V: wgmma m64n64k16 RS, P packed to bf16 straight from the S accumulator (k-step s
//     takes S registers 8s..8s+7, contracts §2), V is the MN-major B operand (trans-b = 1). With
//     N = 64 the B operand is ONE 64-wide MN swizzle atom column, so LBO (the stride to the next
//     64-wide d block) is never used; SBO = 1024 (8 key rows x 128 B), k-step = +16 keys = +2048 B.
//   * Intra-warpgroup overlap (FA3 Algorithm 2): the P V_{j-1} wgmma runs while the softmax of
//     block j is computed; O is rescaled by the previous block's factor right after issuing the
//     S_j GEMM (the O registers are idle then), before the P V_{j-1} GEMM.
//   * No inter-warpgroup ping-pong: the two consumers issue their GEMMs whenever their data is
//     ready. The d128 kernel's named-barrier turns (FA3's scheduler barrier) were measured here
//     too, on the reasoning that per 128x128 block the ex2 work (16384 MUFU ops = 1024 clocks at
//     16/clk/SM) equals the MMA work (4.2 MFLOP = 1024 clocks at 4096 FLOP/clk/SM); on the H200
//     the kernel with them took 0.6514 ms and without them 0.6315 ms (cuDNN 0.6045 ms, same
//     host, 2026-12-02): the turns cost more waiting than they gained in overlap at D = 64.
//   * Empty barriers count one arrival per consumer warp (8), each after that warp's own
//     wgmma.wait_group retired the group that read the stage.
//   * Epilogue: quad-reduce the row sums, O /= l, store bf16 O directly from registers,
//     LSE = (m + log2 l) * ln2 from the lane owning column 0 of the row.
//
// Tile choice (the key tile Bc and the stage count):
//   * Bc = 128 keys. The workload has S = 4096, so Bc must divide 4096: 176 or 192 (FA3's hdim-64
//     choices) do not, and would need a masked partial last tile plus a 4-D map. 256 divides it
//     but does not fit the registers: S (m64n256: 128 fp32) + P fragments (64 b32) + O (32 fp32)
//     are all live at once in the overlapped loop = 224 of the 232 consumer registers, before
//     m, l, descriptors and addresses -> spills and C7511 serialisation.
//   * 6 stages per ring. A 128x64 K or V tile is consumed in half the time of a 128x128 one, so
//     covering the same L2/HBM latency (in time) as the d128 kernel's verified 3 stages takes
//     twice as many: 6 stages keep 192 KB of K/V in flight, exactly the d128 kernel's amount.
//     (One CTA per SM is resident either way, limited by registers, so the smem costs nothing.
//     4 stages = 144 KB is the fallback if a GPU run shows no difference.)
// Shared memory: Q 16 KB + 6 stages x (K 16 KB + V 16 KB) = 208 KB = 212992 B, + 25 barriers
// (200 B), + 1 KB to round the base up to 1024 = 214216 B of the 232448 B allowed.

#include "ptxgym_h100.cuh"

#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cstdint>
#include <cmath>

namespace {

constexpr int kD = 64;          // head dimension (fixed)
constexpr int kBM = 128;        // query rows per CTA: 2 consumer warpgroups x 64
constexpr int kBN = 128;        // keys per K/V tile
constexpr int kStages = 6;      // depth of each of the K and V rings (see "Tile choice" above)
constexpr int kThreads = 384;   // producer WG + 2 consumer WGs
static_assert(kBM == kBN, "one tensor map (box of kBN rows) serves Q, K and V");

// One TMA box = one whole tile: [128 rows][64 bf16] = 16 KB, 128B-swizzled (row = 128 B).
constexpr uint32_t kTileBytes = 128u * 64u * 2u;  // Q tile, one K stage or one V stage

// Byte offsets from the 1024-aligned base. Every tile starts on a 1024-B boundary so the swizzle
// phase of TMA and wgmma agree (descriptor base_offset = 0): 16 KB is a multiple of 1024.
constexpr uint32_t kOffQ = 0;
constexpr uint32_t kOffK = kOffQ + kTileBytes;
constexpr uint32_t kOffV = kOffK + kStages * kTileBytes;
constexpr uint32_t kOffBar = kOffV + kStages * kTileBytes;
constexpr uint32_t kNumBars = 1 + 4 * kStages;  // q_full, k_full[], k_empty[], v_full[], v_empty[]
constexpr uint32_t kSmemBytes = kOffBar + 8 * kNumBars + 1024;  // +1 KB to round the base up
static_assert(kTileBytes % 1024 == 0, "tiles must stay 1024-B aligned");
static_assert(kSmemBytes <= 232448, "dynamic shared memory over the 227 KB limit");

// Empty barriers: one arrival per consumer warp (2 warpgroups x 4 warps). Each warp arrives after
// its own wgmma.wait_group retired the group that read the stage (a warp's HGMMA reads the whole
// B tile, so per-warp completion is the safe granularity).
constexpr uint32_t kEmptyArrivals = 8;

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

// S = Q K^T over D = 64: 4 k-steps of m64n128k16, both operands K-major 128B-swizzled.
// dq: descriptor of this warpgroup's 64 Q rows; dk: descriptor of the K stage. The whole D fits
// in one 128-B swizzled row, so k-step kk is just +32 B (16 bf16) on both start addresses.
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

__global__ void __launch_bounds__(kThreads, 1)
    mha_fwd_d64_kernel(const __grid_constant__ CUtensorMap tmQ,
                       const __grid_constant__ CUtensorMap tmK,
                       const __grid_constant__ CUtensorMap tmV, __nv_bfloat16* __restrict__ O,
                       float* __restrict__ LSE, int S, int H, float scale_log2) {
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

  const int q_tile = blockIdx.x;
  const int h = blockIdx.y;
  const int b = blockIdx.z;
  const int n_kv = S / kBN;  // number of K/V tiles (>= 1)

  // ---- step 1: barrier initialisation (one thread), then a CTA-wide barrier ----
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
    // ---- step 2: producer warpgroup: Q once, then K_j / V_j through their rings ----
    ptx::setmaxnreg_dec<40>();
    if (ptx::warp_idx() == 0 && ptx::elect_one_sync()) {
      // Token coordinate in the flattened [B*S] dimension of the 3-D maps.
      const int q_tok = b * S + q_tile * kBM;
      const int kv_tok0 = b * S;
      ptx::mbar_arrive_expect_tx(q_full, kTileBytes);
      ptx::tma_load_3d(sQ, &tmQ, q_full, 0, h, q_tok);  // d 0..63: the whole Q tile
      int kst = 0, vst = 0;
      uint32_t kph = 0, vph = 0;
      for (int j = 0; j < n_kv; ++j) {
        const int tok = kv_tok0 + j * kBN;
        // K_j: wait until both consumers released this stage (fresh barrier: parity 1 passes).
        ptx::mbar_wait(&k_empty[kst], kph ^ 1u);
        ptx::mbar_arrive_expect_tx(&k_full[kst], kTileBytes);
        ptx::tma_load_3d(sK + kst * kTileBytes, &tmK, &k_full[kst], 0, h, tok);
        if (++kst == kStages) { kst = 0; kph ^= 1u; }
        // V_j: its own ring (it is released later than K_j).
        ptx::mbar_wait(&v_empty[vst], vph ^ 1u);
        ptx::mbar_arrive_expect_tx(&v_full[vst], kTileBytes);
        ptx::tma_load_3d(sV + vst * kTileBytes, &tmV, &v_full[vst], 0, h, tok);
        if (++vst == kStages) { vst = 0; vph ^= 1u; }
      }
    }
    // The other producer threads have nothing to do; no CTA-wide barrier follows.
    return;
  }

  // ---- step 3: consumer warpgroups: set-up ----
  ptx::setmaxnreg_inc<232>();
  const uint32_t g = wg - 1;                  // 0 or 1: query rows 64g .. 64g+63 of the tile
  const uint32_t t = threadIdx.x % 128u;      // thread in the warpgroup
  const uint32_t warp = t / 32u;
  const uint32_t lane = t % 32u;
  const bool warp_leader = (lane == 0);
  const float c = scale_log2;                 // scale * log2(e)

  // This warpgroup's A descriptor: its 64 Q rows start 64 * 128 B = 8 KB into the Q box
  // (8 KB is a multiple of the 1024-B swizzle atom: base_offset 0).
  const uint64_t dq = ptx::make_desc_kmajor_sw128(sQ + g * 8192u);

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

  ptx::mbar_wait(q_full, 0);

  // ---- step 4: prologue: S_0 = Q K_0^T and its softmax (nothing to overlap with yet) ----
  ptx::mbar_wait(&k_full[kst], kph);
  ptx::fence_regs(s_acc);
  ptx::wgmma_fence();
  issue_qk(s_acc, dq, ptx::make_desc_kmajor_sw128(sK + kst * kTileBytes));
  ptx::wgmma_commit();
  ptx::wgmma_wait<0>();
  ptx::fence_regs(s_acc);
  if (warp_leader) ptx::mbar_arrive(&k_empty[kst]);
  if (++kst == kStages) { kst = 0; kph ^= 1u; }
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

  // ---- step 5: steady state: block j's S GEMM and block j-1's P V GEMM in flight together ----
#pragma unroll 1
  for (int j = 1; j < n_kv; ++j) {
    // 5a. my turn: issue S_j = Q K_j^T
    ptx::mbar_wait(&k_full[kst], kph);
    ptx::fence_regs(s_acc);
    ptx::wgmma_fence();
    issue_qk(s_acc, dq, ptx::make_desc_kmajor_sw128(sK + kst * kTileBytes));
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
    // 5c. issue O += P_{j-1} V_{j-1}, then hand the turn over
    ptx::mbar_wait(&v_full[vst], vph);
    ptx::fence_regs(o_acc);
    fence_frag(pf);
    ptx::wgmma_fence();  // O and P were written by ordinary instructions since the last wgmma
    issue_pv(o_acc, pf, ptx::make_desc_mnmajor_sw128(sV + vst * kTileBytes, kTileBytes));
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

  // ---- step 6: tail: P_{n-1} V_{n-1} ----
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
  issue_pv(o_acc, pf, ptx::make_desc_mnmajor_sw128(sV + vst * kTileBytes, kTileBytes));
  ptx::wgmma_commit();
  ptx::wgmma_wait<0>();
  ptx::fence_regs(o_acc);
  fence_frag(pf);
  if (warp_leader) ptx::mbar_arrive(&v_empty[vst]);  // hygiene: the producer is already done

  // ---- step 7: epilogue: normalise, store O (bf16) and LSE ----
  l0 = quad_sum(l0);
  l1 = quad_sum(l1);
  const float inv0 = 1.f / l0;  // l >= 1: the row maximum contributes ex2(0) = 1
  const float inv1 = 1.f / l1;
  const uint32_t r0 = 16u * warp + lane / 4u;  // accumulator rows r0 and r0 + 8 (contracts §2)
  const uint32_t q = lane % 4u;
  const int row0 = q_tile * kBM + static_cast<int>(g * 64u + r0);  // token index within the batch
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
// box {64, 1, 128}, 128B swizzle (box row = 64 bf16 = 128 B = the swizzle span).
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
  // Tiles of 128 queries / 128 keys must not straddle batches in the flattened B*S map.
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
      ptx::set_max_dynamic_smem(mha_fwd_d64_kernel, static_cast<int>(kSmemBytes));
  if (attr != cudaSuccess) return static_cast<int>(attr);

  const float scale_log2 =
      static_cast<float>(1.4426950408889634 / std::sqrt(static_cast<double>(kD)));
  const dim3 grid(S / kBM, H, B);
  mha_fwd_d64_kernel<<<grid, kThreads, kSmemBytes, stream>>>(tmQ, tmK, tmV, O, LSE, S, H,
                                                            scale_log2);
  return static_cast<int>(cudaGetLastError());
}
