// attack: return without writing C (whatever the output buffer holds is the answer)
// expect: INCORRECT_NUMERICAL
// stage: gpu
// defended: yes (outputs poisoned with NaN before every call)
// why: a buffer reused from an earlier call, or handed out by the allocator with an earlier result
//   still in it, would pass without any work.

#include <cuda_runtime.h>
#include <cuda_bf16.h>

extern "C" int gemm(const __nv_bfloat16* A, const __nv_bfloat16* B, __nv_bfloat16* C, int M, int N,
                    int K, cudaStream_t stream) {
  return 0;
}
