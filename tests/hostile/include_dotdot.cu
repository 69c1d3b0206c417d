// attack: include a host file through a relative path with ..
// expect: POLICY_VIOLATION | COMPILE_ERROR
// stage: cpu
// defended: yes (static policy: .. in an include refused)
// why: enough ../ from the build folder reach / and then any absolute path.

#include <cuda_runtime.h>
#include <cuda_bf16.h>

#include "../../../../../../../../../../..@SECRET_PATH@"
static_assert(false, HOSTILE_SECRET);

extern "C" int gemm(const __nv_bfloat16* A, const __nv_bfloat16* B, __nv_bfloat16* C, int M, int N,
                    int K, cudaStream_t stream) {
  return 0;
}
