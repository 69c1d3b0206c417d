// Naive RMSNorm: the plain-CUDA example kernel of the ptxgym RMSNorm task (normalization
// category; a performance task).
//
//   x: [M, N] bf16, w: [N] bf16;  y[m, n] = x[m, n] / sqrt(mean_n(x[m, :]^2) + 1e-6) * w[n]
//
// One 256-thread block per row: the block reduces the row's sum of squares in float32 through
// shared memory, then every thread scales its strided slice of the row.

#include <cuda_runtime.h>
#include <cuda_bf16.h>

namespace {

constexpr int kThreads = 256;
constexpr float kEps = 1e-6f;

__global__ void rms_norm_kernel(const __nv_bfloat16* __restrict__ x,
                                const __nv_bfloat16* __restrict__ w,
                                __nv_bfloat16* __restrict__ y, int M, int N) {
  __shared__ float partial[kThreads];
  for (int row = blockIdx.x; row < M; row += gridDim.x) {
    const __nv_bfloat16* in = x + (size_t)row * N;
    __nv_bfloat16* out = y + (size_t)row * N;
    float squares = 0.0f;
    for (int n = threadIdx.x; n < N; n += kThreads) {
      float v = __bfloat162float(in[n]);
      squares += v * v;
    }
    partial[threadIdx.x] = squares;
    __syncthreads();
    for (int half = kThreads / 2; half > 0; half /= 2) {
      if (threadIdx.x < half) partial[threadIdx.x] += partial[threadIdx.x + half];
      __syncthreads();
    }
    float scale = rsqrtf(partial[0] / (float)N + kEps);
    __syncthreads();  // everyone has read partial[0] before the next row overwrites it
    for (int n = threadIdx.x; n < N; n += kThreads) {
      float v = __bfloat162float(in[n]) * scale * __bfloat162float(w[n]);
      out[n] = __float2bfloat16(v);
    }
  }
}

}  // namespace

extern "C" int rms_norm(const __nv_bfloat16* x, const __nv_bfloat16* w, __nv_bfloat16* y, int M,
                        int N, cudaStream_t stream) {
  if (M == 0) return 0;
  int blocks = M < 65535 ? M : 65535;
  rms_norm_kernel<<<blocks, kThreads, 0, stream>>>(x, w, y, M, N);
  return (int)cudaGetLastError();
}
