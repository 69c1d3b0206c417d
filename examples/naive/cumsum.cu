// Naive row-wise inclusive prefix sum: the plain-CUDA example kernel of the ptxgym CumSum task
// (scan category; a performance task).
//
//   x, y: [M, N] float32 row-major;  y[m, n] = sum over k <= n of x[m, k]
//
// One 256-thread block per row walks the row in chunks of 256: each chunk is scanned in shared
// memory (Hillis-Steele, log2(256) = 8 steps), the running total of the earlier chunks is added,
// and the chunk's last value becomes the new running total.

#include <cuda_runtime.h>

namespace {

constexpr int kThreads = 256;

__global__ void cumsum_kernel(const float* __restrict__ x, float* __restrict__ y, int M, int N) {
  __shared__ float chunk[kThreads];
  for (int row = blockIdx.x; row < M; row += gridDim.x) {
    const float* in = x + (size_t)row * N;
    float* out = y + (size_t)row * N;
    float carry = 0.0f;
    for (int base = 0; base < N; base += kThreads) {
      int n = base + threadIdx.x;
      chunk[threadIdx.x] = n < N ? in[n] : 0.0f;
      __syncthreads();
      for (int offset = 1; offset < kThreads; offset *= 2) {
        float add = threadIdx.x >= offset ? chunk[threadIdx.x - offset] : 0.0f;
        __syncthreads();
        chunk[threadIdx.x] += add;
        __syncthreads();
      }
      if (n < N) out[n] = carry + chunk[threadIdx.x];
      carry += chunk[kThreads - 1];
      __syncthreads();  // everyone has read chunk[] before the next chunk overwrites it
    }
  }
}

}  // namespace

extern "C" int cumsum(const float* x, float* y, int M, int N, cudaStream_t stream) {
  if (M == 0) return 0;
  int blocks = M < 65535 ? M : 65535;
  cumsum_kernel<<<blocks, kThreads, 0, stream>>>(x, y, M, N);
  return (int)cudaGetLastError();
}
