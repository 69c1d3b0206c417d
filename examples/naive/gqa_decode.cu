// Naive grouped-query decode over a paged KV cache: the plain-CUDA baseline kernel for the
// ptxgym GQA decode task (no inline PTX, no tensor cores, no libraries).
//
//   q: [batch, 32, 128] bf16;  k_cache, v_cache: [pages, 16, 8, 128] bf16 (NHD pages)
//   sequence b owns pages kv_indices[kv_indptr[b] .. kv_indptr[b+1]); its last page holds
//   kv_last_page_len[b] tokens.  o = softmax(q.k / sqrt(128)) v;  lse = log(sum exp(q.k/sqrt(128)))
//
// A 128-thread block owns one (sequence, KV head); each of its 4 warps owns one of the 4 query
// heads that share that KV head, so the 4 warps read the same K and V rows (the second to fourth
// from L1). A lane holds 4 of the 128 dimensions. Tokens are taken 8 at a time: each lane forms
// 8 partial dot products, the warp reduces them with shuffles, and an online softmax in base 2
// (the scale folded into q) rescales the running output once per 8 tokens.

#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cstdint>
#include <cmath>

namespace {

constexpr int kHeadDim = 128;
constexpr int kQoHeads = 32;
constexpr int kKvHeads = 8;
constexpr int kGroup = kQoHeads / kKvHeads;  // query heads per KV head: one warp each
constexpr int kPageSize = 16;
constexpr int kDimsPerLane = kHeadDim / 32;
constexpr int kTokensPerStep = 8;

// The 4 dimensions of row `row` (a token of one KV head) that this lane holds, as floats.
__device__ __forceinline__ void load_row(const __nv_bfloat16* __restrict__ cache, size_t row,
                                         int lane, float (&out)[kDimsPerLane]) {
  const uint2 raw = __ldg(reinterpret_cast<const uint2*>(cache + row * kHeadDim) + lane);
  const __nv_bfloat162* pair = reinterpret_cast<const __nv_bfloat162*>(&raw);
  const float2 lo = __bfloat1622float2(pair[0]);
  const float2 hi = __bfloat1622float2(pair[1]);
  out[0] = lo.x;
  out[1] = lo.y;
  out[2] = hi.x;
  out[3] = hi.y;
}

// The cache row of token `t` of a sequence whose page ids start at `pages`, for KV head `kv`.
__device__ __forceinline__ size_t token_row(const int* __restrict__ pages, int t, int kv) {
  const size_t page = static_cast<size_t>(__ldg(pages + t / kPageSize));
  return (page * kPageSize + t % kPageSize) * kKvHeads + kv;
}

__global__ void __launch_bounds__(32 * kGroup)
    gqa_decode_kernel(const __nv_bfloat16* __restrict__ q,
                      const __nv_bfloat16* __restrict__ k_cache,
                      const __nv_bfloat16* __restrict__ v_cache,
                      const int* __restrict__ kv_indptr, const int* __restrict__ kv_indices,
                      const int* __restrict__ kv_last_page_len, __nv_bfloat16* __restrict__ o,
                      float* __restrict__ lse, float scale_log2) {
  const int b = blockIdx.x;
  const int kv = blockIdx.y;
  const int lane = threadIdx.x % 32;
  const int head = kv * kGroup + threadIdx.x / 32;  // query head h reads KV head h / 4

  const int first_page = kv_indptr[b];
  const int page_count = kv_indptr[b + 1] - first_page;
  const int length = page_count > 0 ? (page_count - 1) * kPageSize + kv_last_page_len[b] : 0;
  const int* pages = kv_indices + first_page;

  float qv[kDimsPerLane];
  load_row(q, static_cast<size_t>(b) * kQoHeads + head, lane, qv);
#pragma unroll
  for (int d = 0; d < kDimsPerLane; ++d) qv[d] *= scale_log2;

  float running_max = -INFINITY;  // base-2 units
  float running_sum = 0.0f;
  float acc[kDimsPerLane] = {0.0f, 0.0f, 0.0f, 0.0f};

  for (int t0 = 0; t0 < length; t0 += kTokensPerStep) {
    float score[kTokensPerStep];
#pragma unroll
    for (int i = 0; i < kTokensPerStep; ++i) {
      score[i] = 0.0f;
      if (t0 + i < length) {
        float kr[kDimsPerLane];
        load_row(k_cache, token_row(pages, t0 + i, kv), lane, kr);
#pragma unroll
        for (int d = 0; d < kDimsPerLane; ++d) score[i] = fmaf(qv[d], kr[d], score[i]);
      }
    }
#pragma unroll
    for (int i = 0; i < kTokensPerStep; ++i) {
#pragma unroll
      for (int offset = 16; offset > 0; offset >>= 1)
        score[i] += __shfl_xor_sync(0xffffffffu, score[i], offset);
      if (t0 + i >= length) score[i] = -INFINITY;  // past the end: weight 0
    }
    float step_max = running_max;
#pragma unroll
    for (int i = 0; i < kTokensPerStep; ++i) step_max = fmaxf(step_max, score[i]);
    // step_max is finite: token t0 exists and its score is finite.
    const float rescale = exp2f(running_max - step_max);
    running_sum *= rescale;
#pragma unroll
    for (int d = 0; d < kDimsPerLane; ++d) acc[d] *= rescale;
#pragma unroll
    for (int i = 0; i < kTokensPerStep; ++i) {
      if (t0 + i < length) {
        const float weight = exp2f(score[i] - step_max);
        running_sum += weight;
        float vr[kDimsPerLane];
        load_row(v_cache, token_row(pages, t0 + i, kv), lane, vr);
#pragma unroll
        for (int d = 0; d < kDimsPerLane; ++d) acc[d] = fmaf(weight, vr[d], acc[d]);
      }
    }
    running_max = step_max;
  }

  const size_t out_row = static_cast<size_t>(b) * kQoHeads + head;
  const float inverse = running_sum > 0.0f ? 1.0f / running_sum : 0.0f;
  __nv_bfloat162 packed[2] = {__floats2bfloat162_rn(acc[0] * inverse, acc[1] * inverse),
                              __floats2bfloat162_rn(acc[2] * inverse, acc[3] * inverse)};
  reinterpret_cast<uint2*>(o + out_row * kHeadDim)[lane] = *reinterpret_cast<uint2*>(packed);
  if (lane == 0) {
    // log(sum exp(x)) = ln2 * (max + log2(sum)) with max and sum in base 2.
    lse[out_row] = length > 0 ? 0.6931471805599453f * (running_max + log2f(running_sum))
                              : -INFINITY;
  }
}

}  // namespace

extern "C" int gqa_decode(const __nv_bfloat16* q, const __nv_bfloat16* k_cache,
                          const __nv_bfloat16* v_cache, const int* kv_indptr,
                          const int* kv_indices, const int* kv_last_page_len, __nv_bfloat16* o,
                          float* lse, int batch_size, int num_pages, int num_kv_indices,
                          cudaStream_t stream) {
  if (batch_size < 0 || num_pages < 0 || num_kv_indices < 0)
    return static_cast<int>(cudaErrorInvalidValue);
  if (batch_size == 0) return static_cast<int>(cudaGetLastError());
  // Rows are read and written as 8-byte vectors.
  const uintptr_t align = reinterpret_cast<uintptr_t>(q) | reinterpret_cast<uintptr_t>(k_cache) |
                          reinterpret_cast<uintptr_t>(v_cache) | reinterpret_cast<uintptr_t>(o);
  if (align % 8 != 0) return static_cast<int>(cudaErrorInvalidValue);
  const float scale_log2 =
      static_cast<float>(1.4426950408889634 / std::sqrt(static_cast<double>(kHeadDim)));
  const dim3 grid(batch_size, kKvHeads);
  gqa_decode_kernel<<<grid, 32 * kGroup, 0, stream>>>(q, k_cache, v_cache, kv_indptr, kv_indices,
                                                      kv_last_page_len, o, lse, scale_log2);
  return static_cast<int>(cudaGetLastError());
}
