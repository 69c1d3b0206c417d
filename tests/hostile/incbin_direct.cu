// attack: assembler .incbin of a host file in a host asm statement
// expect: POLICY_VIOLATION | COMPILE_ERROR
// stage: cpu
// defended: yes (static policy: .incbin in any string refused)
// why: the host assembler copies the file into the library, where the entry point can read it at
//   run time and print it or write it into C.

#include <cuda_runtime.h>
#include <cuda_bf16.h>

asm(".section .rodata\n.incbin \"@SECRET_PATH@\"\n.text\n");

extern "C" int gemm(const __nv_bfloat16* A, const __nv_bfloat16* B, __nv_bfloat16* C, int M, int N,
                    int K, cudaStream_t stream) {
  return 0;
}
