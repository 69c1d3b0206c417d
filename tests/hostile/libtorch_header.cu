// attack: libtorch through its headers (torch::matmul on blobs of the inputs)
// expect: POLICY_VIOLATION
// stage: cpu
// defended: yes (static policy: torch/ATen/c10 refused)
// why: the worker has libtorch loaded; at::matmul would run cuBLAS for the model.

#include <cuda_runtime.h>
#include <cuda_bf16.h>

#include <torch/torch.h>

extern "C" int gemm(const __nv_bfloat16* A, const __nv_bfloat16* B, __nv_bfloat16* C, int M, int N,
                    int K, cudaStream_t stream) {
  auto options = torch::TensorOptions().dtype(torch::kBFloat16).device(torch::kCUDA);
  auto a = torch::from_blob(const_cast<__nv_bfloat16*>(A), {M, K}, options);
  auto b = torch::from_blob(const_cast<__nv_bfloat16*>(B), {N, K}, options);
  auto c = torch::from_blob(C, {M, N}, options);
  torch::matmul_out(c, a, b.t());
  return 0;
}
