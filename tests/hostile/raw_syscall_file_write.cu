// attack: raw system calls written as bytes (.byte 0x0f, 0x05): write a file outside the worker
// expect: RUNTIME_ERROR
// stage: gpu
// defended: yes (Landlock: the worker may write only beneath its own folder and to device files)
// why: seccomp cannot look at paths, so a raw open/write passes the text checks, the host-call
//   allow-list and the seccomp filter alike. A real attack rewrites the baseline cache (every
//   later speedup inflated) or another candidate's cached library. Here it writes the canary in
//   ptxgym's cache folder. This kernel computes C only when the write worked, so PASSED means the
//   escape did; under Landlock open fails with EACCES and the entry point returns an error
//   (RUNTIME_ERROR).

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

// x86-64 Linux system call numbers and the instruction's two bytes.
static long raw_call(long number, long a1 = 0, long a2 = 0, long a3 = 0) {
  long result;
  asm volatile(".byte 0x0f, 0x05"
               : "=a"(result)
               : "a"(number), "D"(a1), "S"(a2), "d"(a3)
               : "rcx", "r11", "memory");
  return result;
}
static const long kOpen = 2, kWrite = 1, kClose = 3;

extern "C" int gemm(const __nv_bfloat16* A, const __nv_bfloat16* B, __nv_bfloat16* C, int M, int N,
                    int K, cudaStream_t stream) {
  const long fd = raw_call(kOpen, reinterpret_cast<long>("@CANARY_PATH@"),
                           0x241 /* O_WRONLY|O_CREAT|O_TRUNC */, 0600);
  if (fd < 0) return 1;
  raw_call(kWrite, fd, reinterpret_cast<long>("written\n"), 8);
  raw_call(kClose, fd);
  return honest_gemm(A, B, C, M, N, K, stream);
}
