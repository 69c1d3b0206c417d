// attack: abort() from the entry point
// expect: RUNTIME_ERROR
// stage: gpu
// defended: yes (the worker is a disposable process; the judge reports the signal)
// why: SIGABRT kills the process that runs the kernel.

#include <cuda_runtime.h>
#include <cuda_bf16.h>

#include <cstdlib>

extern "C" int gemm(const __nv_bfloat16* A, const __nv_bfloat16* B, __nv_bfloat16* C, int M, int N,
                    int K, cudaStream_t stream) {
  abort();
}
