// Device building blocks of the decode kernels: MMA, ldmatrix, cp.async, bulk copies,
// shuffles, and the launcher declarations of the kernel instances.
#pragma once

#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "fp4kv/attention/kernel_args.h"
#include "fp4kv/cache/bulk_copy.cuh"
#include "fp4kv/cache/layout.h"
#include "fp4kv/cache/step_plan.h"

namespace fp4kv::attention::detail {

// Launchers, defined in decode_kernel.cuh and explicitly instantiated from the instance list
// (kernel_instances.h).
template <class F, int D, int OM, int NT>
cudaError_t configure_decode();
template <class F, int D, int OM, int NT>
int decode_smem_bytes(int G);
template <class F, int D, int OM, int NT>
int decode_occupancy(int G);  // resident CTAs per SM of that variant
template <class F, int D, int OM, int NT>
void launch_decode(const KernelArgs& a, cudaStream_t stream);
template <int D, IoType IO>
void launch_combine(const CombineArgs& a, cudaStream_t stream);

// ---- PTX wrappers ------------------------------------------------------------------------

// Bulk copies and mbarriers (cache/bulk_copy.cuh, shared with the engine's ops).
using cache::bulk_copy_to_shared;
using cache::mbar_expect_tx;
using cache::mbar_init;
using cache::mbar_init_fence;
using cache::mbar_wait;
using cache::smem_u32;

// 16-byte async copy global -> shared; src_bytes = 0 writes zeros.
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, int src_bytes = 16) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

__device__ __forceinline__ void st_shared_u32(uint32_t addr, uint32_t v) {
  asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(addr), "r"(v) : "memory");
}
// Adds to a shared counter with acquire-release order within the CTA; returns the old value.
__device__ __forceinline__ uint32_t atom_add_acq_rel_shared(uint32_t addr, uint32_t v) {
  uint32_t old;
  asm volatile("atom.acq_rel.cta.shared::cta.add.u32 %0, [%1], %2;\n" : "=r"(old) : "r"(addr), "r"(v) : "memory");
  return old;
}
// Tensor (TMA) copy of the box at element coordinates (c0, c1, c2) of the 3-D tensor map at
// generic address `map` (a __grid_constant__ kernel parameter) into shared memory at `dst`,
// completing on `bar`; elements outside the tensor arrive as zeros and count as copied bytes.
__device__ __forceinline__ void tma_load_3d(uint32_t dst, const void* map, int c0, int c1, int c2, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], [%5];\n" ::"r"(
          dst),
      "l"(map), "r"(c0), "r"(c1), "r"(c2), "r"(bar)
      : "memory");
}

// D = A * B + C, m16n8k16, FP16 inputs, FP32 accumulate.
__device__ __forceinline__ void mma_f16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
__device__ __forceinline__ void mma_bf16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// Two E4M3 bytes (low byte -> low half) to half2 bits; exact.
__device__ __forceinline__ uint32_t e4m3x2_to_half2_bits(uint32_t pair) {
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(pair & 0xFFFFu), __NV_E4M3);
  return uint32_t(h.x) | (uint32_t(h.y) << 16);
}
// The same of the pair in the high 16 bits of `word`, which the conversion reads in place
// (a shift down first would be one more instruction per pair).
__device__ __forceinline__ uint32_t e4m3x2_high_to_half2_bits(uint32_t word) {
  uint32_t r;
  asm("{\n .reg .b16 lo, hi;\n mov.b32 {lo, hi}, %1;\n cvt.rn.f16x2.e4m3x2 %0, hi;\n}" : "=r"(r) : "r"(word));
  return r;
}
// Pair i of an array of 16-bit pairs held as 32-bit words (pair 2k in the low half of word k).
__device__ __forceinline__ uint32_t e4m3_pair_to_half2_bits(const uint32_t* words, int i) {
  return i % 2 ? e4m3x2_high_to_half2_bits(words[i / 2]) : e4m3x2_to_half2_bits(words[i / 2]);
}

// 2^x by the SFU alone (ex2.approx.ftz: ~2 ulp, results below 2^-126 flush to 0, -inf -> 0);
// exp2f would add the denormal-range fix-up around it on every softmax element.
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

__device__ __forceinline__ uint32_t half_bits(float x) { return __half_as_ushort(__float2half_rn(x)); }
__device__ __forceinline__ uint32_t bf16_bits(float x) { return __bfloat16_as_ushort(__float2bfloat16_rn(x)); }
// The BF16 value in the low or high half of a 32-bit word, as FP32 (exact: one shift or mask).
__device__ __forceinline__ float bf16_low_as_float(uint32_t w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float bf16_high_as_float(uint32_t w) { return __uint_as_float(w & 0xFFFF0000u); }

// Element i of an input (query) or output array of the I/O type IO (a template argument,
// so a kernel reads and writes its one type with no branch).
template <IoType IO>
__device__ __forceinline__ float load_io(const void* p, size_t i) {
  if constexpr (IO == IoType::bf16) return __uint_as_float(uint32_t(static_cast<const uint16_t*>(p)[i]) << 16);
  else return static_cast<const float*>(p)[i];
}
template <IoType IO>
__device__ __forceinline__ void store_io(void* p, size_t i, float v) {
  if constexpr (IO == IoType::bf16) static_cast<uint16_t*>(p)[i] = uint16_t(bf16_bits(v));
  else static_cast<float*>(p)[i] = v;
}

__device__ __forceinline__ float warp_max_xor(float v, int from) {
  for (int o = from; o < 32; o *= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
__device__ __forceinline__ float warp_sum_xor(float v, int from) {
  for (int o = from; o < 32; o *= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float neg_inf() { return __int_as_float(0xff800000); }

// Natural-log <-> base-2 conversions of logits and log-sum-exps.
inline constexpr float kLn2 = 0.693147180559945309f;
inline constexpr float kLog2e = 1.44269504088896341f;

}  // namespace fp4kv::attention::detail
