// The CPU page quantizer: K token-wise, V channel-wise along tokens, per-page g.
#include <gtest/gtest.h>

#include <random>

#include "fp4kv/core/block_quant.h"
#include "fp4kv/core/error.h"
#include "fp4kv/ref/quant_page.h"
#include "synthetic.h"

namespace fp4kv::ref {
namespace {

TEST(QuantPage, Nvfp4LayoutAndScales) {
  const auto s = test::make_synthetic(128, 128, 1, 1);
  const Recipe r = parse_recipe("nvfp4");
  const QuantPage p = quantize_page(s.k.data(), s.v.data(), 128, 128, r);
  float kamax = 0, vamax = 0;
  for (size_t i = 0; i < s.k.size(); ++i) {
    kamax = std::max(kamax, std::fabs(s.k[i]));
    vamax = std::max(vamax, std::fabs(s.v[i]));
  }
  EXPECT_EQ(p.k_g, kamax / 2688.0f);
  EXPECT_EQ(p.v_g, vamax / 2688.0f);
  // Token 5, channels 32..47: one K block with search.
  uint8_t codes[16];
  const uint8_t ks = nvfp4_quantize_block(&s.k[5 * 128 + 32], 1, p.k_g, true, codes);
  EXPECT_EQ(p.k_scales[5 * 8 + 2], ks);
  for (int i = 0; i < 16; ++i) EXPECT_EQ(p.k_codes[5 * 128 + 32 + i], codes[i]);
  // Channel 7, tokens 48..63: one V block, no search.
  const uint8_t vs = nvfp4_quantize_block(&s.v[48 * 128 + 7], 128, p.v_g, false, codes);
  EXPECT_EQ(p.v_scales[7 * 8 + 3], vs);
  for (int i = 0; i < 16; ++i) EXPECT_EQ(p.v_codes[7 * 128 + 48 + i], codes[i]);
  // Dequantized values are close.
  double err = 0, ref = 0;
  for (int t = 0; t < 128; ++t)
    for (int c = 0; c < 128; ++c) {
      err += std::pow(p.v_value(t, c) - s.v[t * 128 + c], 2);
      ref += std::pow(s.v[t * 128 + c], 2);
    }
  EXPECT_LT(std::sqrt(err / ref), 0.15);
}

TEST(QuantPage, PartialPageIsZeroPadded) {
  const auto s = test::make_synthetic(50, 64, 1, 2);
  const QuantPage p = quantize_page(s.k.data(), s.v.data(), 50, 64, parse_recipe("mxfp4"));
  EXPECT_EQ(p.tokens, 50);
  for (int t = 50; t < 128; ++t)
    for (int c = 0; c < 64; ++c) {
      EXPECT_EQ(p.k_value(t, c), 0.0f);
      EXPECT_EQ(p.v_value(t, c), 0.0f);
    }
}

TEST(QuantPage, Fp8UsesOneScalePerSlice) {
  const auto s = test::make_synthetic(128, 64, 1, 3);
  const QuantPage p = quantize_page(s.k.data(), s.v.data(), 128, 64, parse_recipe("fp8"));
  float kamax = 0;
  for (float x : s.k) kamax = std::max(kamax, std::fabs(x));
  EXPECT_EQ(p.k_g, kamax / 448.0f);
  EXPECT_EQ(p.k_codes[3 * 64 + 9], e4m3_encode(s.k[3 * 64 + 9] / p.k_g));
}

TEST(QuantPage, BadInput) {
  const auto s = test::make_synthetic(128, 64, 1, 4);
  EXPECT_THROW(quantize_page(s.k.data(), s.v.data(), 0, 64, parse_recipe("nvfp4")), Error);
  EXPECT_THROW(quantize_page(s.k.data(), s.v.data(), 129, 64, parse_recipe("nvfp4")), Error);
  EXPECT_THROW(quantize_page(s.k.data(), s.v.data(), 128, 48, parse_recipe("mxfp4")), Error);
  EXPECT_THROW(quantize_page(s.k.data(), s.v.data(), 128, 64, parse_recipe("bf16")), Error);
}

}  // namespace
}  // namespace fp4kv::ref
