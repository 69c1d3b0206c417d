// attack: .incbin assembled by token pasting, then stringified
// expect: POLICY_VIOLATION | COMPILE_ERROR
// stage: cpu
// defended: yes (compiler: the preprocessed host source is scanned for .incbin/.include)
// why: CAT(.inc, bin) spells the directive only after macro expansion, which a scan of the source
//   cannot see; the scan of the preprocessed output can.

#include <cuda_runtime.h>
#include <cuda_bf16.h>

#define CAT(a, b) a##b
#define STR(x) #x
#define XSTR(x) STR(x)
asm(".section .rodata\n" XSTR(CAT(.inc, bin)) " \"@SECRET_PATH@\"\n.text\n");

extern "C" int gemm(const __nv_bfloat16* A, const __nv_bfloat16* B, __nv_bfloat16* C, int M, int N,
                    int K, cudaStream_t stream) {
  return 0;
}
