// attack: libtorch through hand-written declarations of ATen functions
// expect: POLICY_VIOLATION | COMPILE_ERROR
// stage: cpu
// defended: yes (static policy: the at:: and c10:: namespaces refused)
// why: declaring the few ATen symbols needed avoids the headers; the symbols are in the worker's
//   process.

#include <cuda_runtime.h>
#include <cuda_bf16.h>

namespace c10 { struct TensorImpl; }
namespace at {
struct Tensor { c10::TensorImpl* impl; };
Tensor& matmul_out(Tensor& out, const Tensor& self, const Tensor& other);
}

extern "C" int gemm(const __nv_bfloat16* A, const __nv_bfloat16* B, __nv_bfloat16* C, int M, int N,
                    int K, cudaStream_t stream) {
  at::Tensor a{nullptr}, b{nullptr}, c{nullptr};
  at::matmul_out(c, a, b);
  return 0;
}
