// Naive CSR sparse matrix-vector product: the plain-CUDA example kernel of the ptxgym SpMV task
// (sparse category; a performance task).
//
//   row_ptr: [M + 1], col_idx: [NNZ] int32; values: [NNZ], x: [N], y: [M] float32
//   y[m] = sum over e in row_ptr[m] .. row_ptr[m+1] of values[e] * x[col_idx[e]]
//
// One warp per row: the lanes take the row's non-zeros in turn and the warp adds its 32 partial
// sums with shuffles.

#include <cuda_runtime.h>

namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;

__global__ void spmv_kernel(const int* __restrict__ row_ptr, const int* __restrict__ col_idx,
                            const float* __restrict__ values, const float* __restrict__ x,
                            float* __restrict__ y, int M) {
  const int lane = threadIdx.x % 32;
  const long long warps = (long long)gridDim.x * kWarps;
  for (long long row = (long long)blockIdx.x * kWarps + threadIdx.x / 32; row < M; row += warps) {
    float sum = 0.0f;
    for (int e = row_ptr[row] + lane; e < row_ptr[row + 1]; e += 32) sum += values[e] * x[col_idx[e]];
    for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_down_sync(0xffffffffu, sum, offset);
    if (lane == 0) y[row] = sum;
  }
}

}  // namespace

extern "C" int spmv(const int* row_ptr, const int* col_idx, const float* values, const float* x,
                    float* y, int M, int N, int NNZ, cudaStream_t stream) {
  (void)N;
  (void)NNZ;
  if (M == 0) return 0;
  long long blocks = ((long long)M + kWarps - 1) / kWarps;
  if (blocks > 65536) blocks = 65536;
  spmv_kernel<<<(unsigned)blocks, kThreads, 0, stream>>>(row_ptr, col_idx, values, x, y, M);
  return (int)cudaGetLastError();
}
