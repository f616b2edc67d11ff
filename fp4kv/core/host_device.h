// Portable building blocks for code that runs on the host and the device with identical
// results: the HD macro, bit casts, and float32 operations that can never be contracted
// into FMAs (the formats of SPEC section 3 are defined op by op in IEEE float32).
#pragma once

#include <bit>
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define FP4KV_HD __host__ __device__ __forceinline__
#define FP4KV_UNROLL _Pragma("unroll")
#else
#define FP4KV_HD inline
#define FP4KV_UNROLL
#endif

namespace fp4kv {

FP4KV_HD uint32_t float_bits(float x) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(x);
#else
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return u;
#endif
}

FP4KV_HD float bits_float(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float x;
  std::memcpy(&x, &u, sizeof x);
  return x;
#endif
}

// One IEEE float32 operation each, round to nearest even, never fused.
FP4KV_HD float mul_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
FP4KV_HD float div_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}
FP4KV_HD float add_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
FP4KV_HD float sub_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}

FP4KV_HD bool is_finite(float x) { return (float_bits(x) & 0x7f800000u) != 0x7f800000u; }
FP4KV_HD float abs_f(float x) { return bits_float(float_bits(x) & 0x7fffffffu); }
FP4KV_HD float max_f(float a, float b) { return a > b ? a : b; }

// 2^k as a float for k in [-149, 127] (subnormal below -126); exact.
FP4KV_HD float pow2f(int k) {
  if (k >= -126) return bits_float(uint32_t(k + 127) << 23);
  return bits_float(1u << (k + 149));
}

// floor(log2(x)) for finite x > 0, subnormals included; exact, without branches.
FP4KV_HD int floor_log2(float x) {
  const uint32_t u = float_bits(x) & 0x7fffffffu;
  const int e = int(u >> 23);
#if defined(__CUDA_ARCH__)
  const int msb = 31 - __clz(int(u));  // subnormal: value = u * 2^-149
#else
  const int msb = 31 - std::countl_zero(u);
#endif
  return e != 0 ? e - 127 : msb - 149;
}

}  // namespace fp4kv
