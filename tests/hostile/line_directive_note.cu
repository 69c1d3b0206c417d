// attack: #line names a host file, then a redefinition whose note quotes "the previous definition" there
// expect: POLICY_VIOLATION | COMPILE_ERROR
// stage: cpu
// defended: yes (policy refuses line control; the compiler cannot read the file; the log quotes only our copy)
// why: the compiler quotes source lines from whatever file a location names, and #line lets the
//   source name any file: the note under the submission's own error would carry the file's lines.

#include <cuda_runtime.h>
#include <cuda_bf16.h>

#line 1 "@SECRET_PATH@"
int defined_twice = 1;
#line 40 "candidate.cu"
int defined_twice = 2;

extern "C" int gemm(const __nv_bfloat16* A, const __nv_bfloat16* B, __nv_bfloat16* C, int M, int N,
                    int K, cudaStream_t stream) {
  return 0;
}
