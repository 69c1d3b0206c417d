// Naive SwiGLU (a gated MLP's first half): the plain-CUDA example kernel of the ptxgym SwiGLU
// task (fused category). It is correct but does not use the tensor cores, so it does not
// qualify: the task asks for wgmma (H100) or tcgen05 MMA (B200).
//
//   X: [M, K] bf16;  Wg, Wu: [N, K] bf16 (K-major);  H = silu(X Wg^T) * (X Wu^T)  bf16 [M, N]
//
// A shared-memory SIMT GEMM computing both products at once: each 256-thread block owns a 64x64
// tile of H, each thread a 4x4 sub-tile of the gate and of the up product in float32 registers;
// tiles of X, Wg and Wu advance 16 along K through shared memory. The epilogue applies
// silu(gate) * up in float32 and rounds once to bf16. Edges read zeros and skip stores.

#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <math.h>

namespace {

constexpr int kTile = 64;  // rows and columns of H per block
constexpr int kStep = 16;  // K per shared-memory tile
constexpr int kThreads = 256;

// Element (row, k) of a row-major [rows, K] bf16 matrix as float, zero outside it.
__device__ __forceinline__ float at(const __nv_bfloat16* __restrict__ m, int rows, int K, int row,
                                    int k) {
  return (row < rows && k < K) ? __bfloat162float(m[(size_t)row * K + k]) : 0.0f;
}

__global__ void __launch_bounds__(kThreads)
    swiglu_kernel(const __nv_bfloat16* __restrict__ X, const __nv_bfloat16* __restrict__ Wg,
                  const __nv_bfloat16* __restrict__ Wu, __nv_bfloat16* __restrict__ H, int M,
                  int N, int K) {
  // K-major tiles: [k][row], so a thread's 4 consecutive rows are 4 consecutive floats.
  __shared__ float xs[kStep][kTile];
  __shared__ float gs[kStep][kTile];
  __shared__ float us[kStep][kTile];
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
  const int m0 = blockIdx.y * kTile, n0 = blockIdx.x * kTile;
  float gate[4][4] = {}, up[4][4] = {};
  for (int k0 = 0; k0 < K; k0 += kStep) {
    // 64 x 16 elements per tile, 4 per thread: thread t loads row t % 64 at k t / 64 * 4 + i.
    const int row = threadIdx.x % kTile, kq = (threadIdx.x / kTile) * 4;
    for (int i = 0; i < 4; ++i) {
      xs[kq + i][row] = at(X, M, K, m0 + row, k0 + kq + i);
      gs[kq + i][row] = at(Wg, N, K, n0 + row, k0 + kq + i);
      us[kq + i][row] = at(Wu, N, K, n0 + row, k0 + kq + i);
    }
    __syncthreads();
    for (int kk = 0; kk < kStep; ++kk) {
      float a[4], g[4], u[4];
      for (int i = 0; i < 4; ++i) {
        a[i] = xs[kk][ty * 4 + i];
        g[i] = gs[kk][tx * 4 + i];
        u[i] = us[kk][tx * 4 + i];
      }
      for (int i = 0; i < 4; ++i) {
        for (int j = 0; j < 4; ++j) {
          gate[i][j] = fmaf(a[i], g[j], gate[i][j]);
          up[i][j] = fmaf(a[i], u[j], up[i][j]);
        }
      }
    }
    __syncthreads();  // the tiles are overwritten by the next step
  }
  for (int i = 0; i < 4; ++i) {
    const int m = m0 + ty * 4 + i;
    if (m >= M) continue;
    for (int j = 0; j < 4; ++j) {
      const int n = n0 + tx * 4 + j;
      if (n >= N) continue;
      const float z = gate[i][j];
      H[(size_t)m * N + n] = __float2bfloat16(z / (1.0f + expf(-z)) * up[i][j]);
    }
  }
}

}  // namespace

extern "C" int swiglu(const __nv_bfloat16* X, const __nv_bfloat16* Wg, const __nv_bfloat16* Wu,
                      __nv_bfloat16* H, int M, int N, int K, cudaStream_t stream) {
  if (M == 0 || N == 0) return 0;
  if ((M + kTile - 1) / kTile > 65535) return (int)cudaErrorInvalidValue;
  const dim3 grid((N + kTile - 1) / kTile, (M + kTile - 1) / kTile);
  swiglu_kernel<<<grid, kThreads, 0, stream>>>(X, Wg, Wu, H, M, N, K);
  return (int)cudaGetLastError();
}
