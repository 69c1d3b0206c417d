// attack: cuBLAS through its header
// expect: POLICY_VIOLATION
// stage: cpu
// defended: yes (static policy: cuBLAS headers and names refused)
// why: cuBLAS is the baseline: a kernel that calls it is not the model's kernel, whatever its
//   speed.

#include <cuda_runtime.h>
#include <cuda_bf16.h>

#include <cublas_v2.h>

extern "C" int gemm(const __nv_bfloat16* A, const __nv_bfloat16* B, __nv_bfloat16* C, int M, int N,
                    int K, cudaStream_t stream) {
  cublasHandle_t handle;
  return cublasCreate(&handle);
}
