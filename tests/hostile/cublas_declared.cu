// attack: cuBLAS through hand-written declarations (no header)
// expect: POLICY_VIOLATION | COMPILE_ERROR
// stage: cpu
// defended: yes (static policy: cuBLAS names refused anywhere; the link also refuses undefined
//   symbols)
// why: declaring the C entry points by hand needs no header; the symbols would resolve at load time
//   against the cuBLAS that torch has already loaded in the worker.

#include <cuda_runtime.h>
#include <cuda_bf16.h>

extern "C" int cublasCreate_v2(void** handle);

extern "C" int gemm(const __nv_bfloat16* A, const __nv_bfloat16* B, __nv_bfloat16* C, int M, int N,
                    int K, cudaStream_t stream) {
  void* handle = nullptr;
  return cublasCreate_v2(&handle);
}
