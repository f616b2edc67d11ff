// E2M1 codes as E4M3 bytes (core/fp4_as_fp8.h): every code's byte is its value times 2^-6
// exactly (signed zeros included), the word-wide form equals the per-code one on every
// 16-bit input, and every product of two codes is exact in float.
#include "fp4kv/core/fp4_as_fp8.h"

#include <gtest/gtest.h>

#include <cmath>

#include "fp4kv/core/minifloat.h"

namespace fp4kv {
namespace {

TEST(Fp4AsFp8, EveryCodeIsItsValueTimesTwoToTheMinusSix) {
  for (uint8_t c = 0; c < 16; ++c) {
    const float want = std::ldexp(e2m1_value(c), kFp4AsFp8Exponent);
    const float got = e4m3_value(e2m1_as_e4m3(c));
    EXPECT_EQ(got, want) << int(c);
    EXPECT_EQ(std::signbit(got), std::signbit(e2m1_value(c))) << int(c);  // -0 stays -0
  }
  EXPECT_EQ(e2m1_as_e4m3(0x7), 0x1C);  // 6 -> 0 0011 100 = 2^-4 * 1.5 = 6 / 64
  EXPECT_EQ(e2m1_as_e4m3(0xF), 0x9C);
}

TEST(Fp4AsFp8, WordFormEqualsPerCodeOnEveryInput) {
  for (uint32_t w = 0; w < (1u << 16); ++w) {
    const uint32_t got = e2m1x4_as_e4m3x4(w);
    for (int i = 0; i < 4; ++i) {
      const uint8_t want = e2m1_as_e4m3(uint8_t((w >> (4 * i)) & 0xF));
      ASSERT_EQ(uint8_t(got >> (8 * i)), want) << w << " nibble " << i;
    }
  }
  EXPECT_EQ(e2m1x4_as_e4m3x4(0xFFFF0000u), 0u);  // only the low four nibbles are read
}

TEST(Fp4AsFp8, ProductsOfTwoCodesAreExactInFloat) {
  for (uint8_t a = 0; a < 16; ++a)
    for (uint8_t b = 0; b < 16; ++b) {
      const float pa = e4m3_value(e2m1_as_e4m3(a)), pb = e4m3_value(e2m1_as_e4m3(b));
      const double exact = double(e2m1_value(a)) * double(e2m1_value(b)) * std::ldexp(1.0, 2 * kFp4AsFp8Exponent);
      EXPECT_EQ(double(pa * pb), exact) << int(a) << " " << int(b);
    }
}

}  // namespace
}  // namespace fp4kv
