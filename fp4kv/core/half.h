// Host twins of the GPU's 16-bit float conversions (round to nearest even), so that the
// CPU reference rounds Q, P and the BF16 cache exactly as __float2half_rn /
// __float2bfloat16_rn do on the device.
#pragma once

#include <cstdint>

#include "fp4kv/core/host_device.h"
#include "fp4kv/core/minifloat.h"

namespace fp4kv {

inline uint16_t float_to_bf16_bits(float f) {
  const uint32_t u = float_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40u);  // quiet NaN
  return uint16_t((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
inline float bf16_bits_to_float(uint16_t h) { return bits_float(uint32_t(h) << 16); }
inline float round_bf16(float f) { return bf16_bits_to_float(float_to_bf16_bits(f)); }

inline uint16_t float_to_fp16_bits(float f) {
  const uint32_t x = float_bits(f);
  const uint16_t sign = uint16_t((x >> 16) & 0x8000u);
  const uint32_t ax = x & 0x7fffffffu;
  if (ax > 0x7f800000u) return uint16_t(sign | 0x7e00u);  // NaN
  if (ax >= 0x477ff000u) return uint16_t(sign | 0x7c00u);  // >= 65520 rounds to infinity
  if (ax < 0x38800000u) {                                   // below 2^-14: subnormal grid 2^-24
    return uint16_t(sign | round_half_even(mul_rn(bits_float(ax), 16777216.0f)));
  }
  uint32_t h = (((ax >> 23) - 112u) << 10) | ((ax >> 13) & 0x3ffu);
  const uint32_t rem = ax & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;
  return uint16_t(sign | h);
}

inline float fp16_bits_to_float(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  const uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  if (e == 0) return bits_float(sign) + (sign ? -1.0f : 1.0f) * float(m) * pow2f(-24);
  if (e == 31) return bits_float(sign | 0x7f800000u | (m << 13));
  return bits_float(sign | ((e + 112u) << 23) | (m << 13));
}
inline float round_fp16(float f) { return fp16_bits_to_float(float_to_fp16_bits(f)); }

}  // namespace fp4kv
