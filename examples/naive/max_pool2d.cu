// Naive 3x3 / stride 2 / padding 1 max pooling over NHWC maps: the plain-CUDA example kernel of
// the ptxgym MaxPool2d task (pooling category; a performance task).
//
//   x: [B, H, W, C] bf16;  y: [B, Ho, Wo, C] bf16, y[b, i, j, c] = max of x[b, r, s, c] over
//   r in 2i-1 .. 2i+1 and s in 2j-1 .. 2j+1 inside the map (padding never wins).
//
// One thread per output element, channels fastest, so consecutive threads read consecutive
// channels of the same pixel; the maximum of bf16 values is exact.

#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <math.h>

namespace {

__global__ void max_pool2d_kernel(const __nv_bfloat16* __restrict__ x,
                                  __nv_bfloat16* __restrict__ y, int B, int H, int W, int C,
                                  int Ho, int Wo) {
  long long count = (long long)B * Ho * Wo * C;
  long long stride = (long long)gridDim.x * blockDim.x;
  for (long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x; e < count; e += stride) {
    int c = (int)(e % C);
    long long pixel = e / C;
    int j = (int)(pixel % Wo);
    int i = (int)((pixel / Wo) % Ho);
    int b = (int)(pixel / ((long long)Wo * Ho));
    float best = -INFINITY;
    for (int r = 2 * i - 1; r <= 2 * i + 1; ++r) {
      if (r < 0 || r >= H) continue;
      for (int s = 2 * j - 1; s <= 2 * j + 1; ++s) {
        if (s < 0 || s >= W) continue;
        size_t at = (((size_t)b * H + r) * W + s) * C + c;
        best = fmaxf(best, __bfloat162float(x[at]));
      }
    }
    y[e] = __float2bfloat16(best);  // exact: best is a bf16 value
  }
}

}  // namespace

extern "C" int max_pool2d(const __nv_bfloat16* x, __nv_bfloat16* y, int B, int H, int W, int C,
                          int Ho, int Wo, cudaStream_t stream) {
  long long count = (long long)B * Ho * Wo * C;
  if (count == 0) return 0;
  long long blocks = (count + 255) / 256;
  if (blocks > 65536) blocks = 65536;
  max_pool2d_kernel<<<(unsigned)blocks, 256, 0, stream>>>(x, y, B, H, W, C, Ho, Wo);
  return (int)cudaGetLastError();
}
