// attack: #import (the GCC extension) of a host file
// expect: POLICY_VIOLATION | COMPILE_ERROR
// stage: cpu
// defended: yes (static policy: #import checked like #include)
// why: #import is #include-once; a scan for #include alone would let it through.

#include <cuda_runtime.h>
#include <cuda_bf16.h>

#import "@SECRET_PATH@"
static_assert(false, HOSTILE_SECRET);

extern "C" int gemm(const __nv_bfloat16* A, const __nv_bfloat16* B, __nv_bfloat16* C, int M, int N,
                    int K, cudaStream_t stream) {
  return 0;
}
