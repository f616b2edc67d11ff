// NVFP4 and MXFP4 block quantizers (SPEC section 3), host and device, bit-exact: every
// step is one IEEE float32 operation in a fixed order, so any two implementations that
// call these functions produce the same bytes.
//
// A block is read through a stride so the same code quantizes K token-wise (blocks along
// channels, stride 1) and V channel-wise (blocks along tokens, stride = row length).
// Codes come out unpacked, one E2M1 nibble per byte; packing is the caller's layout.
#pragma once

#include <cstdint>

#include "fp4kv/core/host_device.h"
#include "fp4kv/core/minifloat.h"

namespace fp4kv {

inline constexpr int kNvfp4Block = 16;
inline constexpr int kMxfp4Block = 32;
// g = amax / (6 * 448): the largest block then gets the largest E4M3 scale.
inline constexpr float kNvfp4GlobalDivisor = 2688.0f;

// Largest finite |x| over n values read with a stride; non-finite values are skipped and
// counted (when `nonfinite` is given).
FP4KV_HD float finite_amax(const float* x, int n, int stride, int* nonfinite = nullptr) {
  float amax = 0.0f;
  for (int i = 0; i < n; ++i) {
    const float v = x[i * stride];
    if (!is_finite(v)) {
      if (nonfinite) ++*nonfinite;
      continue;
    }
    amax = max_f(amax, abs_f(v));
  }
  return amax;
}

// NVFP4 global (second-level) scale of a slice with finite amax: amax / 2688, and 1 when
// that is zero (an all-zero slice, or an amax so small that the quotient underflows).
FP4KV_HD float nvfp4_global_scale(float amax) {
  const float g = div_rn(amax, kNvfp4GlobalDivisor);
  return g > 0.0f ? g : 1.0f;
}

namespace detail {

FP4KV_HD float finite_or_zero(float v) { return is_finite(v) ? v : 0.0f; }

}  // namespace detail

// E2M1 code of one MXFP4 element under inv = 2^-e, e the block exponent: a block's codes
// one at a time (the GPU query quantizer streams blocks through it).
FP4KV_HD uint8_t mxfp4_element_code(float x, float inv) { return e2m1_encode(mul_rn(detail::finite_or_zero(x), inv)); }

namespace detail {

// Codes of one NVFP4 block for the element scale sg = decode(s) * g; returns the sum of
// squared errors. sg == 0 means an all-zero block.
template <int B>
FP4KV_HD float nvfp4_encode_block(const float* x, int stride, float sg, uint8_t* codes) {
  float err = 0.0f;
FP4KV_UNROLL
  for (int i = 0; i < B; ++i) {
    const float xi = finite_or_zero(x[i * stride]);
    const uint8_t c = sg > 0.0f ? e2m1_encode(div_rn(xi, sg)) : uint8_t(0);
    codes[i] = c;
    const float e = sub_rn(mul_rn(e2m1_value(c), sg), xi);
    err = add_rn(err, mul_rn(e, e));
  }
  return err;
}

template <int B>
FP4KV_HD float mxfp4_encode_block(const float* x, int stride, int e, uint8_t* codes) {
  const float inv = pow2f(-e), scale = pow2f(e);
  float err = 0.0f;
FP4KV_UNROLL
  for (int i = 0; i < B; ++i) {
    const float xi = finite_or_zero(x[i * stride]);
    const uint8_t c = mxfp4_element_code(xi, inv);
    codes[i] = c;
    const float v = mul_rn(e2m1_value(c), scale);
    const float d = sub_rn(v, xi);
    err = add_rn(err, mul_rn(d, d));
  }
  return err;
}

}  // namespace detail

// E4M3 block scale for a block maximum under rule kappa (6 standard, 4 the search
// alternative, 2 the underflow-aware P rule): s = E4M3(amax_b / (kappa * g)).
FP4KV_HD uint8_t nvfp4_block_scale(float amax_b, float kappa, float g) {
  return e4m3_encode(div_rn(amax_b, mul_rn(kappa, g)));
}

// Quantize one NVFP4 block (16 values at stride `stride`) under global scale g (> 0,
// finite). With `search`, also tries kappa = 4 and keeps it only on strictly lower error.
// Writes 16 codes and returns the E4M3 scale code. Non-finite inputs become code 0 and
// are counted in *nonfinite.
FP4KV_HD uint8_t nvfp4_quantize_block(const float* x, int stride, float g, bool search, uint8_t* codes,
                                      int* nonfinite = nullptr, float kappa = 6.0f) {
  const float amax = finite_amax(x, kNvfp4Block, stride, nonfinite);
  uint8_t s = nvfp4_block_scale(amax, kappa, g);
  const float err = detail::nvfp4_encode_block<kNvfp4Block>(x, stride, mul_rn(e4m3_value(s), g), codes);
  if (search) {
    uint8_t alt_codes[kNvfp4Block];
    const uint8_t s4 = nvfp4_block_scale(amax, 4.0f, g);
    const float err4 = detail::nvfp4_encode_block<kNvfp4Block>(x, stride, mul_rn(e4m3_value(s4), g), alt_codes);
    if (err4 < err) {
      s = s4;
FP4KV_UNROLL
      for (int i = 0; i < kNvfp4Block; ++i) codes[i] = alt_codes[i];
    }
  }
  return s;
}

// OCP shared exponent: floor(log2(amax)) - 2, clamped to [-127, 127]; 0 for amax == 0.
FP4KV_HD int mxfp4_ocp_exponent(float amax) {
  if (!(amax > 0.0f)) return 0;
  int e = floor_log2(amax) - 2;
  return e < -127 ? -127 : (e > 127 ? 127 : e);
}

// Quantize one MXFP4 block (32 values at stride `stride`). With `search`, also tries
// e_ocp + 1 and keeps it only on strictly lower error. Writes 32 codes and returns the
// E8M0 scale code. An all-zero block gets code 127 (2^0) and zero codes.
FP4KV_HD uint8_t mxfp4_quantize_block(const float* x, int stride, bool search, uint8_t* codes,
                                      int* nonfinite = nullptr) {
  const float amax = finite_amax(x, kMxfp4Block, stride, nonfinite);
  int e = mxfp4_ocp_exponent(amax);
  const float err = detail::mxfp4_encode_block<kMxfp4Block>(x, stride, e, codes);
  if (search && amax > 0.0f && e < 127) {
    uint8_t alt_codes[kMxfp4Block];
    const float err1 = detail::mxfp4_encode_block<kMxfp4Block>(x, stride, e + 1, alt_codes);
    if (err1 < err) {
      ++e;
FP4KV_UNROLL
      for (int i = 0; i < kMxfp4Block; ++i) codes[i] = alt_codes[i];
    }
  }
  return uint8_t(e + kE8M0Bias);
}

// Dequantized element values.
FP4KV_HD float nvfp4_value(uint8_t code, uint8_t scale, float g) { return mul_rn(e2m1_value(code), mul_rn(e4m3_value(scale), g)); }
FP4KV_HD float mxfp4_value(uint8_t code, uint8_t scale) { return mul_rn(e2m1_value(code), e8m0_value(scale)); }

// ---- FP8 (E4M3 with one FP32 scale per slice: the `fp8` baseline) -----------------------
// scale = amax / 448 (1 when that is zero); element = E4M3(x / scale).
FP4KV_HD float fp8_slice_scale(float amax) {
  const float s = div_rn(amax, kE4M3Max);
  return s > 0.0f ? s : 1.0f;
}
FP4KV_HD uint8_t fp8_encode(float x, float scale) {
  return is_finite(x) ? e4m3_encode(div_rn(x, scale)) : uint8_t(0);
}
FP4KV_HD float fp8_value(uint8_t code, float scale) { return mul_rn(e4m3_value(code), scale); }

}  // namespace fp4kv
