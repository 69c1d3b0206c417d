// Naive row softmax: the plain-CUDA example kernel of the ptxgym Softmax task (softmax category;
// a performance task).
//
//   x, p: [M, N] bf16 row-major;  p[m, n] = exp(x[m, n] - max_m) / sum_k exp(x[m, k] - max_m)
//
// One 256-thread block per row, three passes over the row: the block's maximum, the sum of
// exponentials (float32), then the normalised values. Each pass reduces through shared memory.

#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <math.h>

namespace {

constexpr int kThreads = 256;

// The block-wide maximum (max = true) or sum of `value`; every thread gets the result.
__device__ float block_reduce(float value, bool max, float* scratch) {
  scratch[threadIdx.x] = value;
  __syncthreads();
  for (int half = kThreads / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) {
      float other = scratch[threadIdx.x + half];
      scratch[threadIdx.x] = max ? fmaxf(scratch[threadIdx.x], other) : scratch[threadIdx.x] + other;
    }
    __syncthreads();
  }
  float result = scratch[0];
  __syncthreads();  // scratch is reused by the next reduction
  return result;
}

__global__ void softmax_kernel(const __nv_bfloat16* __restrict__ x, __nv_bfloat16* __restrict__ p,
                               int M, int N) {
  __shared__ float scratch[kThreads];
  for (int row = blockIdx.x; row < M; row += gridDim.x) {
    const __nv_bfloat16* in = x + (size_t)row * N;
    __nv_bfloat16* out = p + (size_t)row * N;
    float local_max = -INFINITY;
    for (int n = threadIdx.x; n < N; n += kThreads) local_max = fmaxf(local_max, __bfloat162float(in[n]));
    float row_max = block_reduce(local_max, true, scratch);
    float local_sum = 0.0f;
    for (int n = threadIdx.x; n < N; n += kThreads) local_sum += expf(__bfloat162float(in[n]) - row_max);
    float inverse = 1.0f / block_reduce(local_sum, false, scratch);
    for (int n = threadIdx.x; n < N; n += kThreads) {
      out[n] = __float2bfloat16(expf(__bfloat162float(in[n]) - row_max) * inverse);
    }
  }
}

}  // namespace

extern "C" int softmax(const __nv_bfloat16* x, __nv_bfloat16* p, int M, int N, cudaStream_t stream) {
  if (M == 0) return 0;
  int blocks = M < 65535 ? M : 65535;
  softmax_kernel<<<blocks, kThreads, 0, stream>>>(x, p, M, N);
  return (int)cudaGetLastError();
}
