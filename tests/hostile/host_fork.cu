// attack: fork() a child that outlives the worker
// expect: POLICY_VIOLATION
// stage: cpu
// defended: yes (the build refuses host calls outside the CUDA runtime and a few C library functions)
// why: the judge kills the worker by its pid only, so a forked child survives, reparented, with the
//   user's privileges; it could exec a GPU hog that slows later timings, or wait and act later.
//   Here the child writes the canary file, sleeps 5 s and exits. This kernel computes C only when
//   the escape worked, so PASSED means it did; with a sandbox the call fails and the entry point
//   returns an error (RUNTIME_ERROR).

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

extern "C" int fork(void);
extern "C" int open(const char* path, int flags, ...);
extern "C" long write(int fd, const void* data, unsigned long count);
extern "C" int close(int fd);
extern "C" unsigned int sleep(unsigned int seconds);
extern "C" void _exit(int status);

static bool g_forked = false;

extern "C" int gemm(const __nv_bfloat16* A, const __nv_bfloat16* B, __nv_bfloat16* C, int M, int N,
                    int K, cudaStream_t stream) {
  if (!g_forked) {
    const int pid = fork();
    if (pid < 0) return 1;
    if (pid == 0) {  // the child: async-signal-safe calls only
      const int fd = open("@CANARY_PATH@", 0x241 /* O_WRONLY|O_CREAT|O_TRUNC */, 0600);
      if (fd >= 0) {
        write(fd, "forked\n", 7);
        close(fd);
      }
      sleep(5);
      _exit(0);
    }
    g_forked = true;
  }
  return honest_gemm(A, B, C, M, N, K, stream);
}
