// The page kernel's NVFP4 and MXFP4 block quantizers: the same bytes as core/block_quant.h's
// nvfp4_quantize_block / mxfp4_quantize_block (the CPU reference's), in less than half the
// instructions (Nsight: 101 M -> 46 M per 8192-token chunk and layer). The core functions run a branch chain per element (an IEEE division with its
// range check and slow path, seven threshold branches, the code's value); these run straight
// code:
//   - the E2M1 code of |q| is the round-half-even of q on its binade's grid (spacing 0.5 below
//     2, 1 below 4, 2 above, saturating at 6): one fused add of a rounding constant after a
//     scale of 2, 1 or 1/2, which reproduces e2m1_encode's thresholds and their ties exactly;
//   - NVFP4's x / sg shares its divisor over the block: the reciprocal and its Newton step are
//     computed once, each element pays CUDA's div.rn fast path (q0 = x r, the exact remainder
//     by FMA, one correction), which is the correctly rounded quotient whenever that fast path
//     passes its range check (FCHK). Blocks whose sg lies outside [2^-64, 2^64] take the core
//     function. Inside it, every quotient that can reach a code threshold (|x / sg| in
//     [1/8, 16]) has a normal numerator, reciprocal and remainder, so the range check passes;
//     quotients outside that band give the same code from any approximation of a few ulps
//     (0 below 1/4, 7 above 5). The code's sign is the sign bit of x, as RN(x / sg)'s is.
// Everything else (block maxima, the E4M3 / E8M0 scales, the squared-error sums of the
// search, in element order) is the core functions' own operations. tests/cache
// (test_page_block_quant.cu) checks the magnitude rounding for every float, the element code
// for every BF16 x against every E4M3 scale times sampled global scales, and whole blocks on
// adversarial inputs (values at and around every threshold, zeros of both signs, subnormal
// and saturating scales); the page tests check whole pages against the CPU.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "fp4kv/core/block_quant.h"

namespace fp4kv::cache::detail {

// A float's round-half-even to an integer, as the bits of x + 1.5 * 2^23 (|x| < 2^22).
inline constexpr float kRintMagic = 12582912.0f;
inline constexpr uint32_t kRintMagicBits = 0x4B400000u;
// The element scales whose shared-divisor quotients are exact where codes are decided.
inline constexpr float kFastDivisorMin = 0x1p-64f, kFastDivisorMax = 0x1p64f;

// The E2M1 magnitude code (0..7) of a >= 0 (not NaN) as e2m1_encode gives it, and its value.
struct E2m1Magnitude {
  uint32_t code;
  float value;
};
__device__ __forceinline__ E2m1Magnitude e2m1_round_magnitude(float a) {
  const bool below2 = a < 2.0f, below4 = a < 4.0f;
  const float scale = below2 ? 2.0f : (below4 ? 1.0f : 0.5f);  // grid points per unit
  const float step = below2 ? 0.5f : (below4 ? 1.0f : 2.0f);
  const uint32_t base = below2 ? 0u : (below4 ? 2u : 4u);        // code of the binade's first point
  const float t = __fmaf_rn(a, scale, kRintMagic);               // a scale exact: one rounding
  const uint32_t n = __float_as_uint(t) - kRintMagicBits;        // grid index (huge when a is)
  E2m1Magnitude m;
  m.code = min(n + base, 7u);
  m.value = fminf(__fmul_rn(__fsub_rn(t, kRintMagic), step), 6.0f);
  return m;
}

// A block of B BF16 values, two per 32-bit word (element 2k in the low half): the page
// kernel's tile values in half the registers of floats. Callers hold finite values only (the
// core quantizers' finite_or_zero).
template <int B>
struct Bf16Block {
  uint32_t w[B / 2];
  __device__ __forceinline__ float operator[](int i) const {
    return __uint_as_float(i % 2 ? w[i / 2] & 0xFFFF0000u : w[i / 2] << 16);
  }
};

// Where a block's codes go: put(i, code) ORs element i's 4-bit code in (once per element, into
// zeroed storage); merge(other) ORs another candidate's codes in. Codes in element order, two
// per byte (low nibble first), the tests' form:
template <int B>
struct CodesInOrder {
  uint32_t w[B / 8] = {};
  __device__ __forceinline__ void put(int i, uint32_t code) { w[i / 8] |= code << (4 * (i % 8)); }
  __device__ __forceinline__ void merge(const CodesInOrder& o) {
#pragma unroll
    for (int k = 0; k < B / 8; ++k) w[k] |= o.w[k];
  }
};

// The signed code and value of an element with x's sign whose magnitude rounds to m.
__device__ __forceinline__ uint32_t e2m1_signed_code(float x, const E2m1Magnitude& m) {
  return m.code | ((__float_as_uint(x) >> 28) & 8u);
}
__device__ __forceinline__ float e2m1_signed_value(float x, const E2m1Magnitude& m) {
  return __uint_as_float(__float_as_uint(m.value) | (__float_as_uint(x) & 0x80000000u));
}

__device__ __forceinline__ bool fast_divisor(float sg) { return sg >= kFastDivisorMin && sg <= kFastDivisorMax; }

// An element's code under element scale sg (reciprocal r, div.rn's refined one: q = x / sg
// by div.rn's fast path) into `codes`, its squared error added to err (in element order).
template <class Codes>
__device__ __forceinline__ void nvfp4_element(float xi, int i, float sg, float r, Codes& codes, float& err) {
  const float q0 = __fmul_rn(xi, r);
  const float q = __fmaf_rn(r, __fmaf_rn(-sg, q0, xi), q0);
  const E2m1Magnitude m = e2m1_round_magnitude(fabsf(q));
  codes.put(i, e2m1_signed_code(xi, m));
  const float e = __fsub_rn(__fmul_rn(e2m1_signed_value(xi, m), sg), xi);
  err = __fadd_rn(err, __fmul_rn(e, e));
}

// div.rn's reciprocal of sg: the hardware approximation and one Newton step.
__device__ __forceinline__ float refined_reciprocal(float sg) {
  float r0;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r0) : "f"(sg));
  return __fmaf_rn(r0, __fmaf_rn(-sg, r0, 1.0f), r0);
}

// nvfp4_quantize_block itself, for blocks with an element scale outside the fast range
// (rare), out of line: the scale, and the codes in element order (nibble i at bits 4 i).
struct CoreBlock {
  uint64_t codes;
  uint8_t scale;
};
static __device__ __noinline__ CoreBlock nvfp4_block_core(Bf16Block<kNvfp4Block> x, float g, bool search) {
  float xf[kNvfp4Block];
  uint8_t c[kNvfp4Block];
  for (int i = 0; i < kNvfp4Block; ++i) xf[i] = x[i];
  CoreBlock r;
  r.scale = nvfp4_quantize_block(xf, 1, g, search, c);
  r.codes = 0;
  for (int i = 0; i < kNvfp4Block; ++i) r.codes |= uint64_t(c[i]) << (4 * i);
  return r;
}

// nvfp4_quantize_block(x, 1, g, kSearch, ...): the E4M3 scale; codes to `codes`. With the
// search both candidates (kappa 6 and 4) run in one pass over the elements.
template <bool kSearch, class Codes>
__device__ __forceinline__ uint8_t nvfp4_block_fast(const Bf16Block<kNvfp4Block>& x, float g, Codes& codes) {
  float amax = 0.0f;
#pragma unroll
  for (int i = 0; i < kNvfp4Block; ++i) amax = fmaxf(amax, fabsf(x[i]));
  const uint8_t s6 = nvfp4_block_scale(amax, 6.0f, g);
  const uint8_t s4 = kSearch ? nvfp4_block_scale(amax, 4.0f, g) : s6;
  if (amax == 0.0f) return s6;  // sg = 0: every code 0 (not the sign's 8)
  const float sg6 = mul_rn(e4m3_value(s6), g), sg4 = mul_rn(e4m3_value(s4), g);
  if (!fast_divisor(sg6) || !fast_divisor(sg4)) {
    const CoreBlock b = nvfp4_block_core(x, g, kSearch);
#pragma unroll
    for (int i = 0; i < kNvfp4Block; ++i) codes.put(i, uint32_t(b.codes >> (4 * i)) & 0xFu);
    return b.scale;
  }
  const float r6 = refined_reciprocal(sg6), r4 = kSearch ? refined_reciprocal(sg4) : 0.0f;
  Codes c6, c4;
  float err6 = 0.0f, err4 = 0.0f;
#pragma unroll
  for (int i = 0; i < kNvfp4Block; ++i) {
    const float xi = x[i];
    nvfp4_element(xi, i, sg6, r6, c6, err6);
    if constexpr (kSearch) nvfp4_element(xi, i, sg4, r4, c4, err4);
  }
  if (kSearch && err4 < err6) {  // kappa 4 only on a strictly lower error
    codes.merge(c4);
    return s4;
  }
  codes.merge(c6);
  return s6;
}

// An element's code under block scale 2^e (inv = 2^-e) into `codes`, its squared error added
// to err (in element order).
template <class Codes>
__device__ __forceinline__ void mxfp4_element(float xi, int i, float inv, float scale, Codes& codes, float& err) {
  const float q = __fmul_rn(xi, inv);
  const E2m1Magnitude m = e2m1_round_magnitude(fabsf(q));
  codes.put(i, e2m1_signed_code(q, m));
  const float d = __fsub_rn(__fmul_rn(e2m1_signed_value(q, m), scale), xi);
  err = __fadd_rn(err, __fmul_rn(d, d));
}

// mxfp4_quantize_block(x, 1, kSearch, ...): the E8M0 scale; codes to `codes`. With the search
// both candidates (e and e + 1) run in one pass over the elements.
template <bool kSearch, class Codes>
__device__ __forceinline__ uint8_t mxfp4_block_fast(const Bf16Block<kMxfp4Block>& x, Codes& codes) {
  float amax = 0.0f;
#pragma unroll
  for (int i = 0; i < kMxfp4Block; ++i) amax = fmaxf(amax, fabsf(x[i]));
  const int e = mxfp4_ocp_exponent(amax);
  const bool second = kSearch && amax > 0.0f && e < 127;
  const int e1 = second ? e + 1 : e;
  const float inv0 = pow2f(-e), scale0 = pow2f(e), inv1 = pow2f(-e1), scale1 = pow2f(e1);
  Codes c0, c1;
  float err0 = 0.0f, err1 = 0.0f;
#pragma unroll
  for (int i = 0; i < kMxfp4Block; ++i) {
    const float xi = x[i];
    mxfp4_element(xi, i, inv0, scale0, c0, err0);
    if constexpr (kSearch) mxfp4_element(xi, i, inv1, scale1, c1, err1);
  }
  if (second && err1 < err0) {  // e + 1 only on a strictly lower error
    codes.merge(c1);
    return uint8_t(e1 + kE8M0Bias);
  }
  codes.merge(c0);
  return uint8_t(e + kE8M0Bias);
}

}  // namespace fp4kv::cache::detail
