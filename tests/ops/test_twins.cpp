// The CPU twins on their own: hand-checkable cases that pin each rule (rounding points,
// error flags, the sampling rule's top-k / top-p / tie behaviour), independent of the GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <vector>

#include "fp4kv/core/half.h"
#include "fp4kv/ops/common.h"
#include "fp4kv/core/hd_math.h"
#include "fp4kv/ops/reference.h"

namespace fp4kv::ops {
namespace {

std::vector<uint16_t> bits_of(const std::vector<float>& x) {
  std::vector<uint16_t> out;
  for (float v : x) out.push_back(float_to_bf16_bits(v));
  return out;
}

TEST(HdMath, ExpMatchesStdExp) {
  for (float x = -86.9f; x <= 0.0f; x += 0.0137f) {
    const float e = exp_nonpositive(x), ref = std::exp(x);
    EXPECT_NEAR(e, ref, 3e-7f * ref) << x;
  }
  EXPECT_EQ(exp_nonpositive(0.0f), 1.0f);
  EXPECT_EQ(exp_nonpositive(-100.0f), 0.0f);
  EXPECT_EQ(exp_nonpositive(-INFINITY), 0.0f);
}

TEST(HdMath, SiluMatchesDefinition) {
  for (float g = -30.0f; g <= 30.0f; g += 0.071f) {
    const double ref = g / (1.0 + std::exp(-double(g)));
    EXPECT_NEAR(silu(g), ref, 1e-6 * std::fabs(ref) + 1e-30) << g;
  }
}

TEST(Twins, EmbeddingFlagsBadIdsAndZeroesTheirRows) {
  const std::vector<uint16_t> table = bits_of({1, 2, 3, 4, 5, 6});  // vocab 3, hidden 2
  int32_t flags = 0;
  const auto out = ref_embedding_gather({2, -1, 0, 3}, table, 3, 2, &flags);
  EXPECT_EQ(flags, kErrorTokenOutOfRange);
  EXPECT_EQ(out, bits_of({5, 6, 0, 0, 1, 2, 0, 0}));
}

TEST(Twins, RmsNormRoundsAtTheDocumentedPoints) {
  // x = (3, 4): ms = 12.5, r = 1/sqrt(12.5 + eps); h = bf16(x r); y = bf16(w h).
  const float eps = 1e-6f;
  const auto y = ref_rms_norm(bits_of({3, 4}), bits_of({1.5f, -0.75f}), 1, 2, eps);
  const float r = 1.0f / std::sqrt(12.5f + eps);
  EXPECT_EQ(y[0], float_to_bf16_bits(1.5f * round_bf16(3 * r)));
  EXPECT_EQ(y[1], float_to_bf16_bits(-0.75f * round_bf16(4 * r)));
}

TEST(Twins, AddRmsNormStoresTheRoundedSum) {
  std::vector<uint16_t> residual = bits_of({1.0f, 256.0f});
  const auto y = ref_add_rms_norm(residual, bits_of({1.0f / 512, 1.0f}), bits_of({1, 1}), 1, 2, 0.0f);
  EXPECT_EQ(residual, bits_of({1.0f, 256.0f}));  // 1 + 2^-9 and 257 both round back in BF16
  EXPECT_EQ(y, ref_rms_norm(bits_of({1.0f, 256.0f}), bits_of({1, 1}), 1, 2, 0.0f));
}

TEST(Twins, QkNormRopeAtPositionZeroIsTheNormAndFlagsBadPositions) {
  const QkvShape s{2, 1, 1, 4, 1e-6f};
  const std::vector<uint16_t> qkv = bits_of({1, 2, 3, 4, 5, 6, 7, 8, -1, -2, -3, -4,  //
                                             1, 1, 1, 1, 2, 2, 2, 2, 9, 9, 9, 9});
  const std::vector<uint16_t> w = bits_of({1, 1, 1, 1});
  const RopeTable rope = make_rope_table(4, 10000.0, 8);
  const QkvOutputs o = ref_qk_norm_rope(qkv, {0, 8}, w, w, rope, s);
  EXPECT_EQ(o.error_flags, kErrorPositionOutOfRange);
  const std::vector<uint16_t> q_norm = ref_rms_norm(bits_of({1, 2, 3, 4}), w, 1, 4, 1e-6f);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(o.q[size_t(i)], q_norm[size_t(i)]) << i;  // cos 1, sin 0
  for (int i = 0; i < 4; ++i) EXPECT_EQ(o.q[size_t(4 + i)], 0) << "bad position zeroes q";
  EXPECT_EQ(o.v[0], -1.0f);
  EXPECT_EQ(o.v[4], 9.0f);
}

TEST(Twins, SwigluIsSiluTimesUp) {
  const auto out = ref_swiglu(bits_of({0.0f, 2.0f, 3.0f, -1.0f}), 1, 2);
  EXPECT_EQ(out[0], float_to_bf16_bits(0.0f));
  EXPECT_EQ(out[1], float_to_bf16_bits(round_bf16(silu(2.0f)) * -1.0f));
}

}  // namespace
}  // namespace fp4kv::ops
