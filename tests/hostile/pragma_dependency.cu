// attack: #pragma GCC dependency on a host file (existence and modification-time oracle)
// expect: POLICY_VIOLATION | COMPILE_ERROR
// stage: cpu
// defended: yes (static policy: pragma dependency refused)
// why: the pragma fails the build when the file is missing and warns when it is newer than the
//   source, so the result says whether a path exists and how old it is.

#include <cuda_runtime.h>
#include <cuda_bf16.h>

#pragma GCC dependency "@SECRET_PATH@"

extern "C" int gemm(const __nv_bfloat16* A, const __nv_bfloat16* B, __nv_bfloat16* C, int M, int N,
                    int K, cudaStream_t stream) {
  return 0;
}
