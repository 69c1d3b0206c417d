// attack: include split across lines by a backslash-newline
// expect: POLICY_VIOLATION | COMPILE_ERROR
// stage: cpu
// defended: yes (static policy: line continuations are joined before the scan)
// why: line splicing happens before directives are recognised, so "#inc\" + "lude" is an include
//   that no line of the text spells out.

#include <cuda_runtime.h>
#include <cuda_bf16.h>

#inc\
lude "@SECRET_PATH@"
static_assert(false, HOSTILE_SECRET);

extern "C" int gemm(const __nv_bfloat16* A, const __nv_bfloat16* B, __nv_bfloat16* C, int M, int N,
                    int K, cudaStream_t stream) {
  return 0;
}
