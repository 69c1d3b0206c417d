// attack: include directive preceded by a form feed
// expect: POLICY_VIOLATION | COMPILE_ERROR
// stage: cpu
// defended: yes (the policy's directive scan takes any whitespace but newline around '#')
// why: the preprocessor takes form feed and vertical tab as whitespace around a directive's #, but
//   the policy's directive pattern allows only spaces and tabs, so this include (and
//   "#<FF>include", or the same with a vertical tab) is never checked: the file is read and the
//   static_assert quotes its macro in the compile log. extract() lets both characters through too.
//   Fix: treat [ \t\f\v] as whitespace in the scan, or refuse \f and \v.

#include <cuda_runtime.h>
#include <cuda_bf16.h>

#include "@SECRET_PATH@"
static_assert(false, HOSTILE_SECRET);

extern "C" int gemm(const __nv_bfloat16* A, const __nv_bfloat16* B, __nv_bfloat16* C, int M, int N,
                    int K, cudaStream_t stream) {
  return 0;
}
