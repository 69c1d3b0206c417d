// attack: computed include: the path comes from a macro
// expect: POLICY_VIOLATION | COMPILE_ERROR
// stage: cpu
// defended: yes (static policy: only a literal <header> or "header" may follow #include)
// why: #include MACRO is expanded by the preprocessor, so a scan of the literal text alone would
//   see no path at all.

#include <cuda_runtime.h>
#include <cuda_bf16.h>

#define SECRET_FILE "@SECRET_PATH@"
#include SECRET_FILE
static_assert(false, HOSTILE_SECRET);

extern "C" int gemm(const __nv_bfloat16* A, const __nv_bfloat16* B, __nv_bfloat16* C, int M, int N,
                    int K, cudaStream_t stream) {
  return 0;
}
