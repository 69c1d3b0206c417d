// attack: raise(SIGKILL) from the entry point
// expect: POLICY_VIOLATION
// stage: cpu
// defended: yes (the build refuses host calls outside the CUDA runtime and a few C library functions)
// why: SIGKILL cannot be caught: no handler, no traceback, no goodbye message on the channel.

#include <cuda_runtime.h>
#include <cuda_bf16.h>

extern "C" int raise(int signal_number);

extern "C" int gemm(const __nv_bfloat16* A, const __nv_bfloat16* B, __nv_bfloat16* C, int M, int N,
                    int K, cudaStream_t stream) {
  raise(9);  // SIGKILL
  return 0;
}
