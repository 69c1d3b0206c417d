// attack: cuDNN through its header
// expect: POLICY_VIOLATION
// stage: cpu
// defended: yes (static policy: cuDNN headers and names refused)
// why: cuDNN is the attention baseline; the same rule holds for every task.

#include <cuda_runtime.h>
#include <cuda_bf16.h>

#include <cudnn.h>

extern "C" int gemm(const __nv_bfloat16* A, const __nv_bfloat16* B, __nv_bfloat16* C, int M, int N,
                    int K, cudaStream_t stream) {
  cudnnHandle_t handle;
  return cudnnCreate(&handle);
}
