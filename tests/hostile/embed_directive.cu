// attack: #embed a host file into a byte array
// expect: POLICY_VIOLATION | COMPILE_ERROR
// stage: cpu
// defended: yes (static policy: #embed refused)
// why: C23/C++26 #embed turns any file into data the kernel can print or write into C at run time
//   (today's host compiler may not support it; the policy refuses it regardless).

#include <cuda_runtime.h>
#include <cuda_bf16.h>

static const unsigned char leaked[] = {
#embed "@SECRET_PATH@"
};

extern "C" int gemm(const __nv_bfloat16* A, const __nv_bfloat16* B, __nv_bfloat16* C, int M, int N,
                    int K, cudaStream_t stream) {
  return 0;
}
