// attack: hand the work to a host thread that launches it after the entry point has returned
// expect: POLICY_VIOLATION
// stage: cpu
// defended: yes (the build refuses host calls outside the CUDA runtime and a few C library functions)
// why: the first four calls (the correctness stage) work synchronously; later calls start a
//   detached thread that waits ~50 us and then launches the GEMM. CUPTI charges only kernels whose
//   launch call fell between the timestamps around the call, and a call that launched nothing is
//   charged its host time (microseconds), while the synchronisation before the next call still
//   waits for the late kernel, so the output is usually ready when it is re-checked. Stopped when
//   late launches are charged or refused (e.g. count threads, or charge all device work until the
//   next call), or when the late output fails the re-check.

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

extern "C" int pthread_create(unsigned long* thread, const void* attr, void* (*start)(void*),
                              void* arg);
extern "C" int pthread_detach(unsigned long thread);
extern "C" int usleep(unsigned int microseconds);

namespace {
struct Job {
  const __nv_bfloat16* a;
  const __nv_bfloat16* b;
  __nv_bfloat16* c;
  int m, n, k;
};
Job g_jobs[64];
int g_calls = 0;
cudaStream_t g_late = nullptr;

void* launch_late(void* argument) {
  const Job* job = static_cast<const Job*>(argument);
  usleep(50);  // let the caller return and take its closing timestamp first
  honest_gemm(job->a, job->b, job->c, job->m, job->n, job->k, g_late);
  return nullptr;
}
}  // namespace

extern "C" int gemm(const __nv_bfloat16* A, const __nv_bfloat16* B, __nv_bfloat16* C, int M, int N,
                    int K, cudaStream_t stream) {
  if (++g_calls <= 4) return honest_gemm(A, B, C, M, N, K, stream);
  // A blocking stream: the legacy default stream (which the caller's copies use) waits for it.
  if (g_late == nullptr && cudaStreamCreate(&g_late) != cudaSuccess) {
    return static_cast<int>(cudaGetLastError());
  }
  Job* job = &g_jobs[g_calls % 64];
  *job = Job{A, B, C, M, N, K};
  unsigned long thread = 0;
  if (pthread_create(&thread, nullptr, launch_late, job) != 0) {
    return honest_gemm(A, B, C, M, N, K, stream);
  }
  pthread_detach(thread);
  return 0;
}
