// The branch-free probability quantization of core/operand_quant.h (the decode kernel's
// form) against the code path of the CPU reference, on the host. The GPU, where the
// division and the E4M3 rounding take fast paths, is checked exhaustively by
// tests/attention/test_prob_quant.cu.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>

#include "fp4kv/core/operand_quant.h"

namespace fp4kv {
namespace {

uint32_t bits(float x) { return float_bits(x); }

TEST(OperandQuant, E2M1RoundValueEqualsEncodeThenValue) {
  // every float in [2^-3, 8): all E2M1 decision points and their neighbours
  for (uint32_t u = 0x3e000000u; u < 0x41000000u; ++u) {
    const float x = bits_float(u);
    ASSERT_EQ(bits(e2m1_round_value(x)), bits(e2m1_value(e2m1_encode(x)))) << x;
  }
  // zero, tiny, subnormal and large values
  std::mt19937 rng(7);
  for (uint32_t u : {0u, 1u, 0x007fffffu, 0x00800000u, 0x3dffffffu, 0x41000000u, 0x7f7fffffu})
    EXPECT_EQ(bits(e2m1_round_value(bits_float(u))), bits(e2m1_value(e2m1_encode(bits_float(u))))) << u;
  for (int i = 0; i < 1000000; ++i) {
    const float x = bits_float(rng() % 0x7f800000u);
    ASSERT_EQ(bits(e2m1_round_value(x)), bits(e2m1_value(e2m1_encode(x)))) << x;
  }
}

TEST(OperandQuant, ProbValueEqualsCodeTimesScale) {
  // every E4M3 scale; p near each decision point t * s (E2M1 rounding points) and at random
  const float points[] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f};
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> ud(0.0f, 8.0f);
  for (int code = 0; code < 127; ++code) {
    const float s = e4m3_value(uint8_t(code));
    auto check = [&](float p) {
      ASSERT_EQ(bits(nvfp4_prob_value(p, s)), bits(mul_rn(e2m1_value(nvfp4_prob_code(p, s)), s)))
          << "p " << p << " s " << s;
    };
    for (float t : points) {
      const uint32_t c = float_bits(mul_rn(t, s));
      for (uint32_t d = 0; d < 64; ++d) {
        check(bits_float(c + d));
        if (c > d) check(bits_float(c - d));
      }
    }
    for (int i = 0; i < 5000; ++i) check(ud(rng));
    check(0.0f);
  }
}

TEST(OperandQuant, ProbScaleValueEqualsTheEncodedScale) {
  std::mt19937 rng(13);
  for (bool ua : {false, true})
    for (float tau : {21.0f / 1024.0f, e4m3_value(3)})
      for (int i = 0; i < 200000; ++i) {
        const float pmax = bits_float(rng() % 0x43800000u);  // [0, 256)
        ASSERT_EQ(bits(nvfp4_prob_scale_value(pmax, ua, tau)), bits(e4m3_value(nvfp4_prob_scale(pmax, ua, tau))))
            << pmax;
      }
}

}  // namespace
}  // namespace fp4kv
