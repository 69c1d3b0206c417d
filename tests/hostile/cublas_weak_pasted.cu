// attack: cuBLAS through weak declarations whose names are assembled by token pasting
// expect: POLICY_VIOLATION | COMPILE_ERROR
// stage: cpu
// defended: yes (the object's undefined symbols must be CUDA runtime or allowed C library functions, weak or not)
// why: -z defs reports undefined strong symbols only: a weak undefined symbol links, and at load
//   time resolves against whatever the worker's global scope holds (torch loads cuBLAS there), so
//   this library runs cuBLAS's GEMM, correct and as fast as the baseline. The names are pasted, so
//   the policy's pattern never sees them. Fix: after the link, allow only a list of undefined
//   dynamic symbols (libc/libstdc++/libm basics), weak or not.

#include <cuda_runtime.h>
#include <cuda_bf16.h>

#define CAT(a, b) a##b
// The cuBLAS enums, by value: op N/T, CUDA_R_16BF, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT.
enum { kOpN = 0, kOpT = 1, kBf16 = 14, kCompute32F = 68, kAlgoDefault = -1 };
extern "C" __attribute__((weak)) int CAT(cub, lasCreate_v2)(void** handle);
extern "C" __attribute__((weak)) int CAT(cub, lasSetStream_v2)(void* handle, cudaStream_t s);
extern "C" __attribute__((weak)) int CAT(cub, lasGemmEx)(
    void* handle, int transa, int transb, int m, int n, int k, const void* alpha,
    const void* a, int atype, int lda, const void* b, int btype, int ldb, const void* beta,
    void* c, int ctype, int ldc, int compute, int algo);

extern "C" int gemm(const __nv_bfloat16* A, const __nv_bfloat16* B, __nv_bfloat16* C, int M, int N,
                    int K, cudaStream_t stream) {
  static void* handle = nullptr;
  if (!CAT(cub, lasCreate_v2)) return 1;  // not resolved: nothing to steal
  if (!handle && CAT(cub, lasCreate_v2)(&handle) != 0) return 2;
  CAT(cub, lasSetStream_v2)(handle, stream);
  const float alpha = 1.0f, beta = 0.0f;
  // Row-major C[M,N] is column-major C^T[N,M] = B A^T: cuBLAS sees B as K x N, so op(B) = T.
  return CAT(cub, lasGemmEx)(handle, kOpT, kOpN, N, M, K, &alpha, B, kBf16, K, A, kBf16, K,
                            &beta, C, kBf16, N, kCompute32F, kAlgoDefault);
}
