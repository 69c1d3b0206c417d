// Test kernel (sm_100a): TMEM allocation, one tcgen05.mma with its commit, and the tcgen05.ld
// readback.
#include "ptxgym_b200.cuh"

__global__ void __launch_bounds__(128, 1) tcgen05_kernel(__nv_bfloat16* C) {
  __shared__ __align__(1024) __nv_bfloat16 tile_a[128 * 64];
  __shared__ __align__(1024) __nv_bfloat16 tile_b[64 * 64];
  __shared__ __align__(8) uint64_t bar;
  __shared__ uint32_t tmem_base;
  if (ptx::warp_idx() == 0) ptx::tmem_alloc(&tmem_base, 64);
  if (threadIdx.x == 0) {
    ptx::mbar_init(&bar, 1);
    ptx::fence_mbarrier_init();
  }
  ptx::tc_fence_before_sync();
  __syncthreads();
  ptx::tc_fence_after_sync();
  const uint32_t base = tmem_base;
  if (threadIdx.x == 0) {
    ptx::umma_bf16_ss(base, ptx::make_desc_kmajor_sw128(tile_a),
                      ptx::make_desc_kmajor_sw128(tile_b), ptx::make_idesc_bf16_f32(128, 64), 0);
    ptx::umma_commit(&bar);
  }
  ptx::mbar_wait(&bar, 0);
  ptx::tc_fence_after_sync();
  uint32_t r[8];
  ptx::tmem_ld_32x32b_x8(ptx::tmem_addr(base, 32 * (ptx::warp_idx() % 4), 0), r);
  ptx::tmem_wait_ld();
  C[threadIdx.x] = __float2bfloat16(__uint_as_float(r[0]) + __uint_as_float(r[7]));
  ptx::tc_fence_before_sync();
  __syncthreads();
  if (ptx::warp_idx() == 0) ptx::tmem_dealloc(base, 64);
}
extern "C" int gemm(const __nv_bfloat16* A, const __nv_bfloat16* B, __nv_bfloat16* C, int M, int N, int K, cudaStream_t stream) {
  tcgen05_kernel<<<1, 128, 0, stream>>>(C);
  return static_cast<int>(cudaGetLastError());
}
