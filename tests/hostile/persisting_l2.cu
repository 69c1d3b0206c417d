// attack: persisting-L2 carve-out: pin B in L2 across calls with an access-policy window
// expect: PASSED | INCORRECT_NUMERICAL | RUNTIME_ERROR
// stage: gpu
// defended: yes (before every timed call the timer sets the persisting limit to 0 and resets
//   persisting lines)
// max_speedup: 0.5
// why: lines marked persisting survive an ordinary L2 flush (gpu-mode pygpubench PR #49), so the
//   next call would read B from L2; this kernel sets the limit and the window on every call and
//   never resets them.

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

static cudaDeviceProp g_properties;
static bool g_have_properties = false;

extern "C" int gemm(const __nv_bfloat16* A, const __nv_bfloat16* B, __nv_bfloat16* C, int M, int N,
                    int K, cudaStream_t stream) {
  if (!g_have_properties) {
    int device = 0;
    cudaGetDevice(&device);
    cudaGetDeviceProperties(&g_properties, device);
    g_have_properties = true;
  }
  const size_t b_bytes = static_cast<size_t>(N) * K * sizeof(__nv_bfloat16);
  cudaDeviceSetLimit(cudaLimitPersistingL2CacheSize, g_properties.persistingL2CacheMaxSize);
  cudaStreamAttrValue window = {};
  window.accessPolicyWindow.base_ptr = const_cast<__nv_bfloat16*>(B);
  window.accessPolicyWindow.num_bytes =
      b_bytes < static_cast<size_t>(g_properties.accessPolicyMaxWindowSize)
          ? b_bytes
          : static_cast<size_t>(g_properties.accessPolicyMaxWindowSize);
  window.accessPolicyWindow.hitRatio = 1.0f;
  window.accessPolicyWindow.hitProp = cudaAccessPropertyPersisting;
  window.accessPolicyWindow.missProp = cudaAccessPropertyStreaming;
  cudaStreamSetAttribute(stream, cudaStreamAttributeAccessPolicyWindow, &window);
  cudaGetLastError();  // a GPU without the feature: carry on without it
  return honest_gemm(A, B, C, M, N, K, stream);
}
