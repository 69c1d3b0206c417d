// ptxgym knowledge pack: Hopper (sm_90a) PTX wrappers -- packs/h100/wrappers.cuh
//
// One self-contained header. Everything lives in namespace `ptx`. Build the translation unit with
//     nvcc -std=c++17 -gencode arch=compute_90a,code=sm_90a ...
// NOT with -arch=sm_90 / -arch=sm_90a alone: nvcc 13 then also emits compute_90 PTX, where wgmma /
// setmaxnreg do not exist ("'wgmma.fence' not supported on .target 'sm_90'").
//
// Each wrapper's comment keeps the instruction's full PTX ISA syntax (the polymorphic definition);
// the wrapper itself is ONE concrete instance. Conventions used everywhere below:
//   * `smem` addresses passed to asm are 32-bit shared-window addresses (`"r"(smem_u32(p))`).
//   * tensor maps are `const CUtensorMap*` pointing at a `const __grid_constant__ CUtensorMap`
//     kernel parameter (or at __constant__/global memory); passed to asm as a 64-bit generic address.
//   * TMA coordinates are int32 ELEMENT indices, innermost (contiguous) dimension first.
//   * mbarriers are `uint64_t` objects in shared memory, 8-byte aligned.
// Host helpers (section 9) obtain cuTensorMapEncodeTiled through the runtime's driver entry point,
// so the shared library needs no -lcuda.
#pragma once

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>

namespace ptx {

// =================================================================================================
// 0. Lane / warp / address helpers
// =================================================================================================

// cvta.to.shared: generic pointer -> 32-bit address in the .shared::cta window.
//   cvta.to.space.size  p, a;   .space = { .const, .global, .local, .shared{::cta, ::cluster},
//                                          .param{::entry} };  .size = { .u32, .u64 }
__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// mov.u32 d, %laneid;   (special registers: %laneid, %warpid [NOT stable: use threadIdx],
//                        %cluster_ctarank, %cluster_nctarank, %clusterid.{x,y,z}, ...)
__device__ __forceinline__ uint32_t lane_id() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%laneid;" : "=r"(r));
  return r;
}

// Warp index inside the CTA, made warp-uniform with a shuffle so the compiler can keep it in a
// uniform register (role dispatch `if (warp_idx() == 0)` then needs no divergence handling).
__device__ __forceinline__ uint32_t warp_idx() {
  return __shfl_sync(0xffffffffu, threadIdx.x / 32u, 0);
}

// Warpgroup (4 consecutive warps = 128 threads) index inside the CTA, warp-uniform.
__device__ __forceinline__ uint32_t warpgroup_idx() {
  return __shfl_sync(0xffffffffu, threadIdx.x / 128u, 0);
}

// elect.sync d|p, membermask;
//   Elects one leader among the threads of membermask (all must execute it). d = leader's laneid
//   (sink `_` allowed), p = true only in the leader. Cheaper and safer than `lane_id() == 0` for
//   "one thread issues TMA / MMA": the elected lane is always an active one.
__device__ __forceinline__ bool elect_one_sync() {
  uint32_t pred = 0;
  asm volatile(
      "{\n.reg .pred P;\n.reg .b32 R;\n"
      "elect.sync R|P, %1;\n"
      "selp.u32 %0, 1, 0, P;\n}\n"
      : "=r"(pred)
      : "r"(0xffffffffu));
  return pred != 0;
}

// cvt.rn.bf16x2.f32 d, a, b;   // d = { hi: bf16(a), lo: bf16(b) }   NOTE the order: a -> UPPER half
//   cvt.frnd2{.relu}{.satfinite}.f16x2.f32  d, a, b;  cvt.frnd2{.relu}.bf16x2.f32 d, a, b;
//   .frnd2 = { .rn, .rz }
// pack_bf16x2(lo, hi) puts `lo` in bits 0-15 (the lower column / lower k index) and `hi` in 16-31.
__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  uint32_t r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}

// ex2.approx.ftz.f32 d, a;   d = 2^a (MUFU.EX2, ~2 ulp). Softmax: exp(x) = ex2(x * log2(e)).
//   ex2.approx.atype d, a;  ex2.approx.ftz.btype d, a;
//   .atype = { .f16, .f16x2 };  .btype = { .bf16, .bf16x2 };  (and ex2.approx{.ftz}.f32)
__device__ __forceinline__ float ex2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// 128-byte swizzle of a byte offset inside a 1024-byte-aligned tile whose rows are 128 bytes:
// the 16-byte chunk index (bits 4-6) is XORed with the row index mod 8 (bits 7-9). This is the
// pattern TMA (CU_TENSOR_MAP_SWIZZLE_128B) writes/reads and wgmma expects (layout type 1).
// 64B swizzle: chunk bits 4-5 ^= bits 7-8;  32B swizzle: chunk bit 4 ^= bit 7.
__device__ __forceinline__ uint32_t swizzle_128b(uint32_t byte_offset) {
  return byte_offset ^ (((byte_offset >> 7) & 7u) << 4);
}

// =================================================================================================
// 1. Named barriers (sub-CTA synchronisation, e.g. one warpgroup, or ping-pong between warpgroups)
// =================================================================================================
// barrier{.cta}.sync{.aligned}      a{, b};
// barrier{.cta}.arrive{.aligned}    a, b;
// barrier{.cta}.red.popc{.aligned}.u32  d, a{, b}, {!}c;
// barrier{.cta}.red.op{.aligned}.pred   p, a{, b}, {!}c;      .op = { .and, .or }
// bar{.cta}.sync a{, b};  bar{.cta}.arrive a, b;  (bar.* == barrier.*.aligned)
//   a = barrier id 0..15 (0 is what __syncthreads uses), b = thread count, multiple of 32.
__device__ __forceinline__ void named_bar_sync(uint32_t id, uint32_t nthreads) {
  asm volatile("barrier.sync.aligned %0, %1;" ::"r"(id), "r"(nthreads) : "memory");
}
__device__ __forceinline__ void named_bar_arrive(uint32_t id, uint32_t nthreads) {
  asm volatile("barrier.arrive.aligned %0, %1;" ::"r"(id), "r"(nthreads) : "memory");
}

// =================================================================================================
// 2. mbarrier (shared-memory transaction barriers; TMA completion, producer/consumer pipelines)
// =================================================================================================
// mbarrier.init{.shared{::cta}}.b64 [addr], count;        count in [1, 2^20 - 1]
__device__ __forceinline__ void mbar_init(uint64_t* bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_u32(bar)), "r"(count)
               : "memory");
}

// fence.op_restrict.release.cluster;   .op_restrict = { .mbarrier_init }
//   Makes prior mbarrier.init visible to the async proxy (TMA complete_tx) and to other CTAs of the
//   cluster. Issue after the inits, then __syncthreads() (or cluster_sync() for cluster use).
__device__ __forceinline__ void fence_mbarrier_init() {
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}

// mbarrier.arrive{.sem}{.scope}{.shared{::cta}}.b64           state, [addr]{, count};
// mbarrier.arrive{.sem}{.scope}{.shared::cluster}.b64         _, [addr] {,count};
// mbarrier.arrive.expect_tx{.sem}{.scope}{.shared{::cta}}.b64 state, [addr], txCount;
// mbarrier.arrive.expect_tx{.sem}{.scope}{.shared::cluster}.b64   _, [addr], txCount;
// mbarrier.arrive.noComplete{.release}{.cta}{.shared{::cta}}.b64  state, [addr], count;
//   .sem = { .release, .relaxed }  (default .release);  .scope = { .cta, .cluster } (default .cta)
// Returns the opaque state token (only useful for mbarrier.test_wait/try_wait without .parity).
__device__ __forceinline__ uint64_t mbar_arrive(uint64_t* bar) {
  uint64_t state;
  asm volatile("mbarrier.arrive.shared::cta.b64 %0, [%1];"
               : "=l"(state)
               : "r"(smem_u32(bar))
               : "memory");
  return state;
}

// Arrive (count 1) AND raise the expected transaction byte count of the current phase by `bytes`.
// The phase completes when all `count` arrivals happened AND `bytes` bytes of complete_tx landed.
__device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(bar)),
               "r"(bytes)
               : "memory");
}

// mbarrier.expect_tx{.sem}{.scope}{.space}.b64 [addr], txCount;
//   .sem = { .relaxed };  .scope = { .cta, .cluster };  .space = { .shared{::cta}, .shared::cluster }
// Raise expected tx bytes WITHOUT arriving (e.g. several TMA issuers, one arrival).
__device__ __forceinline__ void mbar_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.expect_tx.relaxed.cta.shared::cta.b64 [%0], %1;" ::"r"(smem_u32(bar)),
               "r"(bytes)
               : "memory");
}

// Arrive on an mbarrier that lives in ANOTHER CTA of the cluster (e.g. consumer of CTA r releasing
// a multicast stage that CTA 0's producer refills). `cta_rank` = %cluster_ctarank of the target.
//   mapa.shared::cluster.u32 d, a, b;   then
//   mbarrier.arrive.release.cluster.shared::cluster.b64 _, [remote];
__device__ __forceinline__ void mbar_arrive_cluster(uint64_t* bar, uint32_t cta_rank) {
  asm volatile(
      "{\n.reg .b32 remAddr32;\n"
      "mapa.shared::cluster.u32 remAddr32, %0, %1;\n"
      "mbarrier.arrive.release.cluster.shared::cluster.b64 _, [remAddr32];\n}\n" ::"r"(
          smem_u32(bar)),
      "r"(cta_rank)
      : "memory");
}

// The same remote arrive with the default .release.cta semantics: for releasing a stage whose only
// reads were wgmma's (async proxy, retired by wgmma_wait), not generic stores the peer will read.
// nvcc 13.0 puts MEMBAR.ALL.CTA + MEMBAR.ALL.GPU + ERRBAR + CGAERRBAR before a .release.cluster
// arrive and nothing before this one: after an epilogue's stores, that MEMBAR.GPU waits for them.
//   mbarrier.arrive.shared::cluster.b64 _, [remote];
__device__ __forceinline__ void mbar_arrive_cluster_cta(uint64_t* bar, uint32_t cta_rank) {
  asm volatile(
      "{\n.reg .b32 remAddr32;\n"
      "mapa.shared::cluster.u32 remAddr32, %0, %1;\n"
      "mbarrier.arrive.shared::cluster.b64 _, [remAddr32];\n}\n" ::"r"(smem_u32(bar)),
      "r"(cta_rank)
      : "memory");
}

// mbarrier.test_wait{.sem}{.scope}{.shared{::cta}}.b64        waitComplete, [addr], state;
// mbarrier.test_wait.parity{.sem}{.scope}{.shared{::cta}}.b64 waitComplete, [addr], phaseParity;
// mbarrier.try_wait{.sem}{.scope}{.shared{::cta}}.b64         waitComplete, [addr], state
//                                                                           {, suspendTimeHint};
// mbarrier.try_wait.parity{.sem}{.scope}{.shared{::cta}}.b64  waitComplete, [addr], phaseParity
//                                                                           {, suspendTimeHint};
//   .sem = { .acquire, .relaxed } (default .acquire);  .scope = { .cta, .cluster } (default .cta)
// try_wait.parity(P) returns true once the phase whose parity is P has COMPLETED, i.e. as soon as
// the barrier's current phase parity != P. A freshly initialised barrier is in phase 0, so
// wait(parity=1) returns immediately and wait(parity=0) blocks until the first phase completes.
// try_wait suspends the thread for a bounded time inside the instruction; loop until true.
__device__ __forceinline__ bool mbar_try_wait(uint64_t* bar, uint32_t parity) {
  uint32_t ok;
  asm volatile(
      "{\n.reg .pred P1;\n"
      "mbarrier.try_wait.parity.shared::cta.b64 P1, [%1], %2;\n"
      "selp.u32 %0, 1, 0, P1;\n}\n"
      : "=r"(ok)
      : "r"(smem_u32(bar)), "r"(parity)
      : "memory");
  return ok != 0;
}

// Blocking wait for the phase with parity `parity` (acquire.cta: smem written by TMA / by threads
// that arrived with release semantics is visible after this returns).
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
  while (!mbar_try_wait(bar, parity)) {
  }
}

// Cluster-scope acquire variant: use when the arrivals came from other CTAs of the cluster
// (remote mbar_arrive_cluster, multicast TMA issued by a peer).
__device__ __forceinline__ void mbar_wait_cluster(uint64_t* bar, uint32_t parity) {
  uint32_t ok = 0;
  while (!ok) {
    asm volatile(
        "{\n.reg .pred P1;\n"
        "mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 P1, [%1], %2;\n"
        "selp.u32 %0, 1, 0, P1;\n}\n"
        : "=r"(ok)
        : "r"(smem_u32(bar)), "r"(parity)
        : "memory");
  }
}

// mbarrier.inval{.shared{::cta}}.b64 [addr];   required before reusing the 8 bytes for anything else.
__device__ __forceinline__ void mbar_inval(uint64_t* bar) {
  asm volatile("mbarrier.inval.shared::cta.b64 [%0];" ::"r"(smem_u32(bar)) : "memory");
}

// =================================================================================================
// 3. Memory-consistency fences (proxies)
// =================================================================================================
// fence{.sem}.scope;                          .sem = { .sc, .acq_rel, .acquire, .release }
// fence.acquire.sync_restrict::shared::cluster.cluster;
// fence.release.sync_restrict::shared::cta.cluster;
// fence.op_restrict.release.cluster;          .op_restrict = { .mbarrier_init }
// fence.proxy.proxykind;                      (bi-directional proxy fence)
// fence.proxy.to_proxykind::from_proxykind.release.scope;
// fence.proxy.to_proxykind::from_proxykind.acquire.scope  [addr], size;
// fence.proxy.async::generic.acquire.sync_restrict::shared::cluster.cluster;
// fence.proxy.async::generic.release.sync_restrict::shared::cta.cluster;
// membar.level;  membar.proxy.proxykind;
//   .scope = { .cta, .cluster, .gpu, .sys };  .level = { .cta, .gl, .sys }
//   .proxykind = { .alias, .async, .async.global, .async.shared::{cta, cluster} }
//   .to_proxykind::from_proxykind = { .tensormap::generic }
//
// Generic-proxy writes to shared memory (st.shared, stmatrix, plain C++ stores) must be followed by
// this fence before an ASYNC-proxy operation reads that memory (TMA store, wgmma smem operands),
// and all writing threads must then synchronise with the issuing thread (named barrier /
// __syncthreads) -- fence first, barrier second.
__device__ __forceinline__ void fence_proxy_async_smem() {
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}
// Same for global memory written with generic stores and then read by TMA loads in the same kernel.
__device__ __forceinline__ void fence_proxy_async_global() {
  asm volatile("fence.proxy.async.global;" ::: "memory");
}
// Full fence of the async proxy (all state spaces).
__device__ __forceinline__ void fence_proxy_async() {
  asm volatile("fence.proxy.async;" ::: "memory");
}
// Acquire/release at cluster scope, e.g. before reading DSMEM written by a peer after a barrier.
__device__ __forceinline__ void fence_acq_rel_cluster() {
  asm volatile("fence.acq_rel.cluster;" ::: "memory");
}

// =================================================================================================
// 4. TMA (cp.async.bulk.tensor) -- device side
// =================================================================================================
// prefetch{.space}.level                    [a];   // .space = { .global, .local }, .level = {.L1,.L2}
// prefetch.global.level::eviction_priority  [a];   // { .L2::evict_last, .L2::evict_normal }
// prefetchu.L1  [a];
// prefetch{.tensormap_space}.tensormap [a];        // .tensormap_space = { .const, .param }
// Prefetch the 128-byte tensor-map descriptor (one thread, once, at kernel start).
__device__ __forceinline__ void prefetch_tmap(const CUtensorMap* tmap) {
  asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<uint64_t>(tmap)) : "memory");
}

// Global -> shared loads:
// cp.async.bulk.tensor.dim.dst.src{.load_mode}.completion_mechanism{.cta_group}
//                      {.level::cache_hint}
//        [dstMem], [tensorMap, tensorCoords], [mbar]{, im2colInfo} {, cache-policy};
//   .dst = { .shared::cta }   (PTX 8.6+)
// cp.async.bulk.tensor.dim.dst.src{.load_mode}.completion_mechanism{.multicast}{.cta_group}
//                      {.level::cache_hint}
//        [dstMem], [tensorMap, tensorCoords], [mbar]{, im2colInfo} {, ctaMask} {, cache-policy};
//   .dst = { .shared::cluster }
//   .src = { .global };  .dim = { .1d, .2d, .3d, .4d, .5d }
//   .completion_mechanism = { .mbarrier::complete_tx::bytes }
//   .cta_group = { .cta_group::1, .cta_group::2 }   (sm_100a+ only)
//   .load_mode = { .tile, .tile::gather4, .im2col, .im2col::w, .im2col::w::128 } (default .tile)
//   .level::cache_hint = { .L2::cache_hint };  .multicast = { .multicast::cluster }
// tensorCoords = {c0, c1, ...} int32 element coordinates of the box's first element, innermost
// first; out-of-bounds parts of the box are zero-filled (still counted in the tx bytes!).
// One thread issues; the mbarrier's tx count must be raised by the FULL box bytes.
__device__ __forceinline__ void tma_load_2d(void* smem_dst, const CUtensorMap* tmap, uint64_t* bar,
                                            int32_t c0, int32_t c1) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%3, %4}], [%2];" ::"r"(smem_u32(smem_dst)),
      "l"(reinterpret_cast<uint64_t>(tmap)), "r"(smem_u32(bar)), "r"(c0), "r"(c1)
      : "memory");
}

__device__ __forceinline__ void tma_load_3d(void* smem_dst, const CUtensorMap* tmap, uint64_t* bar,
                                            int32_t c0, int32_t c1, int32_t c2) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%3, %4, %5}], [%2];" ::"r"(smem_u32(smem_dst)),
      "l"(reinterpret_cast<uint64_t>(tmap)), "r"(smem_u32(bar)), "r"(c0), "r"(c1), "r"(c2)
      : "memory");
}

// Multicast: the same box lands at the same smem offset in every CTA whose bit is set in cta_mask
// (bit i = %cluster_ctarank i), and complete_tx is signalled on the mbarrier at the same offset in
// each destination CTA. Every destination CTA must expect_tx the box bytes on its own barrier.
__device__ __forceinline__ void tma_load_2d_multicast(void* smem_dst, const CUtensorMap* tmap,
                                                      uint64_t* bar, int32_t c0, int32_t c1,
                                                      uint16_t cta_mask) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      ".multicast::cluster [%0], [%1, {%3, %4}], [%2], %5;" ::"r"(smem_u32(smem_dst)),
      "l"(reinterpret_cast<uint64_t>(tmap)), "r"(smem_u32(bar)), "r"(c0), "r"(c1), "h"(cta_mask)
      : "memory");
}

// createpolicy.fractional.L2::evict_last{.b64} policy{, fraction};  (and .L2::evict_first, ...)
// Load with an L2 eviction-priority hint (e.g. keep K/V or a re-read B panel resident in L2).
__device__ __forceinline__ void tma_load_2d_evict_last(void* smem_dst, const CUtensorMap* tmap,
                                                       uint64_t* bar, int32_t c0, int32_t c1) {
  asm volatile(
      "{\n.reg .b64 pol;\n"
      "createpolicy.fractional.L2::evict_last.b64 pol, 1.0;\n"
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      ".L2::cache_hint [%0], [%1, {%3, %4}], [%2], pol;\n}\n" ::"r"(smem_u32(smem_dst)),
      "l"(reinterpret_cast<uint64_t>(tmap)), "r"(smem_u32(bar)), "r"(c0), "r"(c1)
      : "memory");
}

// Shared -> global stores:
// cp.async.bulk.tensor.dim.dst.src{.load_mode}.completion_mechanism{.level::cache_hint}
//        [tensorMap, tensorCoords], [srcMem] {, cache-policy};
//   .dst = { .global };  .src = { .shared::cta };  .dim = { .1d, .2d, .3d, .4d, .5d }
//   .completion_mechanism = { .bulk_group }
//   .load_mode = { .tile, .tile::scatter4, .im2col_no_offs }
// Elements of the box that fall outside the tensor are NOT written (free edge clipping).
// Before issuing: smem was written by generic stores -> fence_proxy_async_smem() in every writing
// thread, then a barrier, then ONE thread issues the store + bulk_commit_group().
__device__ __forceinline__ void tma_store_2d(const CUtensorMap* tmap, const void* smem_src,
                                             int32_t c0, int32_t c1) {
  asm volatile(
      "cp.async.bulk.tensor.2d.global.shared::cta.tile.bulk_group [%0, {%2, %3}], [%1];" ::"l"(
          reinterpret_cast<uint64_t>(tmap)),
      "r"(smem_u32(smem_src)), "r"(c0), "r"(c1)
      : "memory");
}

__device__ __forceinline__ void tma_store_3d(const CUtensorMap* tmap, const void* smem_src,
                                             int32_t c0, int32_t c1, int32_t c2) {
  asm volatile(
      "cp.async.bulk.tensor.3d.global.shared::cta.tile.bulk_group [%0, {%2, %3, %4}], [%1];" ::"l"(
          reinterpret_cast<uint64_t>(tmap)),
      "r"(smem_u32(smem_src)), "r"(c0), "r"(c1), "r"(c2)
      : "memory");
}

// cp.reduce.async.bulk.tensor.dim.dst.src.redOp{.load_mode}.completion_mechanism
//                      {.level::cache_hint}  [tensorMap, tensorCoords], [srcMem] {, cache-policy};
//   .dst = { .global };  .src = { .shared::cta };  .completion_mechanism = { .bulk_group }
//   .redOp = { .add, .min, .max, .inc, .dec, .and, .or, .xor };  .load_mode = { .tile, .im2col_no_offs }
// Element-wise global += smem box (fp32 add is supported): handy for split-K or dQ accumulation.
__device__ __forceinline__ void tma_reduce_add_2d(const CUtensorMap* tmap, const void* smem_src,
                                                  int32_t c0, int32_t c1) {
  asm volatile(
      "cp.reduce.async.bulk.tensor.2d.global.shared::cta.add.tile.bulk_group"
      " [%0, {%2, %3}], [%1];" ::"l"(reinterpret_cast<uint64_t>(tmap)),
      "r"(smem_u32(smem_src)), "r"(c0), "r"(c1)
      : "memory");
}

// cp.async.bulk.commit_group;
//   Closes the current bulk async-group (all prior bulk_group TMA stores of this thread).
__device__ __forceinline__ void bulk_commit_group() {
  asm volatile("cp.async.bulk.commit_group;" ::: "memory");
}

// cp.async.bulk.wait_group{.read} N;
//   Wait until at most N of this thread's committed bulk groups are pending. `.read`: only until the
//   SOURCE (smem) has been read -- enough to reuse the staging buffer; without .read: until the
//   writes are complete (visible). Before the CTA exits, at least wait_group.read 0 is required
//   (the smem must outlive the store).
template <int N>
__device__ __forceinline__ void bulk_wait_group() {
  asm volatile("cp.async.bulk.wait_group %0;" ::"n"(N) : "memory");
}
template <int N>
__device__ __forceinline__ void bulk_wait_group_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;" ::"n"(N) : "memory");
}

// Non-tensor bulk copy (contiguous bytes, no tensor map), e.g. an LSE row or a small vector:
// cp.async.bulk.dst.src.completion_mechanism{.multicast}{.level::cache_hint}
//        [dstMem], [srcMem], size, [mbar] {, ctaMask} {, cache-policy};
//   .dst = { .shared::cluster } (.shared::cta from PTX 8.6);  .src = { .global }
//   .completion_mechanism = { .mbarrier::complete_tx::bytes }
// cp.async.bulk.global.shared::cta.bulk_group{.level::cache_hint} [dstMem], [srcMem], size;
// size and both addresses must be multiples of 16 bytes.
__device__ __forceinline__ void bulk_copy_g2s(void* smem_dst, const void* gmem_src, uint32_t bytes,
                                              uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
          smem_u32(smem_dst)),
      "l"(gmem_src), "r"(bytes), "r"(smem_u32(bar))
      : "memory");
}
__device__ __forceinline__ void bulk_copy_s2g(void* gmem_dst, const void* smem_src,
                                              uint32_t bytes) {
  asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;" ::"l"(gmem_dst),
               "r"(smem_u32(smem_src)), "r"(bytes)
               : "memory");
}

// =================================================================================================
// 5. wgmma: warpgroup-level asynchronous MMA (128 threads = 4 consecutive warps, warp 0 of the
//    group must have warp index % 4 == 0)
// =================================================================================================
// wgmma.fence.sync.aligned;
//   Orders all prior register accesses (accumulators d, register-A fragments) of the warpgroup
//   before the next wgmma.mma_async reads them. Required before the FIRST wgmma of a batch, and
//   whenever the accumulator / A registers were written by ordinary instructions since the last
//   wgmma (e.g. after rescaling O in attention, after zeroing, after converting P to bf16).
__device__ __forceinline__ void wgmma_fence() {
  asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
}

// wgmma.commit_group.sync.aligned;
//   Packs all uncommitted wgmma.mma_async of this warpgroup into one wgmma-group.
__device__ __forceinline__ void wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
}

// wgmma.wait_group.sync.aligned N;
//   Waits until at most N wgmma-groups are pending. Only after the group that wrote an accumulator
//   has completed may the registers be read or written, and only then is its smem no longer read.
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  static_assert(N >= 0 && N <= 7, "wgmma.wait_group N must be in [0, 7]");
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}

// Compiler-only fence on accumulator registers: stops nvcc from moving reads/writes of `d` across
// the wgmma fence/commit/wait calls (it does not know the asm's async semantics). Call it on the
// accumulator array right before wgmma_fence() and right after wgmma_wait<>().
template <int R>
__device__ __forceinline__ void fence_regs(float (&d)[R]) {
#pragma unroll
  for (int i = 0; i < R; ++i) asm volatile("" : "+f"(d[i])::"memory");
}
template <int R>
__device__ __forceinline__ void fence_regs(uint32_t (&d)[R]) {
#pragma unroll
  for (int i = 0; i < R; ++i) asm volatile("" : "+r"(d[i])::"memory");
}

// ---- shared-memory matrix descriptor (64 bit) ----
//   bits  0-13 : matrix start address        >> 4   (smem byte address, 16-B units)
//   bits 16-29 : leading-dimension byte offset (LBO) >> 4
//   bits 32-45 : stride-dimension byte offset  (SBO) >> 4
//   bits 49-51 : matrix base offset (0 when every swizzle atom starts on a swizzle-repeat boundary:
//                1024 B for 128B swizzle, 512 B for 64B, 256 B for 32B)
//   bits 62-63 : layout / swizzle type: 0 = interleave (no swizzle), 1 = 128B, 2 = 64B, 3 = 32B
//   (all other bits 0)
// K-major (A row-major M x K, B "column-major" = stored N x K, imm-trans = 0), bf16, 128B swizzle:
//   rows of 64 bf16 = 128 B; 8 rows = one 1024-B swizzle atom; SBO = 1024 (atom to atom along M/N);
//   LBO unused (write 16 -> field value 1); one wgmma consumes K = 16 = 32 B of each row, the next
//   K-step inside the same 64-wide atom is desc + (32 >> 4) = desc + 2 (see desc_advance).
// MN-major (imm-trans = 1), bf16, 128B swizzle, tile stored as [K rows][64 MN-elements] boxes:
//   SBO = stride between 8-row groups along K (1024 for a dense box), LBO = stride between the
//   64-element MN blocks (= bytes of one [K_box][64] box, e.g. 64 rows * 128 B = 8192).
enum SmemLayout : uint32_t {
  kInterleave = 0,
  kSwizzle128B = 1,
  kSwizzle64B = 2,
  kSwizzle32B = 3
};

__device__ __forceinline__ uint64_t make_smem_desc(const void* smem_ptr, uint32_t layout,
                                                   uint32_t lbo_bytes, uint32_t sbo_bytes) {
  const uint32_t addr = smem_u32(smem_ptr);
  uint64_t desc = 0;
  desc |= static_cast<uint64_t>((addr & 0x3FFFFu) >> 4);
  desc |= static_cast<uint64_t>((lbo_bytes & 0x3FFFFu) >> 4) << 16;
  desc |= static_cast<uint64_t>((sbo_bytes & 0x3FFFFu) >> 4) << 32;
  desc |= static_cast<uint64_t>(layout & 0x3u) << 62;
  return desc;
}

// K-major bf16 operand tile [rows][64] written by TMA with CU_TENSOR_MAP_SWIZZLE_128B,
// base 1024-byte aligned. Valid for the whole tile: wgmma reads 64 (A) or N (B) rows from it.
__device__ __forceinline__ uint64_t make_desc_kmajor_sw128(const void* smem_tile) {
  return make_smem_desc(smem_tile, kSwizzle128B, 16, 1024);
}

// MN-major bf16 operand (imm-trans = 1) stored as consecutive [k_rows][64] boxes with 128B
// swizzle (box i holds MN elements 64*i .. 64*i+63). lbo = bytes of one box = k_rows * 128.
__device__ __forceinline__ uint64_t make_desc_mnmajor_sw128(const void* smem_tile,
                                                            uint32_t box_bytes) {
  return make_smem_desc(smem_tile, kSwizzle128B, box_bytes, 1024);
}

// Advance the start-address field by `bytes` (multiple of 16). K-major 128B swizzle: K step of 16
// bf16 inside a 64-wide atom = +32 B. MN-major: K step of 16 rows = +16 * 128 B = +2048 B.
__device__ __forceinline__ uint64_t desc_advance(uint64_t desc, uint32_t bytes) {
  return desc + static_cast<uint64_t>(bytes >> 4);
}

// Coordinates of accumulator register i (0 <= i < N/2) held by thread `t` (0..127 inside the
// warpgroup) for an m64nNk16 f32 accumulator:
//   row = 16 * (t / 32) + (t % 32) / 4 + 8 * ((i / 2) % 2)
//   col = 8 * (i / 4) + 2 * (t % 4) + (i % 2)
// i.e. d[4j+0], d[4j+1] = (r, 8j + 2q), (r, 8j + 2q + 1) and d[4j+2], d[4j+3] = same cols, row r+8,
// with r = 16 * warp + lane / 4, q = lane % 4.
__device__ __forceinline__ void wgmma_acc_coord(uint32_t t, uint32_t i, uint32_t& row,
                                                uint32_t& col) {
  row = 16u * (t / 32u) + (t % 32u) / 4u + 8u * ((i / 2u) % 2u);
  col = 8u * (i / 4u) + 2u * (t % 4u) + (i % 2u);
}

// ---- wgmma.mma_async (bf16 inputs, f32 accumulators) ----
// Full PTX ISA definition (all wgmma.mma_async forms):
// // Half precision floating point type:
// wgmma.mma_async.sync.aligned.shape.dtype.f16.f16  d, a-desc, b-desc, scale-d, imm-scale-a,
//                                                   imm-scale-b, imm-trans-a, imm-trans-b;
// wgmma.mma_async.sync.aligned.shape.dtype.f16.f16  d, a, b-desc, scale-d, imm-scale-a,
//                                                   imm-scale-b, imm-trans-b;
//   .shape = { .m64n8k16, .m64n16k16, .m64n24k16, ... every multiple of 8 ..., .m64n256k16 }
//   .dtype = { .f16, .f32 }
// // Alternate floating point type (.bf16):
// wgmma.mma_async.sync.aligned.shape.dtype.bf16.bf16  d, a-desc, b-desc, scale-d, imm-scale-a,
//                                                     imm-scale-b, imm-trans-a, imm-trans-b;
// wgmma.mma_async.sync.aligned.shape.dtype.bf16.bf16  d, a, b-desc, scale-d, imm-scale-a,
//                                                     imm-scale-b, imm-trans-b;
//   .shape = { .m64n8k16 ... .m64n256k16 (N multiple of 8) };  .dtype = { .f32 }
// // .tf32:
// wgmma.mma_async.sync.aligned.shape.dtype.tf32.tf32  d, a-desc, b-desc, scale-d, imm-scale-a,
//                                                     imm-scale-b;
// wgmma.mma_async.sync.aligned.shape.dtype.tf32.tf32  d, a, b-desc, scale-d, imm-scale-a,
//                                                     imm-scale-b;
//   .shape = { .m64n8k8 ... .m64n256k8 };  .dtype = { .f32 }
// // FP8:
// wgmma.mma_async.sync.aligned.shape.dtype.atype.btype  d, a-desc, b-desc, scale-d, imm-scale-a,
//                                                       imm-scale-b;
// wgmma.mma_async.sync.aligned.shape.dtype.atype.btype  d, a, b-desc, scale-d, imm-scale-a,
//                                                       imm-scale-b;
//   .shape = { .m64n8k32 ... .m64n256k32 };  .atype = .btype = { .e4m3, .e5m2 };
//   .dtype = { .f16, .f32 }
// // Integer:
// wgmma.mma_async.sync.aligned.shape{.satfinite}.s32.atype.btype  d, a-desc, b-desc, scale-d;
// wgmma.mma_async.sync.aligned.shape{.satfinite}.s32.atype.btype  d, a, b-desc, scale-d;
//   .shape = { .m64n8k32, .m64n16k32, .m64n24k32, .m64n32k32, .m64n48k32, ... .m64n224k32 }
//   .atype = .btype = { .s8, .u8 }
// // Single bit:
// wgmma.mma_async.sync.aligned.shape.s32.b1.b1.op.popc  d, a-desc, b-desc, scale-d;
// wgmma.mma_async.sync.aligned.shape.s32.b1.b1.op.popc  d, a, b-desc, scale-d;
//   .shape = { .m64n8k256 ... .m64n256k256 };  .op = { .and }
// Operands:
//   d        : N/2 f32 registers per thread (m64nN f32), layout: wgmma_acc_coord above.
//   a-desc   : 64-bit smem descriptor of A (64 x 16);  a: 4 x .b32 registers holding 8 bf16 (RS).
//   b-desc   : 64-bit smem descriptor of B (16 x N, stored N x K when imm-trans-b = 0).
//   scale-d  : predicate; false -> D = A*B (ignore old d), true -> D = A*B + D.
//   imm-scale-a/b : immediate 1 or -1 (negate).  imm-trans-a/b : immediate 0 (K-major) or 1
//                   (MN-major); transpose only for .f16/.bf16 operands read from smem.
// Register-A (RS) fragment for bf16 (thread t of the warpgroup, r = 16*(t/32) + (t%32)/4,
// q = t % 4; each register packs two consecutive k: low half = even k):
//   a[0] = A[r][2q, 2q+1]      a[1] = A[r+8][2q, 2q+1]
//   a[2] = A[r][2q+8, 2q+9]    a[3] = A[r+8][2q+8, 2q+9]
// This equals the f32 accumulator layout of an m64n16 tile: a[0]=pack(d[0],d[1]),
// a[1]=pack(d[2],d[3]), a[2]=pack(d[4],d[5]), a[3]=pack(d[6],d[7]) -> P = softmax(S) can feed
// O += P V straight from registers (k-step j uses S accumulator registers d[8j .. 8j+7]).
//
// Usage (one k-tile of 64, K-major A and B with 128B swizzle, smem tiles sA[64][64], sB[N][64]):
//   wgmma_fence();
//   for (int k = 0; k < 4; ++k)
//     wgmma_m64n256k16_ss(acc, desc_advance(da, 32 * k), desc_advance(db, 32 * k), 1);
//   wgmma_commit();  ...  wgmma_wait<0>();

// Eight "+f" accumulator operands d[i..i+7]; keeps the long operand lists below short.
#define PTX_ACC8(d, i)                                                                       \
  "+f"(d[(i) + 0]), "+f"(d[(i) + 1]), "+f"(d[(i) + 2]), "+f"(d[(i) + 3]), "+f"(d[(i) + 4]), \
      "+f"(d[(i) + 5]), "+f"(d[(i) + 6]), "+f"(d[(i) + 7])

template <int TransA = 0, int TransB = 0>
__device__ __forceinline__ void wgmma_m64n64k16_ss(float (&d)[32], uint64_t desc_a,
                                                   uint64_t desc_b, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
      "}, %32, %33, p, 1, 1, %35, %36;\n}\n"
      : PTX_ACC8(d, 0), PTX_ACC8(d, 8), PTX_ACC8(d, 16), PTX_ACC8(d, 24)
      : "l"(desc_a), "l"(desc_b), "r"(scale_d), "n"(TransA), "n"(TransB)
      : "memory");
}

template <int TransA = 0, int TransB = 0>
__device__ __forceinline__ void wgmma_m64n96k16_ss(float (&d)[48], uint64_t desc_a,
                                                   uint64_t desc_b, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %50, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n96k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47"
      "}, %48, %49, p, 1, 1, %51, %52;\n}\n"
      : PTX_ACC8(d, 0), PTX_ACC8(d, 8), PTX_ACC8(d, 16), PTX_ACC8(d, 24),
        PTX_ACC8(d, 32), PTX_ACC8(d, 40)
      : "l"(desc_a), "l"(desc_b), "r"(scale_d), "n"(TransA), "n"(TransB)
      : "memory");
}

template <int TransA = 0, int TransB = 0>
__device__ __forceinline__ void wgmma_m64n128k16_ss(float (&d)[64], uint64_t desc_a,
                                                    uint64_t desc_b, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
      "}, %64, %65, p, 1, 1, %67, %68;\n}\n"
      : PTX_ACC8(d, 0), PTX_ACC8(d, 8), PTX_ACC8(d, 16), PTX_ACC8(d, 24),
        PTX_ACC8(d, 32), PTX_ACC8(d, 40), PTX_ACC8(d, 48), PTX_ACC8(d, 56)
      : "l"(desc_a), "l"(desc_b), "r"(scale_d), "n"(TransA), "n"(TransB)
      : "memory");
}

template <int TransA = 0, int TransB = 0>
__device__ __forceinline__ void wgmma_m64n192k16_ss(float (&d)[96], uint64_t desc_a,
                                                    uint64_t desc_b, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %98, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n192k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "
      "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "
      "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95"
      "}, %96, %97, p, 1, 1, %99, %100;\n}\n"
      : PTX_ACC8(d, 0), PTX_ACC8(d, 8), PTX_ACC8(d, 16), PTX_ACC8(d, 24),
        PTX_ACC8(d, 32), PTX_ACC8(d, 40), PTX_ACC8(d, 48), PTX_ACC8(d, 56),
        PTX_ACC8(d, 64), PTX_ACC8(d, 72), PTX_ACC8(d, 80), PTX_ACC8(d, 88)
      : "l"(desc_a), "l"(desc_b), "r"(scale_d), "n"(TransA), "n"(TransB)
      : "memory");
}

template <int TransA = 0, int TransB = 0>
__device__ __forceinline__ void wgmma_m64n256k16_ss(float (&d)[128], uint64_t desc_a,
                                                    uint64_t desc_b, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "
      "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "
      "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, "
      "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, "
      "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
      "}, %128, %129, p, 1, 1, %131, %132;\n}\n"
      : PTX_ACC8(d, 0), PTX_ACC8(d, 8), PTX_ACC8(d, 16), PTX_ACC8(d, 24),
        PTX_ACC8(d, 32), PTX_ACC8(d, 40), PTX_ACC8(d, 48), PTX_ACC8(d, 56),
        PTX_ACC8(d, 64), PTX_ACC8(d, 72), PTX_ACC8(d, 80), PTX_ACC8(d, 88),
        PTX_ACC8(d, 96), PTX_ACC8(d, 104), PTX_ACC8(d, 112), PTX_ACC8(d, 120)
      : "l"(desc_a), "l"(desc_b), "r"(scale_d), "n"(TransA), "n"(TransB)
      : "memory");
}

template <int TransB = 0>
__device__ __forceinline__ void wgmma_m64n64k16_rs(float (&d)[32], const uint32_t (&a)[4],
                                                   uint64_t desc_b, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
      "}, {%32, %33, %34, %35}, %36, p, 1, 1, %38;\n}\n"
      : PTX_ACC8(d, 0), PTX_ACC8(d, 8), PTX_ACC8(d, 16), PTX_ACC8(d, 24)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d), "n"(TransB)
      : "memory");
}

template <int TransB = 0>
__device__ __forceinline__ void wgmma_m64n96k16_rs(float (&d)[48], const uint32_t (&a)[4],
                                                   uint64_t desc_b, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %53, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n96k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47"
      "}, {%48, %49, %50, %51}, %52, p, 1, 1, %54;\n}\n"
      : PTX_ACC8(d, 0), PTX_ACC8(d, 8), PTX_ACC8(d, 16), PTX_ACC8(d, 24),
        PTX_ACC8(d, 32), PTX_ACC8(d, 40)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d), "n"(TransB)
      : "memory");
}

template <int TransB = 0>
__device__ __forceinline__ void wgmma_m64n128k16_rs(float (&d)[64], const uint32_t (&a)[4],
                                                    uint64_t desc_b, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
      "}, {%64, %65, %66, %67}, %68, p, 1, 1, %70;\n}\n"
      : PTX_ACC8(d, 0), PTX_ACC8(d, 8), PTX_ACC8(d, 16), PTX_ACC8(d, 24),
        PTX_ACC8(d, 32), PTX_ACC8(d, 40), PTX_ACC8(d, 48), PTX_ACC8(d, 56)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d), "n"(TransB)
      : "memory");
}

template <int TransB = 0>
__device__ __forceinline__ void wgmma_m64n256k16_rs(float (&d)[128], const uint32_t (&a)[4],
                                                    uint64_t desc_b, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %133, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "
      "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "
      "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, "
      "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, "
      "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
      "}, {%128, %129, %130, %131}, %132, p, 1, 1, %134;\n}\n"
      : PTX_ACC8(d, 0), PTX_ACC8(d, 8), PTX_ACC8(d, 16), PTX_ACC8(d, 24),
        PTX_ACC8(d, 32), PTX_ACC8(d, 40), PTX_ACC8(d, 48), PTX_ACC8(d, 56),
        PTX_ACC8(d, 64), PTX_ACC8(d, 72), PTX_ACC8(d, 80), PTX_ACC8(d, 88),
        PTX_ACC8(d, 96), PTX_ACC8(d, 104), PTX_ACC8(d, 112), PTX_ACC8(d, 120)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d), "n"(TransB)
      : "memory");
}

// Dispatchers: wgmma_ss<N, TransA, TransB>(acc, da, db, scale_d) / wgmma_rs<N, TransB>(...).
template <int N, int TransA = 0, int TransB = 0>
__device__ __forceinline__ void wgmma_ss(float (&d)[N / 2], uint64_t desc_a, uint64_t desc_b,
                                         int scale_d) {
  if constexpr (N == 64) {
    wgmma_m64n64k16_ss<TransA, TransB>(d, desc_a, desc_b, scale_d);
  } else if constexpr (N == 96) {
    wgmma_m64n96k16_ss<TransA, TransB>(d, desc_a, desc_b, scale_d);
  } else if constexpr (N == 128) {
    wgmma_m64n128k16_ss<TransA, TransB>(d, desc_a, desc_b, scale_d);
  } else if constexpr (N == 192) {
    wgmma_m64n192k16_ss<TransA, TransB>(d, desc_a, desc_b, scale_d);
  } else {
    static_assert(N == 256, "wgmma_ss: provided N are 64, 96, 128, 192, 256");
    wgmma_m64n256k16_ss<TransA, TransB>(d, desc_a, desc_b, scale_d);
  }
}

template <int N, int TransB = 0>
__device__ __forceinline__ void wgmma_rs(float (&d)[N / 2], const uint32_t (&a)[4],
                                         uint64_t desc_b, int scale_d) {
  if constexpr (N == 64) {
    wgmma_m64n64k16_rs<TransB>(d, a, desc_b, scale_d);
  } else if constexpr (N == 96) {
    wgmma_m64n96k16_rs<TransB>(d, a, desc_b, scale_d);
  } else if constexpr (N == 128) {
    wgmma_m64n128k16_rs<TransB>(d, a, desc_b, scale_d);
  } else {
    static_assert(N == 256, "wgmma_rs: provided N are 64, 96, 128, 256");
    wgmma_m64n256k16_rs<TransB>(d, a, desc_b, scale_d);
  }
}

// =================================================================================================
// 6. Register reallocation between warpgroups
// =================================================================================================
// setmaxnreg.action.sync.aligned.u32 imm-reg-count;     .action = { .inc, .dec }
//   imm-reg-count: immediate, multiple of 8, in [24, 256]. Executed by ALL threads of a warpgroup
//   (warp-uniform, warpgroup-uniform branch). .dec releases registers to the per-CTA pool, .inc
//   blocks until the pool can supply them. The kernel MUST declare __launch_bounds__(THREADS, 1)
//   (or use -maxrregcount) or ptxas ignores it ("C7508 'setmaxnreg' ignored; unable to determine
//   register count at entry"). Budget: sum over warps of new counts <= THREADS * regs-at-launch,
//   e.g. 384 threads -> 168 at launch; producer 24/40 + two consumers 240/232.
template <uint32_t RegCount>
__device__ __forceinline__ void setmaxnreg_inc() {
  static_assert(RegCount >= 24 && RegCount <= 256 && RegCount % 8 == 0, "setmaxnreg range");
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(RegCount));
}
template <uint32_t RegCount>
__device__ __forceinline__ void setmaxnreg_dec() {
  static_assert(RegCount >= 24 && RegCount <= 256 && RegCount % 8 == 0, "setmaxnreg range");
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(RegCount));
}

// =================================================================================================
// 7. ldmatrix / stmatrix (warp-wide 8x8 b16 matrix moves between registers and smem)
// =================================================================================================
// ldmatrix.sync.aligned.shape.num{.trans}{.ss}.type r, [p];
// ldmatrix.sync.aligned.m8n16.num{.ss}.dst_fmt.src_fmt        r, [p];
// ldmatrix.sync.aligned.m16n16.num.trans{.ss}.dst_fmt.src_fmt r, [p];
//   .shape = { .m8n8, .m16n16 };  .num = { .x1, .x2, .x4 };  .ss = { .shared{::cta} }
//   .type = { .b16, .b8 };  .dst_fmt = { .b8x16 };  .src_fmt = { .b6x16_p32, .b4x16_p64 }
// stmatrix.sync.aligned.shape.num{.trans}{.ss}.type [p], r;
//   .shape = { .m8n8, .m16n8 };  .num = { .x1, .x2, .x4 };  .ss = { .shared{::cta} }
//   .type = { .b16, .b8 }
// m8n8.x4.b16: four 8x8 matrices of 16-bit elements. Lane L supplies the address of ROW (L % 8) of
// matrix (L / 8) (16 contiguous bytes, 16-B aligned). Register r[m] holds, in lane L, elements
// (row L/4, cols 2*(L%4), 2*(L%4)+1) of matrix m (low half = lower column). .trans swaps rows and
// columns (register r[m] then holds (rows 2*(L%4), 2*(L%4)+1 ; col L/4)).
// Epilogue mapping for one wgmma accumulator 16x16 block j (cols 16j..16j+15 of warp w's 16 rows):
//   r[0] = pack(d[8j+0], d[8j+1])  (rows 0-7,  cols 0-7)     r[1] = pack(d[8j+2], d[8j+3]) (rows 8-15)
//   r[2] = pack(d[8j+4], d[8j+5])  (rows 0-7,  cols 8-15)    r[3] = pack(d[8j+6], d[8j+7])
//   lane L address: row 16*w + (L % 8) + 8 * ((L / 8) % 2), col 16*j + 8 * (L / 16).
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* smem_row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_u32(smem_row))
               : "memory");
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* smem_row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_u32(smem_row))
               : "memory");
}
__device__ __forceinline__ void stmatrix_x4(void* smem_row, const uint32_t (&r)[4]) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};" ::"r"(
                   smem_u32(smem_row)),
               "r"(r[0]), "r"(r[1]), "r"(r[2]), "r"(r[3])
               : "memory");
}
__device__ __forceinline__ void stmatrix_x4_trans(void* smem_row, const uint32_t (&r)[4]) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};" ::"r"(
                   smem_u32(smem_row)),
               "r"(r[0]), "r"(r[1]), "r"(r[2]), "r"(r[3])
               : "memory");
}

// =================================================================================================
// 8. Thread-block clusters and distributed shared memory (DSMEM)
// =================================================================================================
// Special registers: %cluster_ctarank (rank in cluster, 0..n-1), %cluster_nctarank,
// %clusterid.{x,y,z}, %nclusterid.{x,y,z}, %cluster_ctaid.{x,y,z}, %cluster_nctaid.{x,y,z}.
__device__ __forceinline__ uint32_t cluster_ctarank() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  return r;
}
__device__ __forceinline__ uint32_t cluster_nctarank() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_nctarank;" : "=r"(r));
  return r;
}
__device__ __forceinline__ uint32_t cluster_id_x() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%clusterid.x;" : "=r"(r));
  return r;
}

// barrier.cluster.arrive{.sem}{.aligned};    .sem = { .release, .relaxed } (default .release)
// barrier.cluster.wait{.acquire}{.aligned};
//   Every non-exited thread of every CTA in the cluster must arrive before the waiters proceed.
//   `.aligned`: all threads of the warp execute the same instruction (warp-uniform code only).
__device__ __forceinline__ void cluster_arrive() {
  asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
}
__device__ __forceinline__ void cluster_arrive_relaxed() {
  asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
}
__device__ __forceinline__ void cluster_wait() {
  asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");
}
__device__ __forceinline__ void cluster_sync() {
  cluster_arrive();
  cluster_wait();
}

// mapa{.space}.type d, a, b;     .space = { .shared::cluster };  .type = { .u32, .u64 }
//   mapa.shared::cluster.type d, a, b;  // shared address a of this CTA -> same variable in CTA b
//   mapa.type                 d, a, b;  // generic address variant
// getctarank{.space}.type d, a;          // which CTA owns shared::cluster / generic address a
__device__ __forceinline__ uint32_t mapa_shared(uint32_t smem_addr, uint32_t cta_rank) {
  uint32_t r;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(r) : "r"(smem_addr), "r"(cta_rank));
  return r;
}
// ld/st on shared::cluster addresses (from mapa_shared) read/write a peer CTA's smem (DSMEM).
__device__ __forceinline__ uint32_t ld_shared_cluster_u32(uint32_t cluster_addr) {
  uint32_t v;
  asm volatile("ld.shared::cluster.u32 %0, [%1];" : "=r"(v) : "r"(cluster_addr) : "memory");
  return v;
}
__device__ __forceinline__ void st_shared_cluster_u32(uint32_t cluster_addr, uint32_t v) {
  asm volatile("st.shared::cluster.u32 [%0], %1;" ::"r"(cluster_addr), "r"(v) : "memory");
}

}  // namespace ptx

// =================================================================================================
// 9. Host helpers: tensor maps (no -lcuda) and launches
// =================================================================================================
namespace ptx {

// cuTensorMapEncodeTiled obtained through the runtime (CUDA >= 12.5; the un-versioned
// cudaGetDriverEntryPoint is deprecated in CUDA 13). Cached after the first call.
inline PFN_cuTensorMapEncodeTiled_v12000 get_tensor_map_encoder() {
  static PFN_cuTensorMapEncodeTiled_v12000 fn = nullptr;
  if (fn == nullptr) {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult qres = cudaDriverEntryPointSymbolNotFound;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault,
                                         &qres) == cudaSuccess &&
        qres == cudaDriverEntryPointSuccess) {
      fn = reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(p);
    }
  }
  return fn;
}

// Checks the documented constraints before encoding; returns nullptr when OK, else a reason.
//   global address 16-B aligned; strides (bytes, dims 1..rank-1) multiples of 16 and < 2^40;
//   1 <= box[i] <= 256; box[0] * elem_bytes multiple of 16; with swizzle: box[0] * elem_bytes <=
//   swizzle span (32/64/128 B), i.e. at most 64 bf16 per box row for SWIZZLE_128B.
inline const char* tmap_check(const void* gaddr, uint32_t rank, const uint64_t* dims,
                              const uint64_t* strides_bytes, const uint32_t* box,
                              uint32_t elem_bytes, CUtensorMapSwizzle swizzle) {
  if (reinterpret_cast<uintptr_t>(gaddr) % 16 != 0) return "global address not 16-B aligned";
  if (rank < 1 || rank > 5) return "rank must be 1..5";
  for (uint32_t i = 0; i < rank; ++i) {
    if (dims[i] == 0 || dims[i] > (1ull << 32)) return "dim out of range [1, 2^32]";
    if (box[i] == 0 || box[i] > 256) return "box dim out of range [1, 256]";
  }
  for (uint32_t i = 0; i + 1 < rank; ++i) {
    if (strides_bytes[i] % 16 != 0) return "global stride not a multiple of 16 bytes";
    if (strides_bytes[i] >= (1ull << 40)) return "global stride >= 2^40";
  }
  const uint32_t inner_bytes = box[0] * elem_bytes;
  if (inner_bytes % 16 != 0) return "box[0] * elem_bytes not a multiple of 16";
  const uint32_t span = swizzle == CU_TENSOR_MAP_SWIZZLE_128B  ? 128u
                        : swizzle == CU_TENSOR_MAP_SWIZZLE_64B ? 64u
                        : swizzle == CU_TENSOR_MAP_SWIZZLE_32B ? 32u
                                                               : 0u;
  if (span != 0 && inner_bytes > span) return "box[0] * elem_bytes exceeds the swizzle span";
  return nullptr;
}

// Row-major 2-D tensor [outer][inner] (inner contiguous), box [box_outer][box_inner].
// Example: A[M][K] bf16, K-major, 128B swizzle:
//   make_tmap_2d(&map, A, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, K, M, K * 2, 64, 128,
//                CU_TENSOR_MAP_SWIZZLE_128B);   -> each TMA load fills a [128][64] smem tile
inline CUresult make_tmap_2d(CUtensorMap* map, const void* gaddr, CUtensorMapDataType dtype,
                             uint32_t elem_bytes, uint64_t inner, uint64_t outer,
                             uint64_t row_stride_bytes, uint32_t box_inner, uint32_t box_outer,
                             CUtensorMapSwizzle swizzle,
                             CUtensorMapL2promotion promo = CU_TENSOR_MAP_L2_PROMOTION_L2_256B) {
  const cuuint64_t dims[2] = {inner, outer};
  const cuuint64_t strides[1] = {row_stride_bytes};
  const cuuint32_t box[2] = {box_inner, box_outer};
  const cuuint32_t estr[2] = {1, 1};
  if (tmap_check(gaddr, 2, dims, strides, box, elem_bytes, swizzle) != nullptr) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  PFN_cuTensorMapEncodeTiled_v12000 enc = get_tensor_map_encoder();
  if (enc == nullptr) return CUDA_ERROR_NOT_FOUND;
  return enc(map, dtype, 2, const_cast<void*>(gaddr), dims, strides, box, estr,
             CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle, promo, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
}

// 3-D tensor [d2][d1][d0] (d0 contiguous), strides in bytes for d1 and d2, box [b2][b1][b0].
// Typical uses: [B*S][H][D] attention tensors (one head per box), or splitting a 128-wide K tile
// into two 64-element swizzle atoms with one load: dims {64, rows, K/64}, strides {K*2, 128}.
inline CUresult make_tmap_3d(CUtensorMap* map, const void* gaddr, CUtensorMapDataType dtype,
                             uint32_t elem_bytes, uint64_t d0, uint64_t d1, uint64_t d2,
                             uint64_t stride1_bytes, uint64_t stride2_bytes, uint32_t b0,
                             uint32_t b1, uint32_t b2, CUtensorMapSwizzle swizzle,
                             CUtensorMapL2promotion promo = CU_TENSOR_MAP_L2_PROMOTION_L2_256B) {
  const cuuint64_t dims[3] = {d0, d1, d2};
  const cuuint64_t strides[2] = {stride1_bytes, stride2_bytes};
  const cuuint32_t box[3] = {b0, b1, b2};
  const cuuint32_t estr[3] = {1, 1, 1};
  if (tmap_check(gaddr, 3, dims, strides, box, elem_bytes, swizzle) != nullptr) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  PFN_cuTensorMapEncodeTiled_v12000 enc = get_tensor_map_encoder();
  if (enc == nullptr) return CUDA_ERROR_NOT_FOUND;
  return enc(map, dtype, 3, const_cast<void*>(gaddr), dims, strides, box, estr,
             CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle, promo, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
}

// Opt in to more than 48 KB of dynamic shared memory (max 227 KB = 232448 B per block on H100).
template <typename Kernel>
inline cudaError_t set_max_dynamic_smem(Kernel kernel, int bytes) {
  return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
}

// Launch with a cluster shape (cluster_x CTAs along x; grid.x must be a multiple of it).
// Kernel args are passed by value, matching the kernel's parameter types exactly.
template <typename... KArgs, typename... Args>
inline cudaError_t launch_cluster(void (*kernel)(KArgs...), dim3 grid, dim3 block,
                                  size_t smem_bytes, cudaStream_t stream, unsigned cluster_x,
                                  Args... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem_bytes;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = cluster_x;
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  return cudaLaunchKernelEx(&cfg, kernel, args...);
}

}  // namespace ptx
