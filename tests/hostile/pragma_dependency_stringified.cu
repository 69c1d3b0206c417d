// attack: GCC dependency pragma produced by _Pragma(#x) inside a macro
// expect: POLICY_VIOLATION | COMPILE_ERROR
// stage: cpu
// defended: yes (the policy allows _Pragma only with a string literal)
// why: the policy matches _Pragma only when a string literal follows it; here the operand is the
//   stringified macro argument, so the dependency pragma reaches the compiler and the oracle of
//   pragma_dependency works again (COMPILED when the file exists, an error when it does not). Fix:
//   refuse _Pragma unless its operand is a literal, or check the pragmas in the preprocessed
//   output.

#include <cuda_runtime.h>
#include <cuda_bf16.h>

#define DEPEND(x) _Pragma(#x)
DEPEND(GCC dependency "@SECRET_PATH@")

extern "C" int gemm(const __nv_bfloat16* A, const __nv_bfloat16* B, __nv_bfloat16* C, int M, int N,
                    int K, cudaStream_t stream) {
  return 0;
}
