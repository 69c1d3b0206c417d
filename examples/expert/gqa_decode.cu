// Expert paged-KV grouped-query decode for Hopper (sm_90a): bulk-copy (TMA) page streaming,
// split-KV with perfect page balance, log-sum-exp merge.
//
// H200, 2026-12-02, `ptxgym eval` with default settings (docs/benchmarks.md, eighteenth session):
// PASSED on all 5 workloads (35 checks), qualified by its bulk copies (UBLKCP 65,536 warps),
// memcheck clean; 2.5017 ms summed against FlashInfer 2.6240 ms (1.049x), per workload
// 0.988x-1.260x. examples/expert/README.md has the design checks.
//
//   q: [batch, 32, 128] bf16;  k_cache, v_cache: [pages, 16, 8, 128] bf16 (NHD pages);
//   sequence b owns pages kv_indices[kv_indptr[b] .. kv_indptr[b+1]), its last page holding
//   kv_last_page_len[b] tokens.  o = softmax(q.k / sqrt(128)) v (bf16),  lse = natural-log LSE.
//
// Design
//   * Decode is memory-bound (4 FLOP per K/V byte: each bf16 element feeds 4 query heads): the goal
//     is to stream every K/V byte once at close to HBM bandwidth (~4.3-4.8 TB/s on the H200).
//   * A CTA works on ALL 8 KV heads of a page at once. In NHD a page of one cache is 16 tokens x
//     8 heads x 128 dims = 32 KB of CONTIGUOUS memory, so one page of K and one of V are two 1-D
//     bulk copies (cp.async.bulk, SASS UBLKCP) of 32 KB each: no tensor map, no 256-B pieces.
//     Each K/V byte is read once from HBM and once from shared memory, and serves the 4 query
//     heads of its group (GQA) from registers.
//   * Split-KV "stream-K" style, no host planning: the concatenated page list kv_indices[0, N)
//     (N = num_kv_indices) is cut into G = min(#SMs, N) equal ranges, CTA c takes pages
//     [N*c/G, N*(c+1)/G). One CTA per SM (persistent by construction), every SM streams the same
//     number of pages whatever the batch size and the length mix (b4-kv131072: 4 sequences over
//     132 CTAs; b512-short: ~3-9 sequences per CTA). A CTA walks the sequences its range
//     intersects ("segments"). A sequence that lies inside one range is finished in place
//     (bf16 O and LSE written directly); a sequence cut by range boundaries leaves one
//     normalised fp32 partial (O_s, base-2 LSE_s) per piece in scratch, and a second small
//     kernel merges the pieces with the log-sum-exp rule. Only a CTA's first and last segment
//     can be cut, so the scratch has 2 slots per CTA: slot 2c (the segment holding the range's
//     first page) and 2c+1 (its last segment, when that is another sequence).
//   * 288 threads: warps 0-7 are consumers (warp h = KV head h and its 4 query heads), warp 8 is
//     the producer. One producer lane issues the two bulk copies per page into a 3-stage ring of
//     64 KB stages guarded by full/empty mbarriers; the producer warp fetches the page ids 32 at
//     a time (one coalesced load, then shuffles) so the id-load latency is not on the issue path.
//   * Consumer lane layout (warp h): lane = 16*tg + dg; the lane owns dims 8dg..8dg+7 and tokens
//     8tg..8tg+7 of every page. Q·K: 8 tokens x 4 heads = 32 partial dots per lane (q held in fp32
//     registers, pre-scaled by scale*log2(e) so that softmax runs in exp2), reduced over the 16
//     lanes of a half-warp by a reduce-scatter butterfly (16+8+4+2 = 30 shuffles instead of
//     32 x 4 = 128): afterwards lane dg holds the two full scores (head dg/4, tokens
//     8tg + 2(dg%4) + {0,1}). Online softmax per head in fp32 (max over the page by 3 shuffles,
//     ex2.approx), P goes through 256 B of per-warp shared memory, and P·V accumulates into
//     o[4 heads][8 dims] per lane. The two token halves are added once, at the end of a segment.
//   * Ragged last page: the producer copies only kv_last_page_len x 4 KB (token rows of a page are
//     contiguous over heads) and the consumers mask its missing tokens: score -inf and the V row
//     zeroed (the smem rows behind it hold stale or uninitialised bytes, possibly NaN patterns,
//     and 0 x NaN would poison the sum).
//
// Shared memory budget (dynamic, 1 CTA per SM)
//   3 stages x (K page 32768 B + V page 32768 B)      = 196608 B
//   P exchange: 8 warps x 4 heads x 16 tokens x 4 B    =   2048 B
//   6 mbarriers (full[3], empty[3])                    =     48 B
//   total                                              = 198704 B of 232448 B.
//   Up to 192 KB of K/V in flight per SM: Little's law at 4.8 TB/s / 132 SMs = 36 B/ns and
//   ~1.5 us loaded latency needs ~55 KB, so 3 stages leave margin; 2 stages (128 KB) is the
//   variant to time if the SM issue rate, not the bytes in flight, turns out to be the limit.
//
// Split heuristic
//   Equal page ranges over G = min(#SMs, num_kv_indices) CTAs: the makespan is ceil(N/G) pages
//   for every workload, i.e. the 132 SMs are full from start to end (no wave quantisation).
//   The merge traffic is at most 2G partials of 32 x 129 floats (4.3 MB) against >= 2.1 GB of
//   K/V for every workload of the pool (< 0.5 %).
//
// Costs per page per consumer warp (estimate): 256 + 256 FFMA, 128 bf16->fp32 unpacks,
// 16 LDS.128 of K/V, 30 + 7 + 4 SHFL, 2 MUFU.EX2 + 1; about 1400 issue slots per SM
// sub-partition per page against the ~3500 cycles a 64 KB page takes at 36 B/ns per SM.

#include "ptxgym_h100.cuh"

#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cstdint>
#include <cmath>

namespace {

constexpr int kHeadDim = 128;
constexpr int kQoHeads = 32;
constexpr int kKvHeads = 8;
constexpr int kGroup = kQoHeads / kKvHeads;                  // 4 query heads per KV head
constexpr int kPageSize = 16;
constexpr uint32_t kTokenBytes = kKvHeads * kHeadDim * 2;    // 4096: one token, all 8 heads
constexpr uint32_t kPageBytes = kPageSize * kTokenBytes;     // 32768: one page of one cache
constexpr size_t kPageElems = static_cast<size_t>(kPageSize) * kKvHeads * kHeadDim;
constexpr int kStages = 3;
constexpr int kConsumerWarps = kKvHeads;                     // warp h <-> KV head h
constexpr int kProducerWarp = kConsumerWarps;
constexpr int kThreads = (kConsumerWarps + 1) * 32;          // 288

// Shared memory layout, offsets from the 128-B-aligned base.
constexpr uint32_t kOffStage = 0;                            // stage s: K at 2s*32K, V at +32K
constexpr uint32_t kOffP = kStages * 2 * kPageBytes;         // 196608
constexpr uint32_t kPBytes = kConsumerWarps * kGroup * kPageSize * 4;  // 2048
constexpr uint32_t kOffBar = kOffP + kPBytes;                // 198656
constexpr uint32_t kSmemBytes = kOffBar + 2 * kStages * 8;            // 198704
static_assert(kOffBar % 8 == 0, "mbarriers need 8-B alignment");
static_assert(kPageBytes % 16 == 0 && kTokenBytes % 16 == 0, "bulk copies move 16-B multiples");
static_assert(kSmemBytes <= 232448, "fits the 227 KB opt-in limit");

constexpr float kLn2 = 0.6931471805599453f;

// ---- The split: CTA c of G takes global page positions [range_begin(c), range_begin(c+1)). ----
__host__ __device__ __forceinline__ int range_begin(int c, int num_ctas, int n) {
  return static_cast<int>((static_cast<long long>(n) * c) / num_ctas);
}
// The CTA whose range holds position g: the largest c with n*c/G <= g, i.e.
// n*c < (g+1)*G  <=>  c <= ((g+1)*G - 1) / n.
__host__ __device__ __forceinline__ int cta_of_position(int g, int num_ctas, int n) {
  return static_cast<int>((static_cast<long long>(g + 1) * num_ctas - 1) / n);
}
// Scratch slot of the piece of a sequence starting at position `seq_begin` inside CTA c's range:
// 2c if the piece holds the range's first page (the sequence began at or before it), else 2c+1.
__host__ __device__ __forceinline__ int partial_slot(int c, int seq_begin, int num_ctas, int n) {
  return 2 * c + (range_begin(c, num_ctas, n) >= seq_begin ? 0 : 1);
}

// The sequence holding global page position g (0 <= g < kv_indptr[batch]): the largest b with
// kv_indptr[b] <= g. Empty sequences (equal indptr entries) are skipped because the LAST of the
// equal entries wins.
__device__ __forceinline__ int find_sequence(const int* __restrict__ kv_indptr, int batch, int g) {
  int lo = 0, hi = batch - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) >> 1;
    if (__ldg(kv_indptr + mid) <= g) lo = mid; else hi = mid - 1;
  }
  return lo;
}

// 8 bf16 (one uint4) -> 8 fp32. bf16 is the top half of an fp32, so this is a shift or a mask.
__device__ __forceinline__ void unpack8(const uint4 raw, float (&f)[8]) {
  const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    f[2 * i] = __uint_as_float(w[i] << 16);
    f[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
  }
}

__device__ __forceinline__ uint32_t pack2(float lo, float hi) { return ptx::pack_bf16x2(lo, hi); }

// One level of the half-warp reduce-scatter (Step 3c): the lane keeps the upper or lower half of
// its kN live values (chosen by lane bit kOff) and adds its partner's copy of that half.
template <int kOff, int kN>
__device__ __forceinline__ void reduce_scatter_level(float (&part)[32], int lane) {
  const bool upper = (lane & kOff) != 0;
#pragma unroll
  for (int i = 0; i < kN; ++i) {
    const float send = upper ? part[i] : part[i + kN];
    const float keep = upper ? part[i + kN] : part[i];
    part[i] = keep + __shfl_xor_sync(0xffffffffu, send, kOff);
  }
}

__global__ void __launch_bounds__(kThreads, 1)
    gqa_decode_split_kernel(const __nv_bfloat16* __restrict__ q,
                            const __nv_bfloat16* __restrict__ k_cache,
                            const __nv_bfloat16* __restrict__ v_cache,
                            const int* __restrict__ kv_indptr, const int* __restrict__ kv_indices,
                            const int* __restrict__ kv_last_page_len,
                            __nv_bfloat16* __restrict__ o, float* __restrict__ lse,
                            float* __restrict__ part_o, float* __restrict__ part_lse2,
                            int batch, int num_positions, float q_scale_log2) {
  // Step 0: carve shared memory. The base is used as declared (bulk copies need 16 B, the
  // declaration asks for 128): rounding it through an integer would hide from the compiler that
  // the pointer is shared, and every K/V/P read would become a generic LD instead of LDS.
  extern __shared__ __align__(128) uint8_t smem[];
  float* p_buf = reinterpret_cast<float*>(smem + kOffP);
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + kOffBar);
  uint64_t* empty = full + kStages;

  const int warp = static_cast<int>(ptx::warp_idx());
  const int lane = static_cast<int>(threadIdx.x % 32);
  const int cta = blockIdx.x;
  const int num_ctas = gridDim.x;
  const int g_begin = range_begin(cta, num_ctas, num_positions);
  const int g_end = range_begin(cta + 1, num_ctas, num_positions);

  // Step 1: barriers. full[s]: 1 arrival (the producer's arrive.expect_tx) + the copied bytes;
  // empty[s]: one arrival per consumer warp once it has read the stage.
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      ptx::mbar_init(&full[s], 1);
      ptx::mbar_init(&empty[s], kConsumerWarps);
    }
    ptx::fence_mbarrier_init();  // make the inits visible to the async proxy (complete_tx)
  }
  __syncthreads();
  if (g_begin >= g_end) return;  // only when G > N, which the host never launches

  // Both roles walk the same pages in the same order: position g, its sequence b (pages
  // [seq_begin, seq_end)), ring slot it % kStages with phase (it / kStages) & 1.
  if (warp == kProducerWarp) {
    // ---------------- Step 2: producer warp (lane 0 issues, all lanes fetch page ids) ----------
    int b = find_sequence(kv_indptr, batch, g_begin);
    int seq_end = __ldg(kv_indptr + b + 1);
    int last_len = __ldg(kv_last_page_len + b);
    uint32_t it = 0;
    for (int base = g_begin; base < g_end; base += 32) {
      // 32 page ids in one coalesced load; lane j's id is broadcast when page base+j is issued.
      const int my_page = base + lane < g_end ? __ldg(kv_indices + base + lane) : 0;
      const int count = min(32, g_end - base);
      for (int j = 0; j < count; ++j, ++it) {
        const int g = base + j;
        while (g >= seq_end) {  // next non-empty sequence (warp-uniform)
          ++b;
          seq_end = __ldg(kv_indptr + b + 1);
          last_len = __ldg(kv_last_page_len + b);
        }
        const int page = __shfl_sync(0xffffffffu, my_page, j);
        // Ragged last page: copy only its valid token rows (a token row = 8 heads x 256 B).
        const uint32_t bytes =
            static_cast<uint32_t>(g == seq_end - 1 ? last_len : kPageSize) * kTokenBytes;
        const int s = static_cast<int>(it % kStages);
        const uint32_t phase = (it / kStages) & 1u;
        ptx::mbar_wait(&empty[s], phase ^ 1u);  // fresh barrier: parity 1 passes at once
        if (lane == 0) {
          uint8_t* dst = smem + kOffStage + static_cast<uint32_t>(s) * 2 * kPageBytes;
          const size_t src = static_cast<size_t>(page) * kPageElems;
          ptx::mbar_arrive_expect_tx(&full[s], 2 * bytes);  // K bytes + V bytes of this stage
          ptx::bulk_copy_g2s(dst, k_cache + src, bytes, &full[s]);
          ptx::bulk_copy_g2s(dst + kPageBytes, v_cache + src, bytes, &full[s]);
        }
        __syncwarp();
      }
    }
    return;
  }

  // ---------------- Step 3: consumer warps: warp h = KV head h, query heads 4h..4h+3 ----------
  const int h = warp;
  const int tg = lane >> 4;        // token half: tokens 8tg..8tg+7 of each page
  const int dg = lane & 15;        // dim group: dims 8dg..8dg+7
  const int own_head = dg >> 2;    // after the reduce-scatter, this lane's scores are of head dg/4
  const int own_tok = tg * 8 + 2 * (dg & 3);  // ... tokens own_tok, own_tok+1
  float* my_p = p_buf + h * (kGroup * kPageSize);  // [4 heads][16 tokens] fp32, this warp only
  const uint32_t row_off = static_cast<uint32_t>(h) * (kHeadDim * 2) + dg * 16;  // in a token row

  int b = find_sequence(kv_indptr, batch, g_begin);
  uint32_t it = 0;
  int g = g_begin;
  while (g < g_end) {
    const int seq_begin = __ldg(kv_indptr + b);
    const int seq_end = __ldg(kv_indptr + b + 1);
    if (seq_end <= g) { ++b; continue; }  // empty sequence: the merge kernel writes it
    const int last_len = __ldg(kv_last_page_len + b);
    const int seg_end = min(seq_end, g_end);

    // Step 3a: q of the 4 query heads, this lane's 8 dims, pre-scaled so scores are base-2 logits.
    float qf[kGroup][8];
#pragma unroll
    for (int gq = 0; gq < kGroup; ++gq) {
      const uint4 raw = __ldg(reinterpret_cast<const uint4*>(
          q + (static_cast<size_t>(b) * kQoHeads + h * kGroup + gq) * kHeadDim + dg * 8));
      unpack8(raw, qf[gq]);
#pragma unroll
      for (int d = 0; d < 8; ++d) qf[gq][d] *= q_scale_log2;
    }
    float acc[kGroup][8];
#pragma unroll
    for (int gq = 0; gq < kGroup; ++gq)
#pragma unroll
      for (int d = 0; d < 8; ++d) acc[gq][d] = 0.0f;
    float m_own = -INFINITY;  // running max (base 2) of head own_head, same in its 8 lanes
    float l_own = 0.0f;       // this lane's share of that head's running sum

    for (; g < seg_end; ++g, ++it) {
      const int n_valid = g == seq_end - 1 ? last_len : kPageSize;
      const int s = static_cast<int>(it % kStages);
      ptx::mbar_wait(&full[s], (it / kStages) & 1u);
      const uint8_t* k_stage = smem + kOffStage + static_cast<uint32_t>(s) * 2 * kPageBytes;
      const uint8_t* v_stage = k_stage + kPageBytes;

      // Step 3b: partial dots over this lane's 8 dims. part[gq*8 + j] = q_gq . k_(8tg+j).
      float part[kGroup * 8];
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const uint4 raw = *reinterpret_cast<const uint4*>(
            k_stage + static_cast<uint32_t>(tg * 8 + j) * kTokenBytes + row_off);
        float kf[8];
        unpack8(raw, kf);
#pragma unroll
        for (int gq = 0; gq < kGroup; ++gq) {
          float dot = 0.0f;
#pragma unroll
          for (int d = 0; d < 8; ++d) dot = fmaf(qf[gq][d], kf[d], dot);
          part[gq * 8 + j] = dot;
        }
      }
      // Step 3c: reduce-scatter over the 16 lanes of the half-warp. At offset o the lane keeps
      // the upper or lower half of its live values (by lane bit o) and adds its partner's copy
      // of the same half; after o = 8, 4, 2, 1 the lane holds entries 2dg and 2dg+1, complete.
      reduce_scatter_level<8, 16>(part, lane);
      reduce_scatter_level<4, 8>(part, lane);
      reduce_scatter_level<2, 4>(part, lane);
      reduce_scatter_level<1, 2>(part, lane);
      // Step 3d: mask the ragged last page, then the online softmax of head own_head.
      const float s0 = own_tok < n_valid ? part[0] : -INFINITY;
      const float s1 = own_tok + 1 < n_valid ? part[1] : -INFINITY;
      float page_max = fmaxf(s0, s1);
      // Lanes of head own_head: dg in 4*own_head + {0..3} (xor 1, 2), both halves (xor 16).
      page_max = fmaxf(page_max, __shfl_xor_sync(0xffffffffu, page_max, 1));
      page_max = fmaxf(page_max, __shfl_xor_sync(0xffffffffu, page_max, 2));
      page_max = fmaxf(page_max, __shfl_xor_sync(0xffffffffu, page_max, 16));
      // Token 0 of every page is valid, so page_max is finite and so is m_new.
      const float m_new = fmaxf(m_own, page_max);
      const float alpha_own = ptx::ex2_approx(m_own - m_new);  // ex2(-inf) = 0 on the first page
      const float p0 = ptx::ex2_approx(s0 - m_new);            // masked: ex2(-inf) = 0
      const float p1 = ptx::ex2_approx(s1 - m_new);
      l_own = fmaf(l_own, alpha_own, p0 + p1);
      m_own = m_new;
      *reinterpret_cast<float2*>(my_p + own_head * kPageSize + own_tok) = make_float2(p0, p1);
      float alpha[kGroup];
#pragma unroll
      for (int gq = 0; gq < kGroup; ++gq)  // lane 4gq (tg 0, dg 4gq) owns head gq
        alpha[gq] = __shfl_sync(0xffffffffu, alpha_own, 4 * gq);
      __syncwarp();  // P written by all lanes before anyone reads it

      // Step 3e: P of this lane's 8 tokens for the 4 heads (broadcast reads), then O += P V.
      float pv[kGroup][8];
#pragma unroll
      for (int gq = 0; gq < kGroup; ++gq) {
        const float4 a = *reinterpret_cast<const float4*>(my_p + gq * kPageSize + tg * 8);
        const float4 c = *reinterpret_cast<const float4*>(my_p + gq * kPageSize + tg * 8 + 4);
        pv[gq][0] = a.x; pv[gq][1] = a.y; pv[gq][2] = a.z; pv[gq][3] = a.w;
        pv[gq][4] = c.x; pv[gq][5] = c.y; pv[gq][6] = c.z; pv[gq][7] = c.w;
#pragma unroll
        for (int d = 0; d < 8; ++d) acc[gq][d] *= alpha[gq];
      }
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        uint4 raw = *reinterpret_cast<const uint4*>(
            v_stage + static_cast<uint32_t>(tg * 8 + j) * kTokenBytes + row_off);
        if (tg * 8 + j >= n_valid) raw = make_uint4(0u, 0u, 0u, 0u);  // never copied: stale smem
        float vf[8];
        unpack8(raw, vf);
#pragma unroll
        for (int gq = 0; gq < kGroup; ++gq)
#pragma unroll
          for (int d = 0; d < 8; ++d) acc[gq][d] = fmaf(pv[gq][j], vf[d], acc[gq][d]);
      }
      // Step 3f: release the stage (all lanes' K/V/P reads are done) and protect my_p from the
      // next page's writes.
      __syncwarp();
      if (lane == 0) ptx::mbar_arrive(&empty[s]);
    }

    // Step 4: finish the segment. Add the two token halves, gather l and m of each head.
#pragma unroll
    for (int gq = 0; gq < kGroup; ++gq)
#pragma unroll
      for (int d = 0; d < 8; ++d) acc[gq][d] += __shfl_xor_sync(0xffffffffu, acc[gq][d], 16);
    float l_head = l_own;
    l_head += __shfl_xor_sync(0xffffffffu, l_head, 1);
    l_head += __shfl_xor_sync(0xffffffffu, l_head, 2);
    l_head += __shfl_xor_sync(0xffffffffu, l_head, 16);
    float l_all[kGroup], m_all[kGroup];
#pragma unroll
    for (int gq = 0; gq < kGroup; ++gq) {
      l_all[gq] = __shfl_sync(0xffffffffu, l_head, 4 * gq);
      m_all[gq] = __shfl_sync(0xffffffffu, m_own, 4 * gq);
    }
    // The sequence is whole in this CTA iff its first and last pages are in [g_begin, g_end).
    const bool whole = seq_begin >= g_begin && seq_end <= g_end;
    const int slot = partial_slot(cta, seq_begin, num_ctas, num_positions);
    // Lane (tg, dg) writes heads 2tg and 2tg+1, dims 8dg..8dg+7 (after the xor-16 add both
    // halves hold the full sums). Compile-time head loop + predicate: no dynamic acc indexing.
#pragma unroll
    for (int gq = 0; gq < kGroup; ++gq) {
      if ((gq >> 1) != tg) continue;
      const float inv = 1.0f / l_all[gq];  // l >= 1: the max element contributes ex2(0)
      const int head = h * kGroup + gq;
      if (whole) {
        uint4 packed;
        packed.x = pack2(acc[gq][0] * inv, acc[gq][1] * inv);
        packed.y = pack2(acc[gq][2] * inv, acc[gq][3] * inv);
        packed.z = pack2(acc[gq][4] * inv, acc[gq][5] * inv);
        packed.w = pack2(acc[gq][6] * inv, acc[gq][7] * inv);
        *reinterpret_cast<uint4*>(o + (static_cast<size_t>(b) * kQoHeads + head) * kHeadDim +
                                  dg * 8) = packed;
      } else {
        float4* dst = reinterpret_cast<float4*>(
            part_o + (static_cast<size_t>(slot) * kQoHeads + head) * kHeadDim + dg * 8);
        dst[0] = make_float4(acc[gq][0] * inv, acc[gq][1] * inv, acc[gq][2] * inv,
                             acc[gq][3] * inv);
        dst[1] = make_float4(acc[gq][4] * inv, acc[gq][5] * inv, acc[gq][6] * inv,
                             acc[gq][7] * inv);
      }
    }
#pragma unroll
    for (int gq = 0; gq < kGroup; ++gq) {
      if (lane != gq) continue;
      const float lse2 = m_all[gq] + log2f(l_all[gq]);  // base 2
      const int head = h * kGroup + gq;
      if (whole) lse[static_cast<size_t>(b) * kQoHeads + head] = kLn2 * lse2;
      else part_lse2[static_cast<size_t>(slot) * kQoHeads + head] = lse2;
    }
    ++b;
  }
}

// Step 5: merge the pieces of every cut sequence: with base-2 LSEs x_s and normalised O_s,
// M = max x_s, w_s = 2^(x_s - M), O = sum w_s O_s / sum w_s, LSE = ln2 (M + log2 sum w_s).
// One warp per (sequence, head): block (b, y) has 8 warps for heads 8y..8y+7, lane = 4 dims.
// The grid is batch x 4 blocks, so a few long sequences cut into ~33 pieces each still spread
// over the SMs: with one block per sequence, the 4 sequences of b4-kv131072 got 4 blocks that
// walked all 32 heads' pieces one after another, and that workload was the only one below 0.9x
// FlashInfer (0.86x, against 0.98-1.20x on the other four). The max over the pieces is
// lane-parallel (lane i reads piece i, i+32, ..) and a warp reduce; the weighted sum reads four
// pieces per iteration, independent loads. Sequences that one CTA finished (and the common
// no-split case) exit at once; empty sequences get O = 0, LSE = -inf.
constexpr int kMergeWarps = 8;

__global__ void __launch_bounds__(32 * kMergeWarps)
    gqa_decode_merge_kernel(const int* __restrict__ kv_indptr, const float* __restrict__ part_o,
                            const float* __restrict__ part_lse2, __nv_bfloat16* __restrict__ o,
                            float* __restrict__ lse, int num_ctas, int num_positions) {
  const int b = blockIdx.x;
  const int head = blockIdx.y * kMergeWarps + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int seq_begin = kv_indptr[b];
  const int seq_end = kv_indptr[b + 1];
  const size_t out_row = static_cast<size_t>(b) * kQoHeads + head;
  if (seq_end <= seq_begin) {
    reinterpret_cast<uint2*>(o + out_row * kHeadDim)[lane] = make_uint2(0u, 0u);
    if (lane == 0) lse[out_row] = -INFINITY;
    return;
  }
  const int c_first = cta_of_position(seq_begin, num_ctas, num_positions);
  const int c_last = cta_of_position(seq_end - 1, num_ctas, num_positions);
  if (c_first == c_last) return;  // written by the split kernel
  float m = -INFINITY;
  for (int c = c_first + lane; c <= c_last; c += 32) {
    const int slot = partial_slot(c, seq_begin, num_ctas, num_positions);
    m = fmaxf(m, part_lse2[static_cast<size_t>(slot) * kQoHeads + head]);
  }
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2)
    m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, offset));
  float sum = 0.0f;
  float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll 4
  for (int c = c_first; c <= c_last; ++c) {
    const int slot = partial_slot(c, seq_begin, num_ctas, num_positions);
    const size_t row = static_cast<size_t>(slot) * kQoHeads + head;
    const float w = exp2f(part_lse2[row] - m);
    const float4 v = reinterpret_cast<const float4*>(part_o + row * kHeadDim)[lane];
    sum += w;
    acc.x = fmaf(w, v.x, acc.x);
    acc.y = fmaf(w, v.y, acc.y);
    acc.z = fmaf(w, v.z, acc.z);
    acc.w = fmaf(w, v.w, acc.w);
  }
  const float inv = 1.0f / sum;  // sum >= 1 (the max piece has weight 1)
  reinterpret_cast<uint2*>(o + out_row * kHeadDim)[lane] =
      make_uint2(pack2(acc.x * inv, acc.y * inv), pack2(acc.z * inv, acc.w * inv));
  if (lane == 0) lse[out_row] = kLn2 * (m + log2f(sum));
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
  // Bulk copies need 16-B aligned global sources (pages are 32 KB apart); q/o rows are read and
  // written as 16-B vectors.
  const uintptr_t align = reinterpret_cast<uintptr_t>(q) | reinterpret_cast<uintptr_t>(k_cache) |
                          reinterpret_cast<uintptr_t>(v_cache) | reinterpret_cast<uintptr_t>(o);
  if (align % 16 != 0) return static_cast<int>(cudaErrorInvalidValue);

  // Host state kept across calls: SM count, the smem opt-in, the partials scratch.
  static int num_sms = 0;
  static bool smem_set = false;
  static float* scratch = nullptr;
  static size_t scratch_floats = 0;
  cudaError_t err;
  if (num_sms == 0) {
    int dev = 0;
    if ((err = cudaGetDevice(&dev)) != cudaSuccess) return static_cast<int>(err);
    if ((err = cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, dev)) !=
        cudaSuccess)
      return static_cast<int>(err);
  }
  if (!smem_set) {
    if ((err = ptx::set_max_dynamic_smem(gqa_decode_split_kernel, static_cast<int>(kSmemBytes))) !=
        cudaSuccess)
      return static_cast<int>(err);
    smem_set = true;
  }
  const int num_ctas = num_kv_indices < num_sms ? num_kv_indices : num_sms;  // G <= N
  // 2 slots per CTA: [2G][32][128] normalised O, then [2G][32] base-2 LSE.
  const size_t need = static_cast<size_t>(2 * (num_ctas > 0 ? num_ctas : 1)) * kQoHeads *
                      (kHeadDim + 1);
  if (need > scratch_floats) {
    if (scratch != nullptr) cudaFree(scratch);  // first call (or a bigger GPU) only
    scratch = nullptr;
    scratch_floats = 0;
    if ((err = cudaMalloc(&scratch, need * sizeof(float))) != cudaSuccess)
      return static_cast<int>(err);
    scratch_floats = need;
  }
  float* part_o = scratch;
  float* part_lse2 = scratch + static_cast<size_t>(2 * (num_ctas > 0 ? num_ctas : 1)) * kQoHeads *
                                   kHeadDim;

  const float q_scale_log2 =
      static_cast<float>(1.4426950408889634 / std::sqrt(static_cast<double>(kHeadDim)));
  if (num_ctas > 0) {
    gqa_decode_split_kernel<<<num_ctas, kThreads, kSmemBytes, stream>>>(
        q, k_cache, v_cache, kv_indptr, kv_indices, kv_last_page_len, o, lse, part_o, part_lse2,
        batch_size, num_kv_indices, q_scale_log2);
    if ((err = cudaGetLastError()) != cudaSuccess) return static_cast<int>(err);
  }
  const dim3 merge_grid(batch_size, kQoHeads / kMergeWarps);
  gqa_decode_merge_kernel<<<merge_grid, 32 * kMergeWarps, 0, stream>>>(
      kv_indptr, part_o, part_lse2, o, lse, num_ctas > 0 ? num_ctas : 1,
      num_kv_indices > 0 ? num_kv_indices : 1);
  (void)num_pages;
  return static_cast<int>(cudaGetLastError());
}
