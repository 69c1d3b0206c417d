// Naive attention backward, head_dim 128: the plain-CUDA baseline kernel for the ptxgym MHA
// backward task (no inline PTX, no tensor cores, no libraries).
//
//   Q, K, V, O, dO, dQ, dK, dV: [B, S, H, 128] bf16;  LSE: [B, H, S] fp32 (natural log)
//   P  = exp(Q K^T / sqrt(128) - LSE)      (recomputed, non-causal)
//   Dr = rowsum(dO * O),  dS = P * (dO V^T - Dr)
//   dV = P^T dO,  dK = dS^T Q / sqrt(128),  dQ = dS K / sqrt(128)
//
// Three kernels on `stream`, all fp32 FFMA math:
//   1. row_dot: Dr for every (b, h, query) into a scratch buffer (cudaMallocAsync).
//   2. dkdv: one block per 64 keys of a (b, h); it streams the queries in tiles of 64,
//      recomputes P^T and dS^T for the tile and accumulates dK and dV in registers.
//   3. dq: one block per 64 queries; it streams the keys, recomputes P and dS and accumulates
//      dQ in registers. Recomputing instead of scattering dQ with atomics keeps the result
//      deterministic.
// D must be 128 (cudaErrorInvalidValue otherwise); any S is handled.

#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cstdint>
#include <cmath>

namespace {

constexpr int kD = 128;        // head dimension
constexpr int kTile = 64;      // rows (queries or keys) per tile
constexpr int kThreads = 256;  // 16 x 16: ty picks 4 rows, tx picks 4 columns / 8 features
// Row strides in floats: +4 keeps float4 alignment and spreads the 8 rows that a quarter-warp
// reads with float4 over all 32 banks.
constexpr int kLdRow = kD + 4;
constexpr int kLdT = kTile + 4;
constexpr float kLog2e = 1.4426950408889634f;

// dkdv: K, V, Q, dO tiles, then P^T and dS^T tiles, then LSE (log2 units) and Dr for the queries.
constexpr size_t kDkdvSmem = sizeof(float) * (static_cast<size_t>(4) * kTile * kLdRow +
                                              static_cast<size_t>(2) * kTile * kLdT + 2 * kTile);
// dq: Q, dO, K, V tiles, then the dS tile, then LSE and Dr.
constexpr size_t kDqSmem = sizeof(float) * (static_cast<size_t>(4) * kTile * kLdRow +
                                            static_cast<size_t>(kTile) * kLdT + 2 * kTile);

// Copies rows [row0, row0 + 64) of one head of a [B, S, H, 128] bf16 tensor into a fp32 shared
// tile [64][kLdRow]; rows at or past S are zero-filled.
__device__ __forceinline__ void load_tile(float* __restrict__ dst,
                                          const __nv_bfloat16* __restrict__ src, int row0,
                                          int S, size_t row_stride) {
  for (int v = threadIdx.x; v < kTile * (kD / 8); v += kThreads) {
    const int r = v / (kD / 8);
    const int c = (v % (kD / 8)) * 8;
    float* out = dst + r * kLdRow + c;
    if (row0 + r < S) {
      const uint4 raw = __ldg(
          reinterpret_cast<const uint4*>(src + static_cast<size_t>(row0 + r) * row_stride + c));
      const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&raw);
      const float2 f0 = __bfloat1622float2(h[0]);
      const float2 f1 = __bfloat1622float2(h[1]);
      const float2 f2 = __bfloat1622float2(h[2]);
      const float2 f3 = __bfloat1622float2(h[3]);
      *reinterpret_cast<float4*>(out) = make_float4(f0.x, f0.y, f1.x, f1.y);
      *reinterpret_cast<float4*>(out + 4) = make_float4(f2.x, f2.y, f3.x, f3.y);
    } else {
      *reinterpret_cast<float4*>(out) = make_float4(0.f, 0.f, 0.f, 0.f);
      *reinterpret_cast<float4*>(out + 4) = make_float4(0.f, 0.f, 0.f, 0.f);
    }
  }
}

// Two 4x4 blocks of row dot products over the 128 features:
//   x[i][j] = A[ty*4+i] . B[tx+16j]   and   y[i][j] = C[ty*4+i] . E[tx+16j].
// Interleaving the B/E rows (tx + 16j) makes a quarter-warp read 8 consecutive rows.
__device__ __forceinline__ void dot_blocks(const float* __restrict__ A,
                                           const float* __restrict__ Bm,
                                           const float* __restrict__ C,
                                           const float* __restrict__ E, int tx, int ty,
                                           float (&x)[4][4], float (&y)[4][4]) {
#pragma unroll
  for (int i = 0; i < 4; ++i) {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      x[i][j] = 0.0f;
      y[i][j] = 0.0f;
    }
  }
#pragma unroll 2
  for (int d = 0; d < kD; d += 4) {
    float4 a[4], b[4], c[4], e[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      a[i] = *reinterpret_cast<const float4*>(&A[(ty * 4 + i) * kLdRow + d]);
      c[i] = *reinterpret_cast<const float4*>(&C[(ty * 4 + i) * kLdRow + d]);
    }
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      b[j] = *reinterpret_cast<const float4*>(&Bm[(tx + 16 * j) * kLdRow + d]);
      e[j] = *reinterpret_cast<const float4*>(&E[(tx + 16 * j) * kLdRow + d]);
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) {
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        x[i][j] = fmaf(a[i].x, b[j].x, x[i][j]);
        x[i][j] = fmaf(a[i].y, b[j].y, x[i][j]);
        x[i][j] = fmaf(a[i].z, b[j].z, x[i][j]);
        x[i][j] = fmaf(a[i].w, b[j].w, x[i][j]);
        y[i][j] = fmaf(c[i].x, e[j].x, y[i][j]);
        y[i][j] = fmaf(c[i].y, e[j].y, y[i][j]);
        y[i][j] = fmaf(c[i].z, e[j].z, y[i][j]);
        y[i][j] = fmaf(c[i].w, e[j].w, y[i][j]);
      }
    }
  }
}

__device__ __forceinline__ float pick(const float4& v, int t) {
  return t == 0 ? v.x : t == 1 ? v.y : t == 2 ? v.z : v.w;
}

// acc[i][0..7] += sum_k W[ty*4+i][k] * X[k][cols], cols = tx*4..+3 and 64+tx*4..+3, over the 64
// rows k of X. W is a [64][kLdT] tile, X a [64][kLdRow] tile.
__device__ __forceinline__ void accumulate_wx(const float* __restrict__ W,
                                              const float* __restrict__ X, int tx, int ty,
                                              float (&acc)[4][8]) {
#pragma unroll 2
  for (int k = 0; k < kTile; k += 4) {
    float4 w[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      w[i] = *reinterpret_cast<const float4*>(&W[(ty * 4 + i) * kLdT + k]);
    }
#pragma unroll
    for (int t = 0; t < 4; ++t) {
      const float4 x0 = *reinterpret_cast<const float4*>(&X[(k + t) * kLdRow + tx * 4]);
      const float4 x1 = *reinterpret_cast<const float4*>(&X[(k + t) * kLdRow + 64 + tx * 4]);
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const float p = pick(w[i], t);
        acc[i][0] = fmaf(p, x0.x, acc[i][0]);
        acc[i][1] = fmaf(p, x0.y, acc[i][1]);
        acc[i][2] = fmaf(p, x0.z, acc[i][2]);
        acc[i][3] = fmaf(p, x0.w, acc[i][3]);
        acc[i][4] = fmaf(p, x1.x, acc[i][4]);
        acc[i][5] = fmaf(p, x1.y, acc[i][5]);
        acc[i][6] = fmaf(p, x1.z, acc[i][6]);
        acc[i][7] = fmaf(p, x1.w, acc[i][7]);
      }
    }
  }
}

// Writes rows ty*4+i (i < 4, while row0 + row < S) of a [64][128] accumulator tile, times `mul`,
// as bf16 into one head of a [B, S, H, 128] tensor.
__device__ __forceinline__ void store_rows(__nv_bfloat16* __restrict__ dst,
                                           const float (&acc)[4][8], float mul, int row0, int S,
                                           size_t row_stride, int tx, int ty) {
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int r = row0 + ty * 4 + i;
    if (r >= S) continue;
    __nv_bfloat16* out = dst + static_cast<size_t>(r) * row_stride;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const float* a = &acc[i][half * 4];
      __nv_bfloat162 lo = __floats2bfloat162_rn(a[0] * mul, a[1] * mul);
      __nv_bfloat162 hi = __floats2bfloat162_rn(a[2] * mul, a[3] * mul);
      uint2 packed;
      packed.x = *reinterpret_cast<uint32_t*>(&lo);
      packed.y = *reinterpret_cast<uint32_t*>(&hi);
      *reinterpret_cast<uint2*>(out + half * 64 + tx * 4) = packed;
    }
  }
}

// Loads LSE (converted to log2 units) and Dr for rows [row0, row0 + 64) of one (b, h). Rows past
// S get LSE = +inf, so exp2(score - LSE) = 0 and they contribute nothing.
__device__ __forceinline__ void load_row_stats(float* __restrict__ lse2, float* __restrict__ dr,
                                               const float* __restrict__ LSE,
                                               const float* __restrict__ Dr, size_t bh_base,
                                               int row0, int S) {
  for (int r = threadIdx.x; r < kTile; r += kThreads) {
    const int q = row0 + r;
    lse2[r] = q < S ? LSE[bh_base + q] * kLog2e : INFINITY;
    dr[r] = q < S ? Dr[bh_base + q] : 0.0f;
  }
}

// Dr[b, h, s] = sum_d dO[b, s, h, d] * O[b, s, h, d], one warp per (b, s, h) row.
__global__ void row_dot_kernel(const __nv_bfloat16* __restrict__ O,
                               const __nv_bfloat16* __restrict__ dO, float* __restrict__ Dr,
                               int S, int H, long long rows) {
  const long long row = static_cast<long long>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;
  const size_t base = static_cast<size_t>(row) * kD + lane * 4;
  const uint2 o_raw = *reinterpret_cast<const uint2*>(O + base);
  const uint2 g_raw = *reinterpret_cast<const uint2*>(dO + base);
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
    dkdv_kernel(const __nv_bfloat16* __restrict__ Q, const __nv_bfloat16* __restrict__ K,
                const __nv_bfloat16* __restrict__ V, const __nv_bfloat16* __restrict__ dO,
                const float* __restrict__ LSE, const float* __restrict__ Dr,
                __nv_bfloat16* __restrict__ dK, __nv_bfloat16* __restrict__ dV, int S, int H,
                float scale, float scale_log2) {
  extern __shared__ __align__(16) float smem[];
  float* Ks = smem;                   // [64][kLdRow] this block's keys
  float* Vs = Ks + kTile * kLdRow;    // [64][kLdRow] this block's values
  float* Qs = Vs + kTile * kLdRow;    // [64][kLdRow] current query tile
  float* dOs = Qs + kTile * kLdRow;   // [64][kLdRow] current dO tile
  float* Pt = dOs + kTile * kLdRow;   // [64][kLdT]  P^T, key-major
  float* dSt = Pt + kTile * kLdT;     // [64][kLdT]  dS^T, key-major
  float* lse2 = dSt + kTile * kLdT;   // [64]
  float* dr = lse2 + kTile;           // [64]

  const int tid = threadIdx.x;
  const int tx = tid % 16;
  const int ty = tid / 16;
  const int k0 = blockIdx.x * kTile;
  const int h = blockIdx.y;
  const int b = blockIdx.z;
  const size_t row_stride = static_cast<size_t>(H) * kD;
  const size_t head_base = (static_cast<size_t>(b) * S * H + h) * kD;
  const size_t bh_base = (static_cast<size_t>(b) * H + h) * S;

  load_tile(Ks, K + head_base, k0, S, row_stride);
  load_tile(Vs, V + head_base, k0, S, row_stride);

  float dk[4][8], dv[4][8];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      dk[i][j] = 0.0f;
      dv[i][j] = 0.0f;
    }
  }

  for (int q0 = 0; q0 < S; q0 += kTile) {
    __syncthreads();  // previous tile's readers of Qs, dOs, Pt, dSt are done
    load_tile(Qs, Q + head_base, q0, S, row_stride);
    load_tile(dOs, dO + head_base, q0, S, row_stride);
    load_row_stats(lse2, dr, LSE, Dr, bh_base, q0, S);
    __syncthreads();

    // Key rows ty*4+i, query columns tx+16j: s = K.Q (raw), dp = V.dO.
    float s[4][4], dp[4][4];
    dot_blocks(Ks, Qs, Vs, dOs, tx, ty, s, dp);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int c = tx + 16 * j;
      const float l2 = lse2[c];
      const float rd = dr[c];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const float p = exp2f(fmaf(s[i][j], scale_log2, -l2));
        Pt[(ty * 4 + i) * kLdT + c] = p;
        dSt[(ty * 4 + i) * kLdT + c] = p * (dp[i][j] - rd);
      }
    }
    __syncthreads();

    accumulate_wx(Pt, dOs, tx, ty, dv);   // dV += P^T dO
    accumulate_wx(dSt, Qs, tx, ty, dk);   // dK += dS^T Q (scaled at the end)
  }

  store_rows(dK + head_base, dk, scale, k0, S, row_stride, tx, ty);
  store_rows(dV + head_base, dv, 1.0f, k0, S, row_stride, tx, ty);
}

__global__ void __launch_bounds__(kThreads, 1)
    dq_kernel(const __nv_bfloat16* __restrict__ Q, const __nv_bfloat16* __restrict__ K,
              const __nv_bfloat16* __restrict__ V, const __nv_bfloat16* __restrict__ dO,
              const float* __restrict__ LSE, const float* __restrict__ Dr,
              __nv_bfloat16* __restrict__ dQ, int S, int H, float scale, float scale_log2) {
  extern __shared__ __align__(16) float smem[];
  float* Qs = smem;                   // [64][kLdRow] this block's queries
  float* dOs = Qs + kTile * kLdRow;   // [64][kLdRow] this block's dO rows
  float* Ks = dOs + kTile * kLdRow;   // [64][kLdRow] current key tile
  float* Vs = Ks + kTile * kLdRow;    // [64][kLdRow] current value tile
  float* dSs = Vs + kTile * kLdRow;   // [64][kLdT]  dS, query-major
  float* lse2 = dSs + kTile * kLdT;   // [64]
  float* dr = lse2 + kTile;           // [64]

  const int tid = threadIdx.x;
  const int tx = tid % 16;
  const int ty = tid / 16;
  const int q0 = blockIdx.x * kTile;
  const int h = blockIdx.y;
  const int b = blockIdx.z;
  const size_t row_stride = static_cast<size_t>(H) * kD;
  const size_t head_base = (static_cast<size_t>(b) * S * H + h) * kD;
  const size_t bh_base = (static_cast<size_t>(b) * H + h) * S;

  load_tile(Qs, Q + head_base, q0, S, row_stride);
  load_tile(dOs, dO + head_base, q0, S, row_stride);
  load_row_stats(lse2, dr, LSE, Dr, bh_base, q0, S);
  __syncthreads();
  float l2[4], rd[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    l2[i] = lse2[ty * 4 + i];
    rd[i] = dr[ty * 4 + i];
  }

  float dq[4][8];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
#pragma unroll
    for (int j = 0; j < 8; ++j) dq[i][j] = 0.0f;
  }

  for (int k0 = 0; k0 < S; k0 += kTile) {
    __syncthreads();  // previous tile's readers of Ks and dSs are done
    load_tile(Ks, K + head_base, k0, S, row_stride);
    load_tile(Vs, V + head_base, k0, S, row_stride);
    __syncthreads();

    // Query rows ty*4+i, key columns tx+16j: s = Q.K (raw), dp = dO.V.
    float s[4][4], dp[4][4];
    dot_blocks(Qs, Ks, dOs, Vs, tx, ty, s, dp);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int c = tx + 16 * j;
      const bool valid = k0 + c < S;
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const float p = valid ? exp2f(fmaf(s[i][j], scale_log2, -l2[i])) : 0.0f;
        dSs[(ty * 4 + i) * kLdT + c] = p * (dp[i][j] - rd[i]);
      }
    }
    __syncthreads();

    accumulate_wx(dSs, Ks, tx, ty, dq);  // dQ += dS K (scaled at the end)
  }

  store_rows(dQ + head_base, dq, scale, q0, S, row_stride, tx, ty);
}

}  // namespace

extern "C" int mha_bwd(const __nv_bfloat16* Q, const __nv_bfloat16* K, const __nv_bfloat16* V,
                       const __nv_bfloat16* O, const __nv_bfloat16* dO, const float* LSE,
                       __nv_bfloat16* dQ, __nv_bfloat16* dK, __nv_bfloat16* dV, int B, int S,
                       int H, int D, cudaStream_t stream) {
  if (D != kD || B < 0 || S < 0 || H < 0) return static_cast<int>(cudaErrorInvalidValue);
  if (B == 0 || S == 0 || H == 0) return static_cast<int>(cudaGetLastError());
  if (H > 65535 || B > 65535) return static_cast<int>(cudaErrorInvalidValue);
  const uintptr_t align = reinterpret_cast<uintptr_t>(Q) | reinterpret_cast<uintptr_t>(K) |
                          reinterpret_cast<uintptr_t>(V) | reinterpret_cast<uintptr_t>(O) |
                          reinterpret_cast<uintptr_t>(dO) | reinterpret_cast<uintptr_t>(dQ) |
                          reinterpret_cast<uintptr_t>(dK) | reinterpret_cast<uintptr_t>(dV);
  if (align % 16 != 0) return static_cast<int>(cudaErrorInvalidValue);

  cudaError_t err = cudaFuncSetAttribute(dkdv_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(kDkdvSmem));
  if (err != cudaSuccess) return static_cast<int>(err);
  err = cudaFuncSetAttribute(dq_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             static_cast<int>(kDqSmem));
  if (err != cudaSuccess) return static_cast<int>(err);

  const long long rows = static_cast<long long>(B) * S * H;
  float* dr = nullptr;
  err = cudaMallocAsync(reinterpret_cast<void**>(&dr), static_cast<size_t>(rows) * sizeof(float),
                        stream);
  if (err != cudaSuccess) return static_cast<int>(err);

  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(kD)));
  const float scale_log2 = scale * kLog2e;
  constexpr int kRowsPerBlock = kThreads / 32;
  const unsigned dot_blocks_n = static_cast<unsigned>((rows + kRowsPerBlock - 1) / kRowsPerBlock);
  row_dot_kernel<<<dot_blocks_n, kThreads, 0, stream>>>(O, dO, dr, S, H, rows);

  const dim3 grid((S + kTile - 1) / kTile, H, B);
  dkdv_kernel<<<grid, kThreads, kDkdvSmem, stream>>>(Q, K, V, dO, LSE, dr, dK, dV, S, H, scale,
                                                     scale_log2);
  dq_kernel<<<grid, kThreads, kDqSmem, stream>>>(Q, K, V, dO, LSE, dr, dQ, S, H, scale,
                                                 scale_log2);
  err = cudaGetLastError();
  // Stream-ordered free: released after the kernels above have finished with it.
  const cudaError_t free_err = cudaFreeAsync(dr, stream);
  return static_cast<int>(err != cudaSuccess ? err : free_err);
}
