// GPU checks of the Hopper knowledge pack (packs/h100/wrappers.cuh) on an sm_90 GPU.
//
// Build (from the repository root):
//   nvcc -std=c++17 -O2 -gencode arch=compute_90a,code=sm_90a -I packs/h100
//        -o pack_h100_wrappers tests/gpu/pack_h100_wrappers.cu
// (no -lcuda: the pack reaches cuTensorMapEncodeTiled through the runtime's driver entry point).
//
// Output: one line per check, `CHECK <name> <value> <limit>`; the check passes when
// value <= limit. Max-error checks compare against a float reference computed on the host;
// boolean facts print 0 (as expected) or 1 (not), preceded by an `INFO <name> ...` line giving
// the observed and expected values. The program exits 0 once everything ran, and nonzero only
// on a CUDA error (printed as `CUDA_ERROR ...`). tests/gpu/test_pack_wrappers.py runs it.
//
// The inputs are chosen so that every product and sum is exact in fp32: A holds multiples of
// 1/8 in [-1, 1], B multiples of 1/4 in [-1.5, 1.5], K = 128, so every result is a multiple of
// 1/32 of magnitude <= 192. A correct wgmma therefore matches the reference exactly; the
// max-error limits (1e-3) are far below the 1/32 step, so any real error fails.
#include "wrappers.cuh"

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

namespace {

// ------------------------------------------------------------------------------------------------
// Problem: C[M][N] = A[M][K] * B[N][K]^T, bf16 inputs, f32 accumulate, one warpgroup.
// ------------------------------------------------------------------------------------------------
constexpr int M = 64, N = 256, K = 128;
constexpr int K_STEPS = K / 16;  // one wgmma consumes K = 16
constexpr int ATOM_K = 64;       // bf16 elements in one 128-byte swizzled row

// Shared memory of the GEMM kernel (offsets from a 1024-byte aligned base: 128B-swizzle atoms
// must start on 1024-byte boundaries for descriptor base offset 0).
//   A  : two K-halves, each [64 rows][64 k] swizzled           (2 x  8 KB)
//   B  : two K-halves, each [256 rows][64 k] swizzled          (2 x 32 KB)
//   Bt : two K-halves, each four [64 k][64 n] MN-major boxes   (2 x 32 KB)
//   C  : four [64 rows][64 cols] bf16 swizzled staging tiles    (4 x  8 KB)
constexpr uint32_t A_HALF_BYTES = M * ATOM_K * 2;    // 8192
constexpr uint32_t B_HALF_BYTES = N * ATOM_K * 2;    // 32768
constexpr uint32_t MN_BOX_BYTES = ATOM_K * 64 * 2;   // one [64 k][64 n] box: 8192
constexpr uint32_t BT_HALF_BYTES = 4 * MN_BOX_BYTES;  // 32768
constexpr uint32_t C_TILE_BYTES = M * 64 * 2;        // 8192
constexpr uint32_t OFF_A = 0;
constexpr uint32_t OFF_B = OFF_A + 2 * A_HALF_BYTES;
constexpr uint32_t OFF_BT = OFF_B + 2 * B_HALF_BYTES;
constexpr uint32_t OFF_C = OFF_BT + 2 * BT_HALF_BYTES;
constexpr uint32_t OFF_BAR = OFF_C + 4 * C_TILE_BYTES;
constexpr uint32_t GEMM_SMEM = OFF_BAR + 64 + 1024;  // + barrier + slack for manual alignment
constexpr uint32_t GEMM_TX_BYTES = 2 * (A_HALF_BYTES + B_HALF_BYTES + BT_HALF_BYTES);

// Result slots of the GEMM kernel, each an [M][N] f32 matrix.
enum GemmResult : int {
  kSsN64,
  kSsN96,
  kSsN128,
  kSsN192,
  kSsN256,
  kRsFormula,
  kRsLdmatrix,
  kSsMnMajor,
  kRsMnMajor,
  kGemmResults
};

// Shared memory of the cluster kernel: one [64][64] bf16 tile (no swizzle), three mbarriers and a
// DSMEM mailbox word.
constexpr uint32_t CL_TILE_BYTES = 64 * 64 * 2;
constexpr uint32_t CL_OFF_BAR = CL_TILE_BYTES;
constexpr uint32_t CL_OFF_WORD = CL_OFF_BAR + 64;
constexpr uint32_t CLUSTER_SMEM = CL_TILE_BYTES + 1024 + 1024;
constexpr int CLUSTER_CTAS = 2;

// Words the cluster kernel reports (per-CTA entries indexed by %cluster_ctarank).
enum ClusterFlag : int {
  kRemoteArrive = 0,      // written by rank 0 once rank 1's remote arrive completed
  kDsmemStored = 1,       // +rank: own mailbox, written by the peer through DSMEM
  kDsmemLoaded = 3,       // +rank: peer's mailbox, read through DSMEM
  kNctarank = 5,          // +rank
  kClusterId = 7,         // +rank
  kCtarankOfBlock = 9,    // +blockIdx.x
  kProducerThreads = 11,  // threads that passed setmaxnreg.dec
  kConsumerThreads = 12,  // threads that passed setmaxnreg.inc
  kRemoteArriveCta = 13,  // written by rank 0 once rank 1's .release.cta remote arrive completed
  kClusterFlags = 16
};

__device__ __forceinline__ uint8_t* align_1024(uint8_t* p) {
  return reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(p) + 1023) & ~uintptr_t(1023));
}

__device__ __forceinline__ float bf16_at(const uint8_t* p) {
  return __bfloat162float(*reinterpret_cast<const __nv_bfloat16*>(p));
}

// K-major 128B-swizzle descriptors for k-step ks: the step lives in the 64-wide atom ks / 4 and
// starts 32 bytes * (ks % 4) into its rows (desc_advance moves the start address only).
__device__ __forceinline__ uint64_t desc_a_kstep(const uint8_t* sm, int ks) {
  return ptx::desc_advance(ptx::make_desc_kmajor_sw128(sm + OFF_A + (ks / 4) * A_HALF_BYTES),
                           32 * (ks % 4));
}
__device__ __forceinline__ uint64_t desc_b_kstep(const uint8_t* sm, int ks) {
  return ptx::desc_advance(ptx::make_desc_kmajor_sw128(sm + OFF_B + (ks / 4) * B_HALF_BYTES),
                           32 * (ks % 4));
}
// MN-major B (trans-b = 1): k-step ks is 16 rows = 2048 bytes into the K-half's boxes; LBO is
// the distance between the 64-wide N boxes.
__device__ __forceinline__ uint64_t desc_bt_kstep(const uint8_t* sm, int ks) {
  return ptx::make_desc_mnmajor_sw128(
      sm + OFF_BT + (ks / 4) * BT_HALF_BYTES + (ks % 4) * 16 * 128, MN_BOX_BYTES);
}

// Register-A fragment of k-step ks built by the pack's documented formula from global A:
//   a[0] = A[r][2q, 2q+1], a[1] = A[r+8][2q, 2q+1], a[2] = A[r][2q+8, +9], a[3] = A[r+8][2q+8, +9]
__device__ __forceinline__ void a_fragment_formula(uint32_t (&a)[4], const __nv_bfloat16* A,
                                                   int ks, uint32_t t) {
  const uint32_t r = 16 * (t / 32) + (t % 32) / 4, k0 = 16 * ks + 2 * (t % 4);
  auto pair = [&](uint32_t row, uint32_t k) {
    return ptx::pack_bf16x2(__bfloat162float(A[row * K + k]), __bfloat162float(A[row * K + k + 1]));
  };
  a[0] = pair(r, k0);
  a[1] = pair(r + 8, k0);
  a[2] = pair(r, k0 + 8);
  a[3] = pair(r + 8, k0 + 8);
}

// The same fragment read with ldmatrix.x4 from the swizzled smem A tile: lane L addresses row
// (L % 8) of 8x8 matrix L / 8; matrix m covers rows 8 * (m % 2) .. +7 of the warp's 16 rows and
// k 8 * (m / 2) .. +7 of the step, so register m lands where the formula puts a[m].
__device__ __forceinline__ void a_fragment_ldmatrix(uint32_t (&a)[4], const uint8_t* sm, int ks,
                                                    uint32_t t) {
  const uint32_t warp = t / 32, lane = t % 32;
  const uint32_t row = 16 * warp + (lane % 8) + 8 * ((lane / 8) % 2);
  const uint32_t k = 16 * (ks % 4) + 8 * (lane / 16);
  ptx::ldmatrix_x4(a, sm + OFF_A + (ks / 4) * A_HALF_BYTES + ptx::swizzle_128b(row * 128 + k * 2));
}

// Full K loop into acc. issue(acc, ks) issues k-step ks (scale_d = ks > 0). acc starts as NaN:
// scale_d = 0 on the first step must ignore whatever the registers held.
template <int NN, typename IssueStep>
__device__ __forceinline__ void wgmma_k_loop(float (&acc)[NN / 2], IssueStep issue) {
#pragma unroll
  for (int i = 0; i < NN / 2; ++i) acc[i] = __int_as_float(0x7fc00000);
  ptx::fence_regs(acc);
  ptx::wgmma_fence();
#pragma unroll
  for (int ks = 0; ks < K_STEPS; ++ks) issue(acc, ks);
  ptx::wgmma_commit();
  ptx::wgmma_wait<0>();
  ptx::fence_regs(acc);
}

// Scatter an accumulator to out[M][N] with the pack's wgmma_acc_coord mapping.
template <int NN>
__device__ __forceinline__ void store_acc(const float (&acc)[NN / 2], float* out, uint32_t t) {
#pragma unroll
  for (uint32_t i = 0; i < NN / 2; ++i) {
    uint32_t r, c;
    ptx::wgmma_acc_coord(t, i, r, c);
    out[r * N + c] = acc[i];
  }
}

// SS form with K-major A and B (B rows 0..NN-1), through the wgmma_ss<N> dispatcher.
template <int NN>
__device__ void check_ss_k_major(const uint8_t* sm, float* out, uint32_t t) {
  float acc[NN / 2];
  wgmma_k_loop<NN>(acc, [&](float (&d)[NN / 2], int ks) {
    ptx::wgmma_ss<NN>(d, desc_a_kstep(sm, ks), desc_b_kstep(sm, ks), ks > 0);
  });
  store_acc<NN>(acc, out, t);
}

// One warpgroup (128 threads): TMA loads (2-D and 3-D, 128B swizzle) completing on an mbarrier,
// wgmma SS/RS in all provided N, K-major and MN-major B, then a stmatrix + TMA store epilogue.
__global__ void __launch_bounds__(128, 1)
    gemm_kernel(const __grid_constant__ CUtensorMap tmap_a,
                const __grid_constant__ CUtensorMap tmap_b,
                const __grid_constant__ CUtensorMap tmap_bt,
                const __grid_constant__ CUtensorMap tmap_c, const __nv_bfloat16* A,
                float* results, float* tile_a, float* tile_b, float* tile_bt) {
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  uint8_t* sm = align_1024(smem_raw);
  uint64_t* bar = reinterpret_cast<uint64_t*>(sm + OFF_BAR);
  const uint32_t t = threadIdx.x;

  if (t == 0) {
    ptx::prefetch_tmap(&tmap_a);
    ptx::prefetch_tmap(&tmap_b);
    ptx::prefetch_tmap(&tmap_bt);
    ptx::prefetch_tmap(&tmap_c);
    ptx::mbar_init(bar, 1);
    ptx::fence_mbarrier_init();
  }
  __syncthreads();

  // One elected thread: one arrival that also expects every byte of the six boxes.
  if (ptx::warp_idx() == 0 && ptx::elect_one_sync()) {
    ptx::mbar_arrive_expect_tx(bar, GEMM_TX_BYTES);
    for (int h = 0; h < 2; ++h) {
      ptx::tma_load_2d(sm + OFF_A + h * A_HALF_BYTES, &tmap_a, bar, h * ATOM_K, 0);
      ptx::tma_load_2d(sm + OFF_B + h * B_HALF_BYTES, &tmap_b, bar, h * ATOM_K, 0);
      // Bt viewed as [N/64][K][64]: one box = four [64 k][64 n] MN-major boxes of this K-half.
      ptx::tma_load_3d(sm + OFF_BT + h * BT_HALF_BYTES, &tmap_bt, bar, 0, h * ATOM_K, 0);
    }
  }
  ptx::mbar_wait(bar, 0);

  // The loaded tiles, un-swizzled back to their logical [row][k] / [k][n] positions.
  for (uint32_t i = t; i < M * K; i += blockDim.x) {
    const uint32_t m = i / K, k = i % K;
    tile_a[i] = bf16_at(sm + OFF_A + (k / ATOM_K) * A_HALF_BYTES +
                        ptx::swizzle_128b(m * 128 + (k % ATOM_K) * 2));
  }
  for (uint32_t i = t; i < N * K; i += blockDim.x) {
    const uint32_t n = i / K, k = i % K;
    tile_b[i] = bf16_at(sm + OFF_B + (k / ATOM_K) * B_HALF_BYTES +
                        ptx::swizzle_128b(n * 128 + (k % ATOM_K) * 2));
  }
  for (uint32_t i = t; i < K * N; i += blockDim.x) {
    const uint32_t k = i / N, n = i % N;
    tile_bt[i] = bf16_at(sm + OFF_BT + (k / ATOM_K) * BT_HALF_BYTES + (n / 64) * MN_BOX_BYTES +
                         ptx::swizzle_128b((k % ATOM_K) * 128 + (n % 64) * 2));
  }

  check_ss_k_major<64>(sm, results + kSsN64 * M * N, t);
  check_ss_k_major<96>(sm, results + kSsN96 * M * N, t);
  check_ss_k_major<128>(sm, results + kSsN128 * M * N, t);
  check_ss_k_major<192>(sm, results + kSsN192 * M * N, t);

  // N = 256 through the named wrapper; the accumulator also feeds the store epilogue below.
  float acc[128];
  wgmma_k_loop<256>(acc, [&](float (&d)[128], int ks) {
    ptx::wgmma_m64n256k16_ss(d, desc_a_kstep(sm, ks), desc_b_kstep(sm, ks), ks > 0);
  });
  store_acc<256>(acc, results + kSsN256 * M * N, t);

  // Epilogue: stmatrix bf16 16x16 blocks into four swizzled [64][64] tiles, then TMA store.
  // Block j covers cols 16j..16j+15 of this warp's 16 rows (pack comment, section 7).
  {
    const uint32_t warp = t / 32, lane = t % 32;
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      const uint32_t r[4] = {ptx::pack_bf16x2(acc[8 * j + 0], acc[8 * j + 1]),
                             ptx::pack_bf16x2(acc[8 * j + 2], acc[8 * j + 3]),
                             ptx::pack_bf16x2(acc[8 * j + 4], acc[8 * j + 5]),
                             ptx::pack_bf16x2(acc[8 * j + 6], acc[8 * j + 7])};
      const uint32_t row = 16 * warp + (lane % 8) + 8 * ((lane / 8) % 2);
      const uint32_t col = 16 * (j % 4) + 8 * (lane / 16);
      ptx::stmatrix_x4(sm + OFF_C + (j / 4) * C_TILE_BYTES + ptx::swizzle_128b(row * 128 + col * 2),
                       r);
    }
    // Generic-proxy smem writes -> async-proxy read by the TMA store: fence, then barrier.
    ptx::fence_proxy_async_smem();
    __syncthreads();
    if (t == 0) {
      for (int cb = 0; cb < 4; ++cb) {
        ptx::tma_store_2d(&tmap_c, sm + OFF_C + cb * C_TILE_BYTES, cb * 64, 0);
      }
      ptx::bulk_commit_group();
      ptx::bulk_wait_group<0>();
    }
  }

  // RS form, A fragment built by formula from global memory (dispatcher wgmma_rs<256>).
  wgmma_k_loop<256>(acc, [&](float (&d)[128], int ks) {
    uint32_t a[4];
    a_fragment_formula(a, A, ks, t);
    ptx::fence_regs(a);
    ptx::wgmma_fence();  // a[] was written by ordinary instructions since the last wgmma
    ptx::wgmma_rs<256>(d, a, desc_b_kstep(sm, ks), ks > 0);
  });
  store_acc<256>(acc, results + kRsFormula * M * N, t);

  // RS form, A fragment from ldmatrix of the swizzled smem tile (named wrapper).
  wgmma_k_loop<256>(acc, [&](float (&d)[128], int ks) {
    uint32_t a[4];
    a_fragment_ldmatrix(a, sm, ks, t);
    ptx::fence_regs(a);
    ptx::wgmma_fence();
    ptx::wgmma_m64n256k16_rs(d, a, desc_b_kstep(sm, ks), ks > 0);
  });
  store_acc<256>(acc, results + kRsLdmatrix * M * N, t);

  // MN-major B (Bt[K][N], N contiguous) with trans-b = 1: SS form ...
  wgmma_k_loop<256>(acc, [&](float (&d)[128], int ks) {
    ptx::wgmma_ss<256, 0, 1>(d, desc_a_kstep(sm, ks), desc_bt_kstep(sm, ks), ks > 0);
  });
  store_acc<256>(acc, results + kSsMnMajor * M * N, t);

  // ... and RS form (ldmatrix fragment).
  wgmma_k_loop<256>(acc, [&](float (&d)[128], int ks) {
    uint32_t a[4];
    a_fragment_ldmatrix(a, sm, ks, t);
    ptx::fence_regs(a);
    ptx::wgmma_fence();
    ptx::wgmma_rs<256, 1>(d, a, desc_bt_kstep(sm, ks), ks > 0);
  });
  store_acc<256>(acc, results + kRsMnMajor * M * N, t);
}

// Cluster of two CTAs, three warpgroups each: warpgroup 0 (producer, setmaxnreg.dec) has rank 0
// multicast one TMA tile into both CTAs; warpgroups 1-2 (consumers, setmaxnreg.inc) wait for it
// and copy it out; rank 1 arrives on two of rank 0's mbarriers remotely (release at cluster and
// at CTA scope); each CTA writes its peer's mailbox through DSMEM and reads it back; cluster
// special registers are recorded.
__global__ void __launch_bounds__(384, 1)
    cluster_kernel(const __grid_constant__ CUtensorMap tmap_a, float* tiles, uint32_t* flags) {
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  uint8_t* sm = align_1024(smem_raw);
  uint64_t* full = reinterpret_cast<uint64_t*>(sm + CL_OFF_BAR);
  uint64_t* remote = full + 1;
  uint64_t* remote_cta = full + 2;
  uint32_t* mailbox = reinterpret_cast<uint32_t*>(sm + CL_OFF_WORD);
  const uint32_t rank = ptx::cluster_ctarank();

  if (threadIdx.x == 0) {
    ptx::mbar_init(full, 1);
    ptx::mbar_init(remote, 1);
    ptx::mbar_init(remote_cta, 1);
    ptx::fence_mbarrier_init();
  }
  __syncthreads();
  // Both CTAs' barriers must be initialised before rank 0 multicasts / rank 1 arrives remotely.
  ptx::cluster_sync();

  if (ptx::warpgroup_idx() == 0) {
    // 40 + 2 * 232 = 504 = 3 * 168 registers: the budget of 384 threads at launch.
    ptx::setmaxnreg_dec<40>();
    atomicAdd(&flags[kProducerThreads], 1u);
    if (ptx::warp_idx() == 0 && ptx::elect_one_sync()) {
      // Every destination CTA expects the box bytes on its own barrier.
      ptx::mbar_arrive_expect_tx(full, CL_TILE_BYTES);
      if (rank == 0) ptx::tma_load_2d_multicast(sm, &tmap_a, full, 0, 0, 0x3);
    }
  } else {
    ptx::setmaxnreg_inc<232>();
    atomicAdd(&flags[kConsumerThreads], 1u);
    // The bytes of rank 1's tile were sent by rank 0's TMA: acquire at cluster scope.
    ptx::mbar_wait_cluster(full, 0);
    const __nv_bfloat16* tile = reinterpret_cast<const __nv_bfloat16*>(sm);
    for (uint32_t i = threadIdx.x - 128; i < 64 * 64; i += 256) {
      tiles[rank * 64 * 64 + i] = __bfloat162float(tile[i]);
    }
    ptx::named_bar_sync(1, 256);  // the two consumer warpgroups only
    if (threadIdx.x == 128) {
      if (rank == 1) {
        ptx::mbar_arrive_cluster(remote, 0);
        ptx::mbar_arrive_cluster_cta(remote_cta, 0);
      } else {
        ptx::mbar_wait_cluster(remote, 0);
        flags[kRemoteArrive] = 1234;
        // CTA-scope wait, as examples/expert/gemm_cluster.cu waits on what this arrive releases.
        ptx::mbar_wait(remote_cta, 0);
        flags[kRemoteArriveCta] = 4321;
      }
    }
  }

  if (threadIdx.x == 0) {
    const uint32_t peer_mailbox = ptx::mapa_shared(ptx::smem_u32(mailbox), rank ^ 1);
    ptx::st_shared_cluster_u32(peer_mailbox, 100 + rank);
  }
  ptx::cluster_sync();  // release/acquire: the peer's DSMEM store is visible after this
  if (threadIdx.x == 0) {
    flags[kDsmemStored + rank] = *reinterpret_cast<volatile uint32_t*>(mailbox);
    flags[kDsmemLoaded + rank] =
        ptx::ld_shared_cluster_u32(ptx::mapa_shared(ptx::smem_u32(mailbox), rank ^ 1));
    flags[kNctarank + rank] = ptx::cluster_nctarank();
    flags[kClusterId + rank] = ptx::cluster_id_x();
    flags[kCtarankOfBlock + blockIdx.x] = rank;
  }
  ptx::cluster_sync();  // no CTA exits while its peer may still read its shared memory
}

// ------------------------------------------------------------------------------------------------
// Host side
// ------------------------------------------------------------------------------------------------
#define CUDA_CHECK(call)                                                                   \
  do {                                                                                     \
    const cudaError_t err_ = (call);                                                       \
    if (err_ != cudaSuccess) {                                                             \
      std::printf("CUDA_ERROR %s: %s (%s:%d)\n", #call, cudaGetErrorString(err_), __FILE__, \
                  __LINE__);                                                               \
      std::fflush(stdout);                                                                 \
      std::exit(1);                                                                        \
    }                                                                                      \
  } while (0)

void report(const char* name, double value, double limit) {
  std::printf("CHECK %s %.9g %.9g\n", name, value, limit);
  std::fflush(stdout);
}

// Boolean fact: 0 when got == want.
void report_fact(const char* name, long long got, long long want) {
  std::printf("INFO %s got %lld want %lld\n", name, got, want);
  report(name, got == want ? 0.0 : 1.0, 0.0);
}

// Running maximum of absolute errors; a NaN error counts as infinite.
double worse(double worst, double err) {
  if (std::isnan(err)) return INFINITY;
  return err > worst ? err : worst;
}

// Max |got - ref| over rows [0, M) and the first ncols columns of [M][N] matrices.
double max_abs_err(const std::vector<float>& ref, const float* got, int ncols) {
  double worst = 0.0;
  for (int r = 0; r < M; ++r) {
    for (int c = 0; c < ncols; ++c) {
      worst = worse(worst, std::fabs(static_cast<double>(ref[r * N + c]) - got[r * N + c]));
    }
  }
  return worst;
}

double max_abs_err(const std::vector<float>& ref, const std::vector<float>& got) {
  double worst = 0.0;
  for (size_t i = 0; i < ref.size(); ++i) {
    worst = worse(worst, std::fabs(static_cast<double>(ref[i]) - got[i]));
  }
  return worst;
}

// Deterministic integers (no dependence on the C library's rand()).
uint32_t next_random(uint32_t& state) {
  state = state * 1664525u + 1013904223u;
  return state >> 8;
}

constexpr double EXACT = 1e-3;  // results are exact multiples of 1/32; any real error is larger

void check_device_properties() {
  int device = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  cudaDeviceProp p;
  CUDA_CHECK(cudaGetDeviceProperties(&p, device));
  std::printf("INFO device %s, %d SMs, L2 %d B\n", p.name, p.multiProcessorCount, p.l2CacheSize);
  // Per-SM facts the pack's params.md states for every sm_90 part (SM count and L2 differ).
  report_fact("device_compute_capability_9_0", p.major * 10 + p.minor, 90);
  report_fact("device_smem_per_block_optin", static_cast<long long>(p.sharedMemPerBlockOptin),
              232448);
  report_fact("device_smem_per_sm", static_cast<long long>(p.sharedMemPerMultiprocessor), 233472);
  report_fact("device_reserved_smem_per_block",
              static_cast<long long>(p.reservedSharedMemPerBlock), 1024);
  report_fact("device_registers_per_sm", p.regsPerMultiprocessor, 65536);
  report_fact("device_registers_per_block", p.regsPerBlock, 65536);
  report_fact("device_max_threads_per_sm", p.maxThreadsPerMultiProcessor, 2048);
  report_fact("device_max_blocks_per_sm", p.maxBlocksPerMultiProcessor, 32);
}

}  // namespace

int main() {
  check_device_properties();

  // Inputs: A[M][K], B[N][K] (K-major) and Bt[K][N] (the same B, N contiguous).
  std::vector<__nv_bfloat16> hA(M * K), hB(N * K), hBt(K * N);
  std::vector<float> fA(M * K), fB(N * K), fBt(K * N);
  uint32_t seed = 1;
  for (int i = 0; i < M * K; ++i) {
    fA[i] = static_cast<float>(static_cast<int>(next_random(seed) % 17) - 8) / 8.f;
    hA[i] = __float2bfloat16(fA[i]);
  }
  for (int n = 0; n < N; ++n) {
    for (int k = 0; k < K; ++k) {
      const float v = static_cast<float>(static_cast<int>(next_random(seed) % 13) - 6) / 4.f;
      fB[n * K + k] = fBt[k * N + n] = v;
      hB[n * K + k] = hBt[k * N + n] = __float2bfloat16(v);
    }
  }
  std::vector<float> ref(M * N);
  for (int m = 0; m < M; ++m) {
    for (int n = 0; n < N; ++n) {
      double s = 0.0;
      for (int k = 0; k < K; ++k) s += static_cast<double>(fA[m * K + k]) * fB[n * K + k];
      ref[m * N + n] = static_cast<float>(s);
    }
  }

  __nv_bfloat16 *dA, *dB, *dBt, *dC;
  float *d_results, *d_tile_a, *d_tile_b, *d_tile_bt, *d_cluster_tiles;
  uint32_t* d_flags;
  CUDA_CHECK(cudaMalloc(&dA, M * K * sizeof(__nv_bfloat16)));
  CUDA_CHECK(cudaMalloc(&dB, N * K * sizeof(__nv_bfloat16)));
  CUDA_CHECK(cudaMalloc(&dBt, K * N * sizeof(__nv_bfloat16)));
  CUDA_CHECK(cudaMalloc(&dC, M * N * sizeof(__nv_bfloat16)));
  CUDA_CHECK(cudaMalloc(&d_results, kGemmResults * M * N * sizeof(float)));
  CUDA_CHECK(cudaMalloc(&d_tile_a, M * K * sizeof(float)));
  CUDA_CHECK(cudaMalloc(&d_tile_b, N * K * sizeof(float)));
  CUDA_CHECK(cudaMalloc(&d_tile_bt, K * N * sizeof(float)));
  CUDA_CHECK(cudaMalloc(&d_cluster_tiles, CLUSTER_CTAS * 64 * 64 * sizeof(float)));
  CUDA_CHECK(cudaMalloc(&d_flags, kClusterFlags * sizeof(uint32_t)));
  CUDA_CHECK(cudaMemset(d_results, 0, kGemmResults * M * N * sizeof(float)));
  CUDA_CHECK(cudaMemset(dC, 0, M * N * sizeof(__nv_bfloat16)));
  CUDA_CHECK(cudaMemset(d_flags, 0, kClusterFlags * sizeof(uint32_t)));
  CUDA_CHECK(cudaMemcpy(dA, hA.data(), M * K * sizeof(__nv_bfloat16), cudaMemcpyHostToDevice));
  CUDA_CHECK(cudaMemcpy(dB, hB.data(), N * K * sizeof(__nv_bfloat16), cudaMemcpyHostToDevice));
  CUDA_CHECK(cudaMemcpy(dBt, hBt.data(), K * N * sizeof(__nv_bfloat16), cudaMemcpyHostToDevice));

  // Tensor maps (make_tmap_2d / make_tmap_3d, encoder reached through the runtime).
  CUtensorMap tmap_a, tmap_b, tmap_bt, tmap_c, tmap_a_plain, rejected;
  const auto bf16 = CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
  const CUresult enc_a =
      ptx::make_tmap_2d(&tmap_a, dA, bf16, 2, K, M, K * 2, 64, 64, CU_TENSOR_MAP_SWIZZLE_128B);
  const CUresult enc_b =
      ptx::make_tmap_2d(&tmap_b, dB, bf16, 2, K, N, K * 2, 64, 256, CU_TENSOR_MAP_SWIZZLE_128B);
  const CUresult enc_c =
      ptx::make_tmap_2d(&tmap_c, dC, bf16, 2, N, M, N * 2, 64, 64, CU_TENSOR_MAP_SWIZZLE_128B);
  const CUresult enc_a_plain = ptx::make_tmap_2d(&tmap_a_plain, dA, bf16, 2, K, M, K * 2, 64, 64,
                                                 CU_TENSOR_MAP_SWIZZLE_NONE);
  // Bt[K][N] as dims {64 n, K, N/64 blocks}, strides {N*2, 128 B}, box {64, 64, 4}.
  const CUresult enc_bt = ptx::make_tmap_3d(&tmap_bt, dBt, bf16, 2, 64, K, N / 64, N * 2, 128, 64,
                                            64, 4, CU_TENSOR_MAP_SWIZZLE_128B);
  // 128 bf16 = 256 B per box row exceeds the 128-byte swizzle span: must be refused.
  const CUresult enc_rejected =
      ptx::make_tmap_2d(&rejected, dA, bf16, 2, K, M, K * 2, 128, 64, CU_TENSOR_MAP_SWIZZLE_128B);
  const bool maps_2d_ok = enc_a == CUDA_SUCCESS && enc_b == CUDA_SUCCESS &&
                          enc_c == CUDA_SUCCESS && enc_a_plain == CUDA_SUCCESS;
  std::printf("INFO tensor_map_encode results a=%d b=%d c=%d a_plain=%d bt=%d rejected=%d\n",
              static_cast<int>(enc_a), static_cast<int>(enc_b), static_cast<int>(enc_c),
              static_cast<int>(enc_a_plain), static_cast<int>(enc_bt),
              static_cast<int>(enc_rejected));
  report("tensor_map_encode_2d", maps_2d_ok ? 0.0 : 1.0, 0.0);
  report("tensor_map_encode_3d", enc_bt == CUDA_SUCCESS ? 0.0 : 1.0, 0.0);
  report("tensor_map_rejects_box128_sw128", enc_rejected == CUDA_ERROR_INVALID_VALUE ? 0.0 : 1.0,
         0.0);
  if (!maps_2d_ok || enc_bt != CUDA_SUCCESS) {
    std::printf("NOTE kernels not run: tensor map encoding failed\n");
    return 0;
  }

  // ---- GEMM kernel ----
  CUDA_CHECK(ptx::set_max_dynamic_smem(gemm_kernel, GEMM_SMEM));
  gemm_kernel<<<1, 128, GEMM_SMEM>>>(tmap_a, tmap_b, tmap_bt, tmap_c, dA, d_results, d_tile_a,
                                     d_tile_b, d_tile_bt);
  CUDA_CHECK(cudaGetLastError());
  CUDA_CHECK(cudaDeviceSynchronize());

  std::vector<float> results(kGemmResults * M * N), tile_a(M * K), tile_b(N * K), tile_bt(K * N);
  std::vector<__nv_bfloat16> hC(M * N);
  CUDA_CHECK(cudaMemcpy(results.data(), d_results, results.size() * sizeof(float),
                        cudaMemcpyDeviceToHost));
  CUDA_CHECK(cudaMemcpy(tile_a.data(), d_tile_a, tile_a.size() * sizeof(float),
                        cudaMemcpyDeviceToHost));
  CUDA_CHECK(cudaMemcpy(tile_b.data(), d_tile_b, tile_b.size() * sizeof(float),
                        cudaMemcpyDeviceToHost));
  CUDA_CHECK(cudaMemcpy(tile_bt.data(), d_tile_bt, tile_bt.size() * sizeof(float),
                        cudaMemcpyDeviceToHost));
  CUDA_CHECK(cudaMemcpy(hC.data(), dC, hC.size() * sizeof(__nv_bfloat16), cudaMemcpyDeviceToHost));

  report("tma_load_2d_swizzle128", worse(max_abs_err(fA, tile_a), max_abs_err(fB, tile_b)), 0.0);
  report("tma_load_3d_swizzle128", max_abs_err(fBt, tile_bt), 0.0);

  const float* res = results.data();
  report("wgmma_ss_k_major_n64", max_abs_err(ref, res + kSsN64 * M * N, 64), EXACT);
  report("wgmma_ss_k_major_n96", max_abs_err(ref, res + kSsN96 * M * N, 96), EXACT);
  report("wgmma_ss_k_major_n128", max_abs_err(ref, res + kSsN128 * M * N, 128), EXACT);
  report("wgmma_ss_k_major_n192", max_abs_err(ref, res + kSsN192 * M * N, 192), EXACT);
  report("wgmma_ss_k_major_n256", max_abs_err(ref, res + kSsN256 * M * N, 256), EXACT);
  report("wgmma_rs_formula_fragment_n256", max_abs_err(ref, res + kRsFormula * M * N, 256), EXACT);
  report("wgmma_rs_ldmatrix_fragment_n256", max_abs_err(ref, res + kRsLdmatrix * M * N, 256),
         EXACT);
  report("wgmma_ss_mn_major_b_n256", max_abs_err(ref, res + kSsMnMajor * M * N, 256), EXACT);
  report("wgmma_rs_mn_major_b_n256", max_abs_err(ref, res + kRsMnMajor * M * N, 256), EXACT);

  // The stored C is bf16(accumulator); the exact accumulator rounds like the reference.
  std::vector<float> ref_bf16(M * N), got_c(M * N);
  for (int i = 0; i < M * N; ++i) {
    ref_bf16[i] = __bfloat162float(__float2bfloat16(ref[i]));
    got_c[i] = __bfloat162float(hC[i]);
  }
  report("tma_store_stmatrix_swizzle", max_abs_err(ref_bf16, got_c), EXACT);

  // ---- cluster kernel ----
  CUDA_CHECK(ptx::set_max_dynamic_smem(cluster_kernel, CLUSTER_SMEM));
  CUDA_CHECK(ptx::launch_cluster(cluster_kernel, dim3(CLUSTER_CTAS), dim3(384), CLUSTER_SMEM, 0,
                                 CLUSTER_CTAS, tmap_a_plain, d_cluster_tiles, d_flags));
  CUDA_CHECK(cudaGetLastError());
  CUDA_CHECK(cudaDeviceSynchronize());

  std::vector<float> cluster_tiles(CLUSTER_CTAS * 64 * 64);
  uint32_t flags[kClusterFlags];
  CUDA_CHECK(cudaMemcpy(cluster_tiles.data(), d_cluster_tiles,
                        cluster_tiles.size() * sizeof(float), cudaMemcpyDeviceToHost));
  CUDA_CHECK(cudaMemcpy(flags, d_flags, sizeof(flags), cudaMemcpyDeviceToHost));

  // Both CTAs must hold A[0:64][0:64], though only rank 0 issued the load.
  double err_multicast = 0.0;
  for (int cta = 0; cta < CLUSTER_CTAS; ++cta) {
    for (int r = 0; r < 64; ++r) {
      for (int k = 0; k < 64; ++k) {
        const double got = cluster_tiles[cta * 64 * 64 + r * 64 + k];
        err_multicast = worse(err_multicast, std::fabs(got - fA[r * K + k]));
      }
    }
  }
  report("cluster_multicast_tma", err_multicast, 0.0);
  report_fact("mbarrier_remote_arrive", flags[kRemoteArrive], 1234);
  report_fact("mbarrier_remote_arrive_cta", flags[kRemoteArriveCta], 4321);
  // Rank r's mailbox was written by rank r^1 with 100 + (r^1); each reads 100 + r from its peer.
  report_fact("dsmem_store_remote",
              flags[kDsmemStored + 0] * 1000LL + flags[kDsmemStored + 1], 101 * 1000LL + 100);
  report_fact("dsmem_load_remote",
              flags[kDsmemLoaded + 0] * 1000LL + flags[kDsmemLoaded + 1], 100 * 1000LL + 101);
  report_fact("cluster_nctarank", flags[kNctarank + 0] * 10LL + flags[kNctarank + 1], 22);
  report_fact("cluster_id_x", flags[kClusterId + 0] * 10LL + flags[kClusterId + 1], 0);
  report_fact("cluster_ctarank", flags[kCtarankOfBlock + 0] * 10LL + flags[kCtarankOfBlock + 1],
              1);
  report_fact("setmaxnreg_dec_producers", flags[kProducerThreads], CLUSTER_CTAS * 128);
  report_fact("setmaxnreg_inc_consumers", flags[kConsumerThreads], CLUSTER_CTAS * 256);

  CUDA_CHECK(cudaFree(dA));
  CUDA_CHECK(cudaFree(dB));
  CUDA_CHECK(cudaFree(dBt));
  CUDA_CHECK(cudaFree(dC));
  CUDA_CHECK(cudaFree(d_results));
  CUDA_CHECK(cudaFree(d_tile_a));
  CUDA_CHECK(cudaFree(d_tile_b));
  CUDA_CHECK(cudaFree(d_tile_bt));
  CUDA_CHECK(cudaFree(d_cluster_tiles));
  CUDA_CHECK(cudaFree(d_flags));
  return 0;
}
