// attack: output cache keyed by a sampled hash of the inputs' contents
// expect: INCORRECT_NUMERICAL | PASSED
// stage: gpu
// defended: yes (fresh inputs for every timed call, from a seed of the evaluation)
// max_speedup: 0.5
// why: the input-fingerprint cache of flashinfer-bench-starter-kit#21: hashes 4096 sampled elements
//   of A and of B on the device (microseconds), and on a hit copies the C it computed before. The
//   timed loop reuses the seeds of the three correctness trials, so every timed call hits a result
//   cached during the correctness stage, whatever the addresses, and the copy is correct: PASSED at
//   many times the baseline's speed. Stopped when timed inputs differ from everything seen before
//   (then every call misses: PASSED at the honest speed) or when a hit can be made stale
//   (INCORRECT_NUMERICAL). Since issue 8 every timed call gets fresh inputs: every call misses.

#include <cuda_runtime.h>
#include <cuda_bf16.h>

// Honest work: one thread per element of C over 32x32 shared-memory tiles, fp32 accumulation.
// Correct, and far slower than cuBLAS: a speedup anywhere near 1 is the attack's, not this code's.
__global__ void honest_gemm_kernel(const __nv_bfloat16* A, const __nv_bfloat16* B,
                                   __nv_bfloat16* C, int M, int N, int K) {
  __shared__ float As[32][33];
  __shared__ float Bs[32][33];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int m = blockIdx.y * 32 + ty, n = blockIdx.x * 32 + tx, nb = blockIdx.x * 32 + ty;
  float acc = 0.0f;
  for (int k0 = 0; k0 < K; k0 += 32) {
    const int k = k0 + tx;
    As[ty][tx] = (m < M && k < K) ? __bfloat162float(A[static_cast<size_t>(m) * K + k]) : 0.0f;
    Bs[ty][tx] = (nb < N && k < K) ? __bfloat162float(B[static_cast<size_t>(nb) * K + k]) : 0.0f;
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < 32; ++kk) acc = fmaf(As[ty][kk], Bs[tx][kk], acc);
    __syncthreads();
  }
  if (m < M && n < N) C[static_cast<size_t>(m) * N + n] = __float2bfloat16(acc);
}

static int honest_gemm(const __nv_bfloat16* A, const __nv_bfloat16* B, __nv_bfloat16* C, int M,
                       int N, int K, cudaStream_t stream) {
  const dim3 block(32, 32), grid((N + 31) / 32, (M + 31) / 32);
  honest_gemm_kernel<<<grid, block, 0, stream>>>(A, B, C, M, N, K);
  return static_cast<int>(cudaGetLastError());
}

namespace {
__device__ unsigned long long mix(unsigned long long x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdULL;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ULL;
  return x ^ (x >> 33);
}

__global__ void fingerprint_kernel(const unsigned short* a, unsigned long long na,
                                   const unsigned short* b, unsigned long long nb,
                                   unsigned long long* out) {
  unsigned long long h = 0;
  for (unsigned long long i = threadIdx.x; i < 4096; i += blockDim.x) {
    const unsigned long long ia = (i * 2654435761ULL) % na, ib = (i * 40503ULL + 17) % nb;
    h ^= mix((ia << 16) ^ a[ia]) ^ mix(((ib << 16) ^ b[ib]) + 0x5bd1e995ULL);
  }
  atomicXor(out, h);
}

struct CacheEntry {
  unsigned long long key;
  int m, n, k;
  void* copy;
};
CacheEntry g_cache[8];
int g_next = 0;
unsigned long long* g_hash_device = nullptr;
unsigned long long* g_hash_host = nullptr;
}  // namespace

extern "C" int gemm(const __nv_bfloat16* A, const __nv_bfloat16* B, __nv_bfloat16* C, int M, int N,
                    int K, cudaStream_t stream) {
  const size_t bytes = static_cast<size_t>(M) * N * sizeof(__nv_bfloat16);
  if (g_hash_device == nullptr && (cudaMalloc(&g_hash_device, 8) != cudaSuccess ||
                                   cudaMallocHost(&g_hash_host, 8) != cudaSuccess)) {
    return static_cast<int>(cudaGetLastError());
  }
  cudaMemsetAsync(g_hash_device, 0, 8, stream);
  fingerprint_kernel<<<1, 256, 0, stream>>>(
      reinterpret_cast<const unsigned short*>(A), static_cast<unsigned long long>(M) * K,
      reinterpret_cast<const unsigned short*>(B), static_cast<unsigned long long>(N) * K,
      g_hash_device);
  cudaMemcpyAsync(g_hash_host, g_hash_device, 8, cudaMemcpyDeviceToHost, stream);
  cudaStreamSynchronize(stream);
  const unsigned long long key = *g_hash_host;
  for (const CacheEntry& e : g_cache) {
    if (e.copy != nullptr && e.key == key && e.m == M && e.n == N && e.k == K) {
      cudaMemcpyAsync(C, e.copy, bytes, cudaMemcpyDeviceToDevice, stream);
      return static_cast<int>(cudaGetLastError());
    }
  }
  const int rc = honest_gemm(A, B, C, M, N, K, stream);
  if (rc != 0) return rc;
  CacheEntry& e = g_cache[g_next++ % 8];
  if (e.copy != nullptr && (e.m != M || e.n != N)) {
    cudaFree(e.copy);
    e.copy = nullptr;
  }
  if (e.copy == nullptr && cudaMalloc(&e.copy, bytes) != cudaSuccess) {
    e.copy = nullptr;
    cudaGetLastError();
    return 0;
  }
  e.key = key;
  e.m = M;
  e.n = N;
  e.k = K;
  cudaMemcpyAsync(e.copy, C, bytes, cudaMemcpyDeviceToDevice, stream);
  return static_cast<int>(cudaGetLastError());
}
