// Naive GELU (erf form): the plain-CUDA example kernel of the ptxgym GELU task (elementwise
// category; a performance task, no instruction family required).
//
//   x, y: [M, N] bf16, row-major.   y = 0.5 * x * (1 + erf(x / sqrt(2)))
//
// One thread per element, computed in float32 and rounded once to bf16; a grid-stride loop so
// any M * N fits the grid.

#include <cuda_runtime.h>
#include <cuda_bf16.h>

namespace {

__global__ void gelu_kernel(const __nv_bfloat16* __restrict__ x, __nv_bfloat16* __restrict__ y,
                            long long count) {
  long long stride = (long long)gridDim.x * blockDim.x;
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < count; i += stride) {
    float v = __bfloat162float(x[i]);
    y[i] = __float2bfloat16(0.5f * v * (1.0f + erff(v * 0.70710678118654752f)));
  }
}

}  // namespace

extern "C" int gelu(const __nv_bfloat16* x, __nv_bfloat16* y, int M, int N, cudaStream_t stream) {
  long long count = (long long)M * N;
  if (count == 0) return 0;
  long long blocks = (count + 255) / 256;
  if (blocks > 65536) blocks = 65536;
  gelu_kernel<<<(unsigned)blocks, 256, 0, stream>>>(x, y, count);
  return (int)cudaGetLastError();
}
