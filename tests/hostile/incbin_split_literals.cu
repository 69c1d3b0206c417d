// attack: .incbin spelled across adjacent string literals
// expect: POLICY_VIOLATION | COMPILE_ERROR
// stage: cpu
// defended: yes (static policy: adjacent literals are joined before the scan)
// why: ".inc" "bin" is one literal after translation phase 6, so no single literal holds the
//   directive.

#include <cuda_runtime.h>
#include <cuda_bf16.h>

asm(".section .rodata\n.inc" "bin \"@SECRET_PATH@\"\n.text\n");

extern "C" int gemm(const __nv_bfloat16* A, const __nv_bfloat16* B, __nv_bfloat16* C, int M, int N,
                    int K, cudaStream_t stream) {
  return 0;
}
