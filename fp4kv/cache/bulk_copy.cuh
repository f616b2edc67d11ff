// Bulk (TMA) copies into shared memory and the mbarriers they complete on (sm_90): the PTX
// wrappers the cache, the attention kernels and the engine's ops share. A copy's issuing
// thread announces its bytes on the mbarrier (expect_tx, its own arrival included) and the
// barrier's phase completes once every announced byte has landed; readers wait on the phase's
// parity. In the cache layer, as dependent_launch.cuh, so that every kernel layer above has one
// form.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace fp4kv::cache {

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void mbar_init(uint32_t bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
// Makes initialized mbarriers visible to the asynchronous proxy (the copies that complete on them).
__device__ __forceinline__ void mbar_init_fence() { asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory"); }
// Announces `bytes` of asynchronous copies to `bar` (this thread's arrival included).
__device__ __forceinline__ void mbar_expect_tx(uint32_t bar, int bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
// Bulk copy of `bytes` (multiple of 16, 16-byte aligned) global -> shared that completes on
// the mbarrier `bar`; the issuing thread announces the bytes first. The CTA-local shared
// address is a valid shared::cluster address of this CTA.
__device__ __forceinline__ void bulk_copy_to_shared(uint32_t dst, const void* src, int bytes, uint32_t bar) {
  mbar_expect_tx(bar, bytes);
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(dst),
               "l"(src), "r"(bytes), "r"(bar)
               : "memory");
}
// The same for data read once (weights in a decode step): marked evict-first in L2.
__device__ __forceinline__ void bulk_copy_to_shared_evict_first(uint32_t dst, const void* src, int bytes,
                                                                uint32_t bar) {
  uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(policy));
  mbar_expect_tx(bar, bytes);
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, [%3], %4;\n" ::"r"(
          dst),
      "l"(src), "r"(bytes), "r"(bar), "l"(policy)
      : "memory");
}
// Waits until the phase with parity `parity` of `bar` has completed.
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "WAIT_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
      "@!p bra WAIT_%=;\n"
      "}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
}

}  // namespace fp4kv::cache
