// attack: skip the work in the timed loop except on the call the old protocol checked
// expect: INCORRECT_NUMERICAL
// stage: gpu
// defended: yes (the outputs of three timed calls chosen at random are checked)
// why: the worker calls the entry point in a fixed pattern: 4 correctness calls, 10 warm-up calls,
//   3 x 50 timed calls, and (before issue 8) only the last timed call's output was checked. A
//   call counter lets a kernel be honest exactly where it is checked and return at once
//   elsewhere, leaving the output untouched: a near-zero median latency, PASSED at an absurd
//   speedup. Stopped because the judge now checks the outputs of three timed calls it picks at
//   random per evaluation; every timed call but the last skips its work here, so any pick other
//   than the last finds the poisoned output (with any protocol length, as in the GPU tests'
//   shortened one).

#include <cuda_runtime.h>
#include <cuda_bf16.h>

// Honest work: one thread per element of C over 32x32 shared-memory tiles, fp32 accumulation.
// Correct, and far slower than cuBLAS: a speedup anywhere near 1 is the attack's, not this code's.
__global__ void honest_gemm_kernel(const __nv_bfloat16* A, const __nv_bfloat16* B,
                                   __nv_bfloat16* C, int M, int N, int K) {
  __shared__ float As[32][33];
  __shared__ float Bs[32][33];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int m = blockIdx.y * 32 + ty, n = blockIdx.x * 32 + tx, nb = blockIdx.x * 32 + ty;
  float acc = 0.0f;
  for (int k0 = 0; k0 < K; k0 += 32) {
    const int k = k0 + tx;
    As[ty][tx] = (m < M && k < K) ? __bfloat162float(A[static_cast<size_t>(m) * K + k]) : 0.0f;
    Bs[ty][tx] = (nb < N && k < K) ? __bfloat162float(B[static_cast<size_t>(nb) * K + k]) : 0.0f;
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < 32; ++kk) acc = fmaf(As[ty][kk], Bs[tx][kk], acc);
    __syncthreads();
  }
  if (m < M && n < N) C[static_cast<size_t>(m) * N + n] = __float2bfloat16(acc);
}

static int honest_gemm(const __nv_bfloat16* A, const __nv_bfloat16* B, __nv_bfloat16* C, int M,
                       int N, int K, cudaStream_t stream) {
  const dim3 block(32, 32), grid((N + 31) / 32, (M + 31) / 32);
  honest_gemm_kernel<<<grid, block, 0, stream>>>(A, B, C, M, N, K);
  return static_cast<int>(cudaGetLastError());
}

namespace {
// The full protocol's calls, in order: correctness (4), warm-up (10), timed (150). Honest in the
// correctness stage and on the last call (the one the old protocol checked), skipping elsewhere.
int g_calls = 0;
constexpr int kHonestCalls = 4;
constexpr int kLastCall = 164;
}  // namespace

extern "C" int gemm(const __nv_bfloat16* A, const __nv_bfloat16* B, __nv_bfloat16* C, int M, int N,
                    int K, cudaStream_t stream) {
  ++g_calls;
  if (g_calls > kHonestCalls && g_calls != kLastCall) return 0;  // skip: nothing written
  return honest_gemm(A, B, C, M, N, K, stream);
}
