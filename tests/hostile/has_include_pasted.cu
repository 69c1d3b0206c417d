// attack: __has_include probe whose name is assembled by token pasting
// expect: POLICY_VIOLATION | COMPILE_ERROR
// stage: cpu
// defended: yes (the build defines __has_include as 0 before the candidate, whatever its spelling)
// why: CAT(__has_, include) becomes __has_include only after macro expansion, which the policy's
//   pattern never sees; the compiler accepts the expanded operator in #if, so the existence oracle
//   of has_include_probe works again (COMPILED when the file exists, #error when it does not). Fix:
//   refuse any ## that can form a reserved operator, or refuse __has_include outright (or check the
//   preprocessed output for the probe's effect). Since issue 8 the build includes a header of ours
//   before the candidate that defines __has_include (and __has_include_next) as 0: the probe says
//   "no" for every path, so this file always stops at its #error (COMPILE_ERROR), exists or not.

#include <cuda_runtime.h>
#include <cuda_bf16.h>

#define CAT(a, b) a##b
#if !CAT(__has_, include)("@SECRET_PATH@")
#error the probed file does not exist
#endif

extern "C" int gemm(const __nv_bfloat16* A, const __nv_bfloat16* B, __nv_bfloat16* C, int M, int N,
                    int K, cudaStream_t stream) {
  return 0;
}
