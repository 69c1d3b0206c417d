// Naive GEMM: the plain-CUDA baseline kernel for the ptxgym GEMM task (no inline PTX, no tensor
// cores, no libraries).
//
//   C[M, N] = A[M, K] * B[N, K]^T     A, B, C bf16 row-major (A and B K-major), fp32 accumulate
//
// Classic shared-memory SIMT GEMM: each 256-thread block computes a 128x128 tile of C in steps of
// 16 along K; each thread owns an 8x8 sub-tile held in registers (FFMA only). Operand tiles are
// converted to fp32 and stored K-major in shared memory (double-buffered), and the next tile is
// prefetched from global memory into registers while the current one is multiplied. Any M, N, K
// is handled: loads past the edges read zeros and stores past the edges are skipped.

#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cstdint>

namespace {

constexpr int kBM = 128;       // block tile rows (M)
constexpr int kBN = 128;       // block tile columns (N)
constexpr int kBK = 16;        // K step per shared-memory tile
constexpr int kThreads = 256;  // 16 x 16 threads, each an 8x8 sub-tile
// Row stride of the K-major shared tiles: +4 floats keeps 16-byte alignment for float4 reads.
constexpr int kLds = kBM + 4;

static_assert(kBM == kBN, "the loader below assumes square block tiles");
static_assert(kBM * kBK == kThreads * 8, "each thread loads one 8-element vector per operand");

// Loads 8 consecutive bf16 of row `row` starting at column `k` of a row-major [rows, K] matrix,
// as raw bits; anything outside the matrix reads as zero (bf16 zero is all-zero bits).
__device__ __forceinline__ uint4 load_row8(const __nv_bfloat16* __restrict__ x, int rows, int K,
                                           int row, int k, bool vec_ok) {
  uint4 r = make_uint4(0u, 0u, 0u, 0u);
  if (row >= rows || k >= K) return r;
  const __nv_bfloat16* p = x + static_cast<size_t>(row) * K + k;
  if (vec_ok && k + 8 <= K) return __ldg(reinterpret_cast<const uint4*>(p));
  __nv_bfloat16 h[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) h[i] = (k + i < K) ? p[i] : __float2bfloat16(0.0f);
  const uint32_t* w = reinterpret_cast<const uint32_t*>(h);
  r.x = w[0];
  r.y = w[1];
  r.z = w[2];
  r.w = w[3];
  return r;
}

// Writes 8 bf16 (raw bits) as fp32 into column `col`, rows k0..k0+7 of a K-major tile.
__device__ __forceinline__ void store_col8(float (*tile)[kLds], int k0, int col, uint4 v) {
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    __nv_bfloat162 pair;
    pair.x = __ushort_as_bfloat16(static_cast<unsigned short>(w[i] & 0xffffu));
    pair.y = __ushort_as_bfloat16(static_cast<unsigned short>(w[i] >> 16));
    const float2 f = __bfloat1622float2(pair);
    tile[k0 + 2 * i][col] = f.x;
    tile[k0 + 2 * i + 1][col] = f.y;
  }
}

__global__ void __launch_bounds__(kThreads, 2)
    gemm_tn_kernel(const __nv_bfloat16* __restrict__ A, const __nv_bfloat16* __restrict__ B,
                   __nv_bfloat16* __restrict__ C, int M, int N, int K, bool vec_ab, bool vec_c) {
  __shared__ __align__(16) float As[2][kBK][kLds];
  __shared__ __align__(16) float Bs[2][kBK][kLds];

  const int tid = threadIdx.x;
  const int tx = tid % 16;  // column group
  const int ty = tid / 16;  // row group
  const int m0 = blockIdx.y * kBM;
  const int n0 = blockIdx.x * kBN;

  // Loader mapping: 32 consecutive threads take 32 consecutive rows of one 8-wide K slice, so
  // the transposing shared-memory stores of a warp hit 32 distinct banks.
  const int ld_row = tid % kBM;
  const int ld_k = (tid / kBM) * 8;

  float acc[8][8];
#pragma unroll
  for (int i = 0; i < 8; ++i) {
#pragma unroll
    for (int j = 0; j < 8; ++j) acc[i][j] = 0.0f;
  }

  const int num_k_tiles = (K + kBK - 1) / kBK;
  if (num_k_tiles > 0) {
    uint4 a_reg = load_row8(A, M, K, m0 + ld_row, ld_k, vec_ab);
    uint4 b_reg = load_row8(B, N, K, n0 + ld_row, ld_k, vec_ab);
    store_col8(As[0], ld_k, ld_row, a_reg);
    store_col8(Bs[0], ld_k, ld_row, b_reg);
    __syncthreads();

    for (int kt = 0; kt < num_k_tiles; ++kt) {
      const int cur = kt & 1;
      const bool has_next = kt + 1 < num_k_tiles;
      if (has_next) {
        // Issue the next tile's global loads before the math so their latency is hidden.
        const int k_next = (kt + 1) * kBK + ld_k;
        a_reg = load_row8(A, M, K, m0 + ld_row, k_next, vec_ab);
        b_reg = load_row8(B, N, K, n0 + ld_row, k_next, vec_ab);
      }

#pragma unroll
      for (int kk = 0; kk < kBK; ++kk) {
        // Rows ty*4..+3 and 64+ty*4..+3, columns tx*4..+3 and 64+tx*4..+3: the split layout
        // makes the 16 column groups of a warp read one contiguous 256-byte span.
        const float4 a0 = *reinterpret_cast<const float4*>(&As[cur][kk][ty * 4]);
        const float4 a1 = *reinterpret_cast<const float4*>(&As[cur][kk][64 + ty * 4]);
        const float4 b0 = *reinterpret_cast<const float4*>(&Bs[cur][kk][tx * 4]);
        const float4 b1 = *reinterpret_cast<const float4*>(&Bs[cur][kk][64 + tx * 4]);
        const float a[8] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w};
        const float b[8] = {b0.x, b0.y, b0.z, b0.w, b1.x, b1.y, b1.z, b1.w};
#pragma unroll
        for (int i = 0; i < 8; ++i) {
#pragma unroll
          for (int j = 0; j < 8; ++j) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
        }
      }

      if (has_next) {
        // The other buffer was last read in the previous iteration, which every thread finished
        // before the barrier that ended it, so it can be overwritten now.
        store_col8(As[cur ^ 1], ld_k, ld_row, a_reg);
        store_col8(Bs[cur ^ 1], ld_k, ld_row, b_reg);
      }
      __syncthreads();
    }
  }

#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const int m = m0 + (i < 4 ? ty * 4 + i : 64 + ty * 4 + (i - 4));
    if (m >= M) continue;
    __nv_bfloat16* crow = C + static_cast<size_t>(m) * N;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int n = n0 + half * 64 + tx * 4;
      const float* v = &acc[i][half * 4];
      if (vec_c && n + 4 <= N) {
        // Four bf16 = 8 bytes; aligned because N % 4 == 0 and n % 4 == 0.
        __nv_bfloat162 lo = __floats2bfloat162_rn(v[0], v[1]);
        __nv_bfloat162 hi = __floats2bfloat162_rn(v[2], v[3]);
        uint2 packed;
        packed.x = *reinterpret_cast<uint32_t*>(&lo);
        packed.y = *reinterpret_cast<uint32_t*>(&hi);
        *reinterpret_cast<uint2*>(crow + n) = packed;
      } else {
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          if (n + j < N) crow[n + j] = __float2bfloat16(v[j]);
        }
      }
    }
  }
}

}  // namespace

extern "C" int gemm(const __nv_bfloat16* A, const __nv_bfloat16* B, __nv_bfloat16* C, int M,
                    int N, int K, cudaStream_t stream) {
  if (M < 0 || N < 0 || K < 0) return static_cast<int>(cudaErrorInvalidValue);
  if (M == 0 || N == 0) return static_cast<int>(cudaGetLastError());
  const int grid_y = (M + kBM - 1) / kBM;
  if (grid_y > 65535) return static_cast<int>(cudaErrorInvalidValue);
  // 16-byte vector loads need 16-byte aligned rows: K % 8 == 0 and aligned base pointers.
  const bool vec_ab = (K % 8 == 0) && (reinterpret_cast<uintptr_t>(A) % 16 == 0) &&
                      (reinterpret_cast<uintptr_t>(B) % 16 == 0);
  const bool vec_c = (N % 4 == 0) && (reinterpret_cast<uintptr_t>(C) % 8 == 0);
  const dim3 grid((N + kBN - 1) / kBN, grid_y);
  gemm_tn_kernel<<<grid, kThreads, 0, stream>>>(A, B, C, M, N, K, vec_ab, vec_c);
  return static_cast<int>(cudaGetLastError());
}
