// attack: exit(0) from the entry point
// expect: RUNTIME_ERROR
// stage: gpu
// defended: yes (the worker is a disposable process; the judge sees it exit)
// why: in-process evaluation would end the whole training loop, or (exit code 0) look like a clean
//   finish.

#include <cuda_runtime.h>
#include <cuda_bf16.h>

#include <cstdlib>

extern "C" int gemm(const __nv_bfloat16* A, const __nv_bfloat16* B, __nv_bfloat16* C, int M, int N,
                    int K, cudaStream_t stream) {
  exit(0);
}
