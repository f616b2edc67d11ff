// Scalar codecs of the microscaling formats (SPEC section 3), host and device, bit-exact:
// E2M1 elements, E4M3 (OCP E4M3FN) and E8M0 scales, and the FP4 nibble packing.
#pragma once

#include <cstdint>

#include "fp4kv/core/host_device.h"

namespace fp4kv {

// Round a float holding a small non-negative value (exact in float) to the nearest
// integer, ties to even. Independent of the floating-point environment.
FP4KV_HD int round_half_even(float m) {
  const int i = int(m);
  const float frac = sub_rn(m, float(i));
  if (frac > 0.5f) return i + 1;
  if (frac == 0.5f) return i + (i & 1);
  return i;
}

// ---- E2M1: s e1 e0 m; magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6 ----------------------------
inline constexpr float kE2M1Max = 6.0f;

// Decoded value of a 4-bit code (the high bits of `code` are ignored). Code 0x8 is -0.
FP4KV_HD float e2m1_value(uint8_t code) {
  const uint32_t m = code & 7u;
  const uint32_t sign = uint32_t(code & 8u) << 28;
  if (m == 0) return bits_float(sign);
  if (m == 1) return bits_float(sign | 0x3f000000u);  // 0.5
  // m = 2..7: (1 + 0.5 * (m & 1)) * 2^((m >> 1) - 1)
  return bits_float(sign | (((m >> 1) + 126u) << 23) | ((m & 1u) << 22));
}

// Nearest E2M1 code, ties to the even code, saturating at 6. The sign is copied from the
// input (a small negative value gives 0x8). NaN gives 0 (callers count non-finite input).
FP4KV_HD uint8_t e2m1_encode(float x) {
  const uint8_t sign = uint8_t((float_bits(x) >> 28) & 8u);
  const float a = abs_f(x);
  if (!(a == a)) return 0;
  uint8_t m;
  if (a <= 0.25f) m = 0;
  else if (a < 0.75f) m = 1;
  else if (a <= 1.25f) m = 2;
  else if (a < 1.75f) m = 3;
  else if (a <= 2.5f) m = 4;
  else if (a < 3.5f) m = 5;
  else if (a <= 5.0f) m = 6;
  else m = 7;
  return uint8_t(sign | m);
}

// Element 2i goes to the low nibble of byte i, element 2i+1 to the high nibble.
FP4KV_HD uint8_t pack_e2m1(uint8_t even, uint8_t odd) { return uint8_t((even & 0xF) | ((odd & 0xF) << 4)); }
FP4KV_HD uint8_t unpack_e2m1(uint8_t byte, int index) { return uint8_t((byte >> (4 * (index & 1))) & 0xF); }

// ---- E4M3 (OCP E4M3FN): bias 7, subnormals to 2^-9, max 448, 0x7F/0xFF NaN, no inf ----
inline constexpr float kE4M3Max = 448.0f;
inline constexpr uint8_t kE4M3NaN = 0x7F;

FP4KV_HD float e4m3_value(uint8_t code) {
  const uint32_t e = (code >> 3) & 0xFu, m = code & 7u;
  const float sign = (code & 0x80u) ? -1.0f : 1.0f;
  if (e == 0xFu && m == 7u) return bits_float(0x7fc00000u);
  if (e == 0) return mul_rn(sign, mul_rn(float(m), pow2f(-9)));
  return mul_rn(sign, mul_rn(float(8u + m), pow2f(int(e) - 10)));
}

// Round to nearest even, saturating to +-448 (infinities included); NaN gives 0x7F.
FP4KV_HD uint8_t e4m3_encode(float x) {
  const uint8_t sign = uint8_t((float_bits(x) >> 24) & 0x80u);
  const float a = abs_f(x);
  if (!(a == a)) return kE4M3NaN;
  if (a >= kE4M3Max) return uint8_t(sign | 0x7E);
  if (a < 0.015625f) {  // below 2^-6: subnormal grid of 2^-9 (8 rounds up to the first normal)
    return uint8_t(sign | round_half_even(mul_rn(a, 512.0f)));
  }
  int e = floor_log2(a);  // -6 .. 8
  int m = round_half_even(mul_rn(a, pow2f(3 - e)));  // 8 .. 16
  if (m == 16) {
    m = 8;
    ++e;
  }
  return uint8_t(sign | ((e + 7) << 3) | (m - 8));
}

// ---- E8M0: 2^(e - 127), e in 0..254, 255 NaN ------------------------------------------
inline constexpr uint8_t kE8M0NaN = 0xFF;
inline constexpr int kE8M0Bias = 127;

FP4KV_HD float e8m0_value(uint8_t code) {
  if (code == kE8M0NaN) return bits_float(0x7fc00000u);
  return pow2f(int(code) - kE8M0Bias);
}

}  // namespace fp4kv
