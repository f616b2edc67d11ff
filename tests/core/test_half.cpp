// The host twins of the GPU's 16-bit conversions, against an exhaustive oracle: every
// FP16/BF16 value decodes exactly, and rounding picks the nearest, ties to even.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>

#include "fp4kv/core/half.h"

namespace fp4kv {
namespace {

double fp16_first_principles(uint16_t h) {
  const int s = h >> 15, e = (h >> 10) & 31, m = h & 1023;
  if (e == 31) return m ? std::numeric_limits<double>::quiet_NaN() : (s ? -INFINITY : INFINITY);
  const double mag = e == 0 ? std::ldexp(double(m), -24) : std::ldexp(1.0 + m / 1024.0, e - 15);
  return s ? -mag : mag;
}

TEST(Half, Fp16DecodesEveryCode) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const double want = fp16_first_principles(uint16_t(h));
    const float got = fp16_bits_to_float(uint16_t(h));
    if (std::isnan(want)) ASSERT_TRUE(std::isnan(got));
    else ASSERT_EQ(double(got), want) << h;
  }
}

TEST(Half, Fp16RoundTripAndRoundingBoundaries) {
  for (uint32_t h = 0; h < 0x7c00; ++h) {
    const float v = fp16_bits_to_float(uint16_t(h));
    ASSERT_EQ(float_to_fp16_bits(v), h);
    ASSERT_EQ(float_to_fp16_bits(-v), h | 0x8000u);
    if (h + 1 < 0x7c00) {
      const float next = fp16_bits_to_float(uint16_t(h + 1));
      const float mid = float(0.5 * (double(v) + double(next)));  // exact in float
      ASSERT_EQ(float_to_fp16_bits(mid), (h & 1) ? h + 1 : h) << h;  // tie to even
      ASSERT_EQ(float_to_fp16_bits(std::nextafter(mid, 0.0f)), h) << h;
      ASSERT_EQ(float_to_fp16_bits(std::nextafter(mid, 1e9f)), h + 1) << h;
    }
  }
  EXPECT_EQ(float_to_fp16_bits(65504.0f), 0x7bffu);
  EXPECT_EQ(float_to_fp16_bits(65519.0f), 0x7bffu);
  EXPECT_EQ(float_to_fp16_bits(65520.0f), 0x7c00u);
  EXPECT_EQ(float_to_fp16_bits(1e-10f), 0u);
}

TEST(Half, Bf16RoundsToNearestEven) {
  std::mt19937 rng(1);
  for (int i = 0; i < 100000; ++i) {
    const uint32_t u = rng();
    const float x = bits_float(u);
    if (!std::isfinite(x)) continue;
    const float r = round_bf16(x);
    const float lo = bits_float(u & 0xffff0000u), hi = bits_float((u & 0xffff0000u) + 0x10000u);
    if (!std::isfinite(hi)) continue;  // rounding up past the largest BF16: checked below
    const double dl = std::fabs(double(x) - lo), dh = std::fabs(double(x) - hi);
    const float want = dl < dh ? lo : dh < dl ? hi : ((u >> 16) & 1 ? hi : lo);
    ASSERT_EQ(float_bits(r), float_bits(want)) << std::hex << u;
  }
  EXPECT_TRUE(std::isnan(round_bf16(std::numeric_limits<float>::quiet_NaN())));
  EXPECT_EQ(round_bf16(std::numeric_limits<float>::max()), std::numeric_limits<float>::infinity());
  EXPECT_EQ(round_bf16(bits_float(0x7f7f7fffu)), bits_float(0x7f7f0000u));
}

}  // namespace
}  // namespace fp4kv
