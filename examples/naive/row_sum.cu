// Naive row sums: the plain-CUDA example kernel of the ptxgym RowSum task (reduction category;
// a performance task).
//
//   x: [M, N] bf16 row-major;  s: [M] float32,  s[m] = sum over n of x[m, n]
//
// One 256-thread block per row (a grid-stride loop over rows): each thread sums a strided slice
// of the row in float32, then the block adds the 256 partial sums in shared memory.

#include <cuda_runtime.h>
#include <cuda_bf16.h>

namespace {

constexpr int kThreads = 256;

__global__ void row_sum_kernel(const __nv_bfloat16* __restrict__ x, float* __restrict__ s,
                               int M, int N) {
  __shared__ float partial[kThreads];
  for (int row = blockIdx.x; row < M; row += gridDim.x) {
    const __nv_bfloat16* line = x + (size_t)row * N;
    float sum = 0.0f;
    for (int n = threadIdx.x; n < N; n += kThreads) sum += __bfloat162float(line[n]);
    partial[threadIdx.x] = sum;
    __syncthreads();
    for (int half = kThreads / 2; half > 0; half /= 2) {
      if (threadIdx.x < half) partial[threadIdx.x] += partial[threadIdx.x + half];
      __syncthreads();
    }
    if (threadIdx.x == 0) s[row] = partial[0];
    __syncthreads();  // partial[] is reused by the next row
  }
}

}  // namespace

extern "C" int row_sum(const __nv_bfloat16* x, float* s, int M, int N, cudaStream_t stream) {
  if (M == 0) return 0;
  int blocks = M < 65535 ? M : 65535;
  row_sum_kernel<<<blocks, kThreads, 0, stream>>>(x, s, M, N);
  return (int)cudaGetLastError();
}
