// Naive cross-entropy: the plain-CUDA example kernel of the ptxgym CrossEntropy task (loss
// category; a performance task).
//
//   z: [M, V] bf16 logits, target: [M] int32;  loss[m] = log(sum_v exp(z[m, v])) - z[m, target[m]]
//
// One 256-thread block per row, two passes over the row: the maximum, then the sum of
// exponentials shifted by it (float32), each reduced through shared memory.

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
  __syncthreads();
  return result;
}

__global__ void cross_entropy_kernel(const __nv_bfloat16* __restrict__ z,
                                     const int* __restrict__ target, float* __restrict__ loss,
                                     int M, int V) {
  __shared__ float scratch[kThreads];
  for (int row = blockIdx.x; row < M; row += gridDim.x) {
    const __nv_bfloat16* logits = z + (size_t)row * V;
    float local_max = -INFINITY;
    for (int v = threadIdx.x; v < V; v += kThreads) local_max = fmaxf(local_max, __bfloat162float(logits[v]));
    float row_max = block_reduce(local_max, true, scratch);
    float local_sum = 0.0f;
    for (int v = threadIdx.x; v < V; v += kThreads) local_sum += expf(__bfloat162float(logits[v]) - row_max);
    float total = block_reduce(local_sum, false, scratch);
    if (threadIdx.x == 0) {
      loss[row] = row_max + logf(total) - __bfloat162float(logits[target[row]]);
    }
  }
}

}  // namespace

extern "C" int cross_entropy(const __nv_bfloat16* z, const int* target, float* loss, int M, int V,
                             cudaStream_t stream) {
  if (M == 0) return 0;
  int blocks = M < 65535 ? M : 65535;
  cross_entropy_kernel<<<blocks, kThreads, 0, stream>>>(z, target, loss, M, V);
  return (int)cudaGetLastError();
}
