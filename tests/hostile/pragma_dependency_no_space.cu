// attack: #pragma GCC dependency with no space before its string (dependency"/path")
// expect: POLICY_VIOLATION | COMPILE_ERROR
// stage: cpu
// defended: yes (the policy tokenises the pragma as the compiler does)
// why: a scan that split the pragma on spaces saw one word "dependency"/path"" and let it through,
//   a file-existence oracle.

#include <cuda_runtime.h>
#include <cuda_bf16.h>

#pragma GCC dependency"@SECRET_PATH@"

extern "C" int gemm(const __nv_bfloat16* A, const __nv_bfloat16* B, __nv_bfloat16* C, int M, int N,
                    int K, cudaStream_t stream) {
  return 0;
}
