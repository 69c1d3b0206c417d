// attack: cuBLAS through declarations whose names are assembled by token pasting
// expect: POLICY_VIOLATION | COMPILE_ERROR
// stage: cpu
// defended: yes (compiler: -Xlinker -z,defs refuses the undefined symbol at link time)
// why: CAT(cub, lasCreate_v2) hides the name from the policy's pattern; the link still fails, since
//   only the CUDA runtime is linked and undefined symbols are errors.

#include <cuda_runtime.h>
#include <cuda_bf16.h>

#define CAT(a, b) a##b
extern "C" int CAT(cub, lasCreate_v2)(void** handle);

extern "C" int gemm(const __nv_bfloat16* A, const __nv_bfloat16* B, __nv_bfloat16* C, int M, int N,
                    int K, cudaStream_t stream) {
  void* handle = nullptr;
  return CAT(cub, lasCreate_v2)(&handle);
}
