// attack: .incbin produced by macro stringification
// expect: POLICY_VIOLATION | COMPILE_ERROR
// stage: cpu
// defended: yes (static policy: .incbin is looked for in code as well as in literals)
// why: #x turns the bare tokens .incbin into a string literal, so no literal in the source holds
//   the directive.

#include <cuda_runtime.h>
#include <cuda_bf16.h>

#define STR(x) #x
asm(".section .rodata\n" STR(.incbin) " \"@SECRET_PATH@\"\n.text\n");

extern "C" int gemm(const __nv_bfloat16* A, const __nv_bfloat16* B, __nv_bfloat16* C, int M, int N,
                    int K, cudaStream_t stream) {
  return 0;
}
