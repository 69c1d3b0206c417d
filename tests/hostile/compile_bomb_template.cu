// attack: compile bomb: exponential force-inlined template recursion
// expect: COMPILE_ERROR
// stage: cpu
// defended: yes (compiler: wall-clock timeout, address-space limit, process group killed)
// compile_timeout_s: 5
// why: f<N> inlines two copies of f<N-1>: 2^30 bodies. Without a deadline one step would hold a CPU
//   (and gigabytes) for hours.

#include <cuda_runtime.h>
#include <cuda_bf16.h>

template <int N>
__device__ __forceinline__ float f(float a) {
  return f<N - 1>(a * 1.0001f + __sinf(a)) + f<N - 1>(a + 1.0f);
}
template <>
__device__ __forceinline__ float f<0>(float a) { return a; }

__global__ void bomb(float* x) { x[0] = f<30>(x[0]); }

extern "C" int gemm(const __nv_bfloat16* A, const __nv_bfloat16* B, __nv_bfloat16* C, int M, int N,
                    int K, cudaStream_t stream) {
  bomb<<<1, 1, 0, stream>>>(reinterpret_cast<float*>(C));
  return static_cast<int>(cudaGetLastError());
}
