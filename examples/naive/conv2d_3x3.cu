// Naive 3x3 convolution as an implicit GEMM: the plain-CUDA example kernel of the ptxgym
// Conv2d3x3 task (convolution category). It is correct but does not use the tensor cores, so it
// does not qualify: the task asks for wgmma (H100) or tcgen05 MMA (B200).
//
//   x: [B, H, W, C] bf16 (NHWC);  wt: [F, 3, 3, C] bf16 (KRSC);  stride 1, zero padding 1
//   y[b, h, w, f] = sum_{r, s < 3} sum_c x[b, h + r - 1, w + s - 1, c] * wt[f, r, s, c]
//
// The GEMM view: row p = (b, h, w) of M = B*H*W, column f of N = F, reduction index
// k = (r*3 + s)*C + c of K = 9*C, for which wt is already a K-major [F, 9C] matrix and the
// "A" element (p, k) is the input pixel it names (zero outside the map). A shared-memory SIMT
// GEMM: 64x64 output tiles per 256-thread block, 4x4 per thread in float32, K in steps of 16.

#include <cuda_runtime.h>
#include <cuda_bf16.h>

namespace {

constexpr int kTile = 64;
constexpr int kStep = 16;
constexpr int kThreads = 256;

__global__ void __launch_bounds__(kThreads)
    conv2d_kernel(const __nv_bfloat16* __restrict__ x, const __nv_bfloat16* __restrict__ wt,
                  __nv_bfloat16* __restrict__ y, int B, int H, int W, int C, int F) {
  __shared__ float as[kStep][kTile];
  __shared__ float bs[kStep][kTile];
  const long long M = (long long)B * H * W;
  const int K = 9 * C;
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
  const long long p0 = (long long)blockIdx.y * kTile;
  const int f0 = blockIdx.x * kTile;
  float acc[4][4] = {};
  // This thread's loading row: its pixel (b, h, w) is fixed for the whole reduction.
  const int row = threadIdx.x % kTile, kq = (threadIdx.x / kTile) * 4;
  const long long p = p0 + row;
  const bool p_ok = p < M;
  const int pw = p_ok ? (int)(p % W) : 0;
  const int ph = p_ok ? (int)((p / W) % H) : 0;
  const int pb = p_ok ? (int)(p / ((long long)W * H)) : 0;
  for (int k0 = 0; k0 < K; k0 += kStep) {
    for (int i = 0; i < 4; ++i) {
      const int k = k0 + kq + i;
      float a = 0.0f, b = 0.0f;
      if (k < K) {
        const int c = k % C, tap = k / C;
        const int hh = ph + tap / 3 - 1, ww = pw + tap % 3 - 1;
        if (p_ok && hh >= 0 && hh < H && ww >= 0 && ww < W) {
          a = __bfloat162float(x[(((size_t)pb * H + hh) * W + ww) * C + c]);
        }
        if (f0 + row < F) b = __bfloat162float(wt[(size_t)(f0 + row) * K + k]);
      }
      as[kq + i][row] = a;
      bs[kq + i][row] = b;
    }
    __syncthreads();
    for (int kk = 0; kk < kStep; ++kk) {
      float a[4], b[4];
      for (int i = 0; i < 4; ++i) {
        a[i] = as[kk][ty * 4 + i];
        b[i] = bs[kk][tx * 4 + i];
      }
      for (int i = 0; i < 4; ++i)
        for (int j = 0; j < 4; ++j) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
    }
    __syncthreads();
  }
  for (int i = 0; i < 4; ++i) {
    const long long out = p0 + ty * 4 + i;
    if (out >= M) continue;
    for (int j = 0; j < 4; ++j) {
      const int f = f0 + tx * 4 + j;
      if (f < F) y[(size_t)out * F + f] = __float2bfloat16(acc[i][j]);
    }
  }
}

}  // namespace

extern "C" int conv2d_3x3(const __nv_bfloat16* x, const __nv_bfloat16* wt, __nv_bfloat16* y,
                          int B, int H, int W, int C, int F, cudaStream_t stream) {
  const long long M = (long long)B * H * W;
  if (M == 0 || F == 0) return 0;
  const long long tiles = (M + kTile - 1) / kTile;
  if (tiles > 65535) return (int)cudaErrorInvalidValue;
  const dim3 grid((F + kTile - 1) / kTile, (unsigned)tiles);
  conv2d_kernel<<<grid, kThreads, 0, stream>>>(x, wt, y, B, H, W, C, F);
  return (int)cudaGetLastError();
}
