// attack: infinite loop in host code
// expect: TIMEOUT
// stage: gpu
// defended: yes (per-stage deadline; the worker is killed)
// why: the call never returns; without a deadline the step, and the episode, would hang.

#include <cuda_runtime.h>
#include <cuda_bf16.h>

extern "C" int gemm(const __nv_bfloat16* A, const __nv_bfloat16* B, __nv_bfloat16* C, int M, int N,
                    int K, cudaStream_t stream) {
  volatile int spin = 1;
  while (spin) {
  }
  return 0;
}
