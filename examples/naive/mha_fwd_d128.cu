// Naive attention forward, head_dim 128: the plain-CUDA baseline kernel for the ptxgym MHA
// forward task (no inline PTX, no tensor cores, no libraries).
//
//   Q, K, V, O: [B, S, H, 128] bf16;  LSE: [B, H, S] fp32 (natural log)
//   O = softmax(Q K^T / sqrt(128)) V  (non-causal),  LSE = log(sum_j exp(q.k_j / sqrt(128)))
//
// Flash-attention style with fp32 FFMA math: a 256-thread block owns 64 query rows of one
// (batch, head) and streams the keys in tiles of 64, keeping an online softmax per row (running
// max and sum, base-2 exponentials with the scale folded into Q). Q, K and V tiles are held in
// shared memory as fp32 (P reuses K's space); each thread computes a 4x4 block of scores and a
// 4x8 block of O.
// D must be 128 (cudaErrorInvalidValue otherwise); any S is handled.

#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cstdint>
#include <cmath>

namespace {

constexpr int kD = 128;        // head dimension
constexpr int kBQ = 64;        // query rows per block
constexpr int kBKV = 64;       // keys per tile
constexpr int kThreads = 256;  // 16 x 16: ty picks 4 query rows, tx picks 4 keys / 8 columns
// Row strides in floats. +4 keeps rows 16-byte aligned and shifts consecutive rows by 4 banks,
// so the 8 threads of a quarter-warp reading 8 different rows with float4 hit 32 distinct banks.
constexpr int kLdRow = kD + 4;
constexpr int kLdP = kBKV + 4;
// Q, K and V tiles; P reuses the K tile's space once the scores are computed, which keeps the
// block at ~101 KB so two blocks fit on an SM.
constexpr size_t kSmemBytes = sizeof(float) * static_cast<size_t>(3) * kBQ * kLdRow;

static_assert(kBQ == kBKV, "tile loader assumes equal query and key tiles");
static_assert(kBQ * kLdP <= kBKV * kLdRow, "P must fit in the K tile it reuses");

// Copies rows [row0, row0 + 64) of one head of a [B, S, H, 128] bf16 tensor into a fp32 shared
// tile [64][kLdRow], multiplied by `mul`; rows at or past S are zero-filled (so they add nothing
// and never produce NaN).
__device__ __forceinline__ void load_tile(float* __restrict__ dst,
                                          const __nv_bfloat16* __restrict__ src, int row0,
                                          int S, size_t row_stride, float mul) {
  // 64 rows x 16 chunks of 8 bf16; 16 consecutive threads read one 256-byte row (coalesced).
  for (int v = threadIdx.x; v < kBQ * (kD / 8); v += kThreads) {
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
      *reinterpret_cast<float4*>(out) =
          make_float4(f0.x * mul, f0.y * mul, f1.x * mul, f1.y * mul);
      *reinterpret_cast<float4*>(out + 4) =
          make_float4(f2.x * mul, f2.y * mul, f3.x * mul, f3.y * mul);
    } else {
      *reinterpret_cast<float4*>(out) = make_float4(0.f, 0.f, 0.f, 0.f);
      *reinterpret_cast<float4*>(out + 4) = make_float4(0.f, 0.f, 0.f, 0.f);
    }
  }
}

__device__ __forceinline__ float group16_max(float x) {
  // The 16 threads sharing a query row are 16 consecutive lanes; xor offsets < 16 stay inside.
#pragma unroll
  for (int off = 8; off > 0; off >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, off));
  return x;
}

__device__ __forceinline__ float group16_sum(float x) {
#pragma unroll
  for (int off = 8; off > 0; off >>= 1) x += __shfl_xor_sync(0xffffffffu, x, off);
  return x;
}

__global__ void __launch_bounds__(kThreads, 2)
    mha_fwd_d128_kernel(const __nv_bfloat16* __restrict__ Q, const __nv_bfloat16* __restrict__ K,
                        const __nv_bfloat16* __restrict__ V, __nv_bfloat16* __restrict__ O,
                        float* __restrict__ LSE, int S, int H, float scale_log2) {
  extern __shared__ __align__(16) float smem[];
  float* Qs = smem;                  // [64][kLdRow] query rows, pre-scaled by scale*log2(e)
  float* Ks = Qs + kBQ * kLdRow;     // [64][kLdRow] key rows
  float* Vs = Ks + kBKV * kLdRow;    // [64][kLdRow] value rows
  float* Ps = Ks;                    // [64][kLdP]   probabilities, query-major (aliases Ks)

  const int tid = threadIdx.x;
  const int tx = tid % 16;
  const int ty = tid / 16;
  const int q0 = blockIdx.x * kBQ;
  const int h = blockIdx.y;
  const int b = blockIdx.z;
  const size_t row_stride = static_cast<size_t>(H) * kD;
  const size_t head_base = (static_cast<size_t>(b) * S * H + h) * kD;

  load_tile(Qs, Q + head_base, q0, S, row_stride, scale_log2);

  float m[4], l[4], acc[4][8];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    m[i] = -INFINITY;
    l[i] = 0.0f;
#pragma unroll
    for (int j = 0; j < 8; ++j) acc[i][j] = 0.0f;
  }

  for (int k0 = 0; k0 < S; k0 += kBKV) {
    __syncthreads();  // previous tile's readers of Ks, Vs and Ps are done
    load_tile(Ks, K + head_base, k0, S, row_stride, 1.0f);
    load_tile(Vs, V + head_base, k0, S, row_stride, 1.0f);
    __syncthreads();

    // Scores (already in log2 units) for query rows ty*4+i and keys tx+16*j; interleaving the
    // keys makes a quarter-warp read 8 consecutive K rows, conflict-free with kLdRow.
    float s[4][4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
#pragma unroll
      for (int j = 0; j < 4; ++j) s[i][j] = 0.0f;
    }
#pragma unroll 4
    for (int d = 0; d < kD; d += 4) {
      float4 qv[4], kv[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        qv[i] = *reinterpret_cast<const float4*>(&Qs[(ty * 4 + i) * kLdRow + d]);
      }
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        kv[j] = *reinterpret_cast<const float4*>(&Ks[(tx + 16 * j) * kLdRow + d]);
      }
#pragma unroll
      for (int i = 0; i < 4; ++i) {
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          s[i][j] = fmaf(qv[i].x, kv[j].x, s[i][j]);
          s[i][j] = fmaf(qv[i].y, kv[j].y, s[i][j]);
          s[i][j] = fmaf(qv[i].z, kv[j].z, s[i][j]);
          s[i][j] = fmaf(qv[i].w, kv[j].w, s[i][j]);
        }
      }
    }

#pragma unroll
    for (int j = 0; j < 4; ++j) {
      if (k0 + tx + 16 * j >= S) {
#pragma unroll
        for (int i = 0; i < 4; ++i) s[i][j] = -INFINITY;
      }
    }

    __syncthreads();  // all scores computed: the K tile's space now holds P

    // Online softmax update per row. Every tile holds at least one valid key, so the new max
    // is finite and exp2(-inf - finite) = 0 handles the first tile.
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      float tile_max = fmaxf(fmaxf(s[i][0], s[i][1]), fmaxf(s[i][2], s[i][3]));
      tile_max = group16_max(tile_max);
      const float m_new = fmaxf(m[i], tile_max);
      const float alpha = exp2f(m[i] - m_new);
      float row_sum = 0.0f;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const float p = exp2f(s[i][j] - m_new);
        row_sum += p;
        Ps[(ty * 4 + i) * kLdP + tx + 16 * j] = p;
      }
      row_sum = group16_sum(row_sum);
      l[i] = l[i] * alpha + row_sum;
      m[i] = m_new;
#pragma unroll
      for (int j = 0; j < 8; ++j) acc[i][j] *= alpha;
    }
    __syncthreads();

    // O rows ty*4+i, columns tx*4..+3 and 64+tx*4..+3 (contiguous across a quarter-warp).
#pragma unroll 2
    for (int kk = 0; kk < kBKV; kk += 4) {
      float4 pv[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        pv[i] = *reinterpret_cast<const float4*>(&Ps[(ty * 4 + i) * kLdP + kk]);
      }
#pragma unroll
      for (int t = 0; t < 4; ++t) {
        const float4 v0 = *reinterpret_cast<const float4*>(&Vs[(kk + t) * kLdRow + tx * 4]);
        const float4 v1 = *reinterpret_cast<const float4*>(&Vs[(kk + t) * kLdRow + 64 + tx * 4]);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const float p = t == 0 ? pv[i].x : t == 1 ? pv[i].y : t == 2 ? pv[i].z : pv[i].w;
          acc[i][0] = fmaf(p, v0.x, acc[i][0]);
          acc[i][1] = fmaf(p, v0.y, acc[i][1]);
          acc[i][2] = fmaf(p, v0.z, acc[i][2]);
          acc[i][3] = fmaf(p, v0.w, acc[i][3]);
          acc[i][4] = fmaf(p, v1.x, acc[i][4]);
          acc[i][5] = fmaf(p, v1.y, acc[i][5]);
          acc[i][6] = fmaf(p, v1.z, acc[i][6]);
          acc[i][7] = fmaf(p, v1.w, acc[i][7]);
        }
      }
    }
  }

  const float ln2 = 0.69314718055994531f;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int q = q0 + ty * 4 + i;
    if (q >= S) continue;
    const float inv_l = 1.0f / l[i];
    __nv_bfloat16* orow = O + head_base + static_cast<size_t>(q) * row_stride;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const float* a = &acc[i][half * 4];
      __nv_bfloat162 lo = __floats2bfloat162_rn(a[0] * inv_l, a[1] * inv_l);
      __nv_bfloat162 hi = __floats2bfloat162_rn(a[2] * inv_l, a[3] * inv_l);
      uint2 packed;
      packed.x = *reinterpret_cast<uint32_t*>(&lo);
      packed.y = *reinterpret_cast<uint32_t*>(&hi);
      *reinterpret_cast<uint2*>(orow + half * 64 + tx * 4) = packed;
    }
    if (tx == 0) {
      // m is in log2 units: log(sum exp(x)) = ln2 * (m + log2(l)).
      LSE[(static_cast<size_t>(b) * H + h) * S + q] = ln2 * (m[i] + log2f(l[i]));
    }
  }
}

}  // namespace

extern "C" int mha_fwd(const __nv_bfloat16* Q, const __nv_bfloat16* K, const __nv_bfloat16* V,
                       __nv_bfloat16* O, float* LSE, int B, int S, int H, int D,
                       cudaStream_t stream) {
  if (D != kD || B < 0 || S < 0 || H < 0) return static_cast<int>(cudaErrorInvalidValue);
  if (B == 0 || S == 0 || H == 0) return static_cast<int>(cudaGetLastError());
  if (H > 65535 || B > 65535) return static_cast<int>(cudaErrorInvalidValue);
  // Rows are loaded and stored as 16/8-byte vectors.
  const uintptr_t align = reinterpret_cast<uintptr_t>(Q) | reinterpret_cast<uintptr_t>(K) |
                          reinterpret_cast<uintptr_t>(V) | reinterpret_cast<uintptr_t>(O);
  if (align % 16 != 0) return static_cast<int>(cudaErrorInvalidValue);

  const cudaError_t attr = cudaFuncSetAttribute(mha_fwd_d128_kernel,
                                                cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                static_cast<int>(kSmemBytes));
  if (attr != cudaSuccess) return static_cast<int>(attr);

  const float scale_log2 =
      static_cast<float>(1.4426950408889634 / std::sqrt(static_cast<double>(kD)));
  const dim3 grid((S + kBQ - 1) / kBQ, H, B);
  mha_fwd_d128_kernel<<<grid, kThreads, kSmemBytes, stream>>>(Q, K, V, O, LSE, S, H, scale_log2);
  return static_cast<int>(cudaGetLastError());
}
