// Quantization of the attention operands that native mode computes on the fly (SPEC
// section 4): the query (single or dual-residual FP4) and the probability blocks
// (underflow-aware scaling). Block level, host and device, so the CPU reference and the
// decode kernel follow the same float32 steps.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#endif

#include "fp4kv/core/block_quant.h"
#include "fp4kv/core/host_device.h"
#include "fp4kv/core/minifloat.h"

namespace fp4kv {

// ---- Query -----------------------------------------------------------------------------
// A query vector is quantized with its own g = amax / (6 * 448) (NVFP4) and the standard
// rule; the residual term r = q - deq(q1) gets its own g, so it does not sink into E4M3
// subnormals. MXFP4 terms have no g.

// Residual of one NVFP4 block: out[i] = x[i] - value(code_i) * (decode(s) * g).
FP4KV_HD void nvfp4_block_residual(const float* x, const uint8_t* codes, uint8_t s, float g, float* out, int n = kNvfp4Block) {
  const float sg = mul_rn(e4m3_value(s), g);
  for (int i = 0; i < n; ++i) out[i] = sub_rn(x[i], mul_rn(e2m1_value(codes[i]), sg));
}
FP4KV_HD void mxfp4_block_residual(const float* x, const uint8_t* codes, uint8_t s, float* out, int n = kMxfp4Block) {
  const float sc = e8m0_value(s);
  for (int i = 0; i < n; ++i) out[i] = sub_rn(x[i], mul_rn(e2m1_value(codes[i]), sc));
}

// ---- Probabilities ---------------------------------------------------------------------
// A P block holds 16 (NVFP4) or 32 (MXFP4) consecutive keys of one query head, with values
// p = exp2(S - m + log2 c) relative to the running maximum m of the current tile; pmax is
// the largest of them (c * max(p_b) in the paper's notation). P has no g.

// NVFP4: kappa = 2 when underflow-aware and pmax <= tau, else 6; s = E4M3(pmax / kappa).
FP4KV_HD float nvfp4_prob_kappa(float pmax, bool underflow_aware, float tau) {
  return (underflow_aware && pmax <= tau) ? 2.0f : 6.0f;
}
FP4KV_HD uint8_t nvfp4_prob_scale(float pmax, bool underflow_aware, float tau) {
  return nvfp4_block_scale(pmax, nvfp4_prob_kappa(pmax, underflow_aware, tau), 1.0f);
}
FP4KV_HD uint8_t nvfp4_prob_code(float p, float scale_value) {
  return scale_value > 0.0f ? e2m1_encode(div_rn(p, scale_value)) : uint8_t(0);
}

// ---- The same P quantization as values, without branches (the decode kernel's form) -----
// The decode kernel needs only the dequantized value code * s of each probability. These
// give exactly e2m1_value(nvfp4_prob_code(p, s)) * s and e4m3_value(nvfp4_prob_scale(..)) for
// every finite input >= 0 (tests/core: CPU; tests/attention/test_prob_quant.cu: every input
// class on the GPU, where the division and the E4M3 rounding take the fast paths below).

// e2m1_value(e2m1_encode(x)) for finite x >= 0: x saturated at 6, then rounded to the E2M1
// grid by adding and removing 1.5 * 2^(22 + max(e, 0)), e the exponent of x. The sum's last
// place is then the grid's step (0.5 below 2, 1 in [2, 4), 2 in [4, 6]), and its rounding to
// nearest even picks the even code (a code and its value's multiple of the step have the
// same parity). Six operations, no compare-and-select chain.
FP4KV_HD float e2m1_round_value(float x) {
  constexpr uint32_t kExponentField = 0x7F800000u, kOneBits = 0x3F800000u;
  constexpr uint32_t kMagicOffset = (22u << 23) | 0x00400000u;  // times 2^22, mantissa 1.5
  const float xs = x < 6.0f ? x : 6.0f;
  const uint32_t e = float_bits(xs) & kExponentField;
  const float magic = bits_float((e > kOneBits ? e : kOneBits) + kMagicOffset);
  return sub_rn(add_rn(xs, magic), magic);
}

// a / b rounded to nearest even, for 2^-100 <= a < 2^64 and b an E4M3 value > 0; a below
// 2^-100 gives some value below 2^-88, which every caller rounds to zero (E2M1 and E4M3
// rounding points are >= 2^-10). On the device: the fast path of IEEE division (reciprocal,
// one Newton step, quotient, one FMA correction) without its range check and slow-path
// call, which these ranges never need.
FP4KV_HD float div_rn_above_tiny(float a, float b) {
#if defined(__CUDA_ARCH__)
  float r;
  asm("rcp.approx.ftz.f32 %0, %1;\n" : "=f"(r) : "f"(b));
  r = __fmaf_rn(r, __fmaf_rn(-b, r, 1.0f), r);
  const float q = __fmul_rn(a, r);
  return __fmaf_rn(__fmaf_rn(-b, q, a), r, q);
#else
  return div_rn(a, b);
#endif
}

// a / 6 rounded to nearest even for 2^-110 <= a < 2^70 (smaller a give a value below
// 2^-100): on the device the rounded reciprocal and one FMA correction, which is correctly
// rounded over that whole range (every float of it checked on the host against IEEE
// division, 2026-12-07).
FP4KV_HD float div_rn_by_6(float a) {
#if defined(__CUDA_ARCH__)
  constexpr float kSixth = 1.0f / 6.0f;
  const float q = __fmul_rn(a, kSixth);
  return __fmaf_rn(__fmaf_rn(-6.0f, q, a), kSixth, q);
#else
  return div_rn(a, 6.0f);
#endif
}

// e4m3_value(nvfp4_prob_scale(pmax, underflow_aware, tau)) for finite pmax >= 0; on the
// device the E4M3 rounding is the hardware conversion (round to nearest even, saturating).
FP4KV_HD float nvfp4_prob_scale_value(float pmax, bool underflow_aware, float tau) {
  const bool kappa_is_2 = nvfp4_prob_kappa(pmax, underflow_aware, tau) == 2.0f;  // else 6
  const float t = kappa_is_2 ? mul_rn(pmax, 0.5f) : div_rn_by_6(pmax);
#if defined(__CUDA_ARCH__)
  const __nv_fp8_storage_t c = __nv_cvt_float_to_fp8(t, __NV_SATFINITE, __NV_E4M3);
  return __half2float(__half(__nv_cvt_fp8_to_halfraw(c, __NV_E4M3)));
#else
  return e4m3_value(e4m3_encode(t));
#endif
}

// e2m1_value(nvfp4_prob_code(p, s)) * s for finite p >= 0 and s = an E4M3 value >= 0.
FP4KV_HD float nvfp4_prob_value(float p, float s) {
  const float v = mul_rn(e2m1_round_value(div_rn_above_tiny(p, s)), s);
  return s > 0.0f ? v : 0.0f;
}

// MXFP4: the OCP exponent of pmax (E8M0 reaches 2^-127, so there is no underflow to avoid;
// c still folds into exp2).
FP4KV_HD uint8_t mxfp4_prob_scale(float pmax) { return uint8_t(mxfp4_ocp_exponent(pmax) + kE8M0Bias); }
FP4KV_HD uint8_t mxfp4_prob_code(float p, uint8_t scale) {
  return e2m1_encode(mul_rn(p, pow2f(kE8M0Bias - int(scale))));
}

}  // namespace fp4kv
