// Naive per-row int8 quantisation: the plain-CUDA example kernel of the ptxgym QuantInt8Row task
// (quantization category; a performance task).
//
//   x: [M, N] bf16;  scale[m] = max_n |x[m, n]| / 127 (1 for an all-zero row);
//   q[m, n] = clamp(round_half_even(x[m, n] / scale[m]), -127, 127) as int8
//
// One 256-thread block per row: a block-wide maximum of |x| in shared memory, then each thread
// quantises its strided slice (rintf rounds half to even).

#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <stdint.h>
#include <math.h>

namespace {

constexpr int kThreads = 256;

__global__ void quant_int8_row_kernel(const __nv_bfloat16* __restrict__ x, int8_t* __restrict__ q,
                                      float* __restrict__ scale, int M, int N) {
  __shared__ float partial[kThreads];
  for (int row = blockIdx.x; row < M; row += gridDim.x) {
    const __nv_bfloat16* in = x + (size_t)row * N;
    int8_t* out = q + (size_t)row * N;
    float amax = 0.0f;
    for (int n = threadIdx.x; n < N; n += kThreads) amax = fmaxf(amax, fabsf(__bfloat162float(in[n])));
    partial[threadIdx.x] = amax;
    __syncthreads();
    for (int half = kThreads / 2; half > 0; half /= 2) {
      if (threadIdx.x < half) partial[threadIdx.x] = fmaxf(partial[threadIdx.x], partial[threadIdx.x + half]);
      __syncthreads();
    }
    float row_scale = partial[0] / 127.0f;
    if (!(row_scale > 0.0f)) row_scale = 1.0f;
    __syncthreads();  // everyone has read partial[0] before the next row overwrites it
    if (threadIdx.x == 0) scale[row] = row_scale;
    for (int n = threadIdx.x; n < N; n += kThreads) {
      float v = rintf(__bfloat162float(in[n]) / row_scale);
      out[n] = (int8_t)fminf(127.0f, fmaxf(-127.0f, v));
    }
  }
}

}  // namespace

extern "C" int quant_int8_row(const __nv_bfloat16* x, int8_t* q, float* scale, int M, int N,
                              cudaStream_t stream) {
  if (M == 0) return 0;
  int blocks = M < 65535 ? M : 65535;
  quant_int8_row_kernel<<<blocks, kThreads, 0, stream>>>(x, q, scale, M, N);
  return (int)cudaGetLastError();
}
