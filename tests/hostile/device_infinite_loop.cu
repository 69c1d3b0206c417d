// attack: infinite loop in device code
// expect: TIMEOUT
// stage: gpu
// defended: yes (per-stage deadline; the worker and its CUDA context are killed)
// why: the kernel spins on a flag nobody sets; the caller's synchronisation never returns, and the
//   GPU is busy until the context is destroyed.

#include <cuda_runtime.h>
#include <cuda_bf16.h>

__global__ void spin_forever(volatile int* flag) {
  while (*flag == 0) {
  }
}

static int* g_flag = nullptr;

extern "C" int gemm(const __nv_bfloat16* A, const __nv_bfloat16* B, __nv_bfloat16* C, int M, int N,
                    int K, cudaStream_t stream) {
  if (g_flag == nullptr && cudaMalloc(&g_flag, sizeof(int)) != cudaSuccess) return 1;
  cudaMemsetAsync(g_flag, 0, sizeof(int), stream);
  spin_forever<<<1, 1, 0, stream>>>(g_flag);
  return static_cast<int>(cudaGetLastError());
}
