// Test kernel: one TMA tile load and one wgmma (fence, mma, commit, wait) per warpgroup,
// one warpgroup per block, M / 64 blocks. The math need not be right; it exists to be counted:
// by the judge's self-test of CUPTI counts (ptxgym.evaluate.count.self_test), and by the tests
// (tests/build/test_sass.py, tests/gpu/test_gpu_profile.py, tests/gpu/test_gpu_count.py).
#include "ptxgym_h100.cuh"

__global__ void __launch_bounds__(128, 1)
    wgmma_tma_kernel(const __grid_constant__ CUtensorMap tmap_a, __nv_bfloat16* C) {
  __shared__ __align__(1024) __nv_bfloat16 tile_a[64 * 64];
  __shared__ __align__(1024) __nv_bfloat16 tile_b[64 * 64];
  __shared__ __align__(8) uint64_t bar;
  if (threadIdx.x == 0) {
    ptx::mbar_init(&bar, 1);
    ptx::fence_mbarrier_init();
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    ptx::mbar_arrive_expect_tx(&bar, sizeof(tile_a));
    ptx::tma_load_2d(tile_a, &tmap_a, &bar, 0, static_cast<int32_t>(blockIdx.x) * 64);
  }
  ptx::mbar_wait(&bar, 0);
  float acc[32] = {};
  ptx::wgmma_fence();
  ptx::wgmma_m64n64k16_ss(acc, ptx::make_desc_kmajor_sw128(tile_a),
                          ptx::make_desc_kmajor_sw128(tile_b), 0);
  ptx::wgmma_commit();
  ptx::wgmma_wait<0>();
  C[threadIdx.x] = __float2bfloat16(acc[0] + acc[31]);
}
extern "C" int gemm(const __nv_bfloat16* A, const __nv_bfloat16* B, __nv_bfloat16* C, int M, int N, int K, cudaStream_t stream) {
  CUtensorMap tmap_a;
  if (ptx::make_tmap_2d(&tmap_a, A, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, K, M, K * 2, 64, 64,
                        CU_TENSOR_MAP_SWIZZLE_128B) != CUDA_SUCCESS) {
    return static_cast<int>(cudaErrorInvalidValue);
  }
  wgmma_tma_kernel<<<M / 64, 128, 0, stream>>>(tmap_a, C);
  return static_cast<int>(cudaGetLastError());
}
