// The CPU twins on their own: hand-checkable cases that pin each rule (rounding points,
// error flags, the sampling rule's top-k / top-p / tie behaviour), independent of the GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <random>
#include <vector>

#include "fp4kv/core/half.h"
#include "fp4kv/ops/common.h"
#include "fp4kv/core/hd_math.h"
#include "fp4kv/model/moe.h"
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

TEST(Twins, EmbeddingShardZeroesIdsOutsideIt) {
  const std::vector<uint16_t> shard = bits_of({3, 4});  // vocab 3, hidden 2: the shard holds id 1
  int32_t flags = 0;
  const auto out = ref_embedding_gather({2, 1, 0, 3}, shard, 3, 2, &flags, 1, 1);
  EXPECT_EQ(flags, kErrorTokenOutOfRange);
  EXPECT_EQ(out, bits_of({0, 0, 3, 4, 0, 0, 0, 0}));
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

// The MoE twins against the float32 block the CPU runner runs (model/moe.h) on the same BF16
// inputs: the same experts (random logits have no near-ties at this spread), weights equal to
// within BF16 rounding, and outputs within the BF16 roundings of g, u, act, y, the terms and
// the sums (a few ulps of the output scale; 3 % of the row's largest value is far above them
// and far below a wrong expert or a wrong weight).
TEST(Twins, MoeTwinsAgreeWithTheFloat32Block) {
  const int rows = 6, E = 16, k = 4, H = 32, I = 24;
  std::mt19937 rng(4);
  std::normal_distribution<float> n(0.0f, 1.0f);
  auto bf16_values = [&](size_t count, float scale) {
    std::vector<float> v(count);
    for (float& x : v) x = round_bf16(scale * n(rng));
    return v;
  };
  const auto router = bf16_values(size_t(E) * H, 4.0f / std::sqrt(float(H)));
  const auto gate_up = bf16_values(size_t(E) * 2 * I * H, 1.0f / std::sqrt(float(H)));
  const auto down = bf16_values(size_t(E) * H * I, 1.0f / std::sqrt(float(I)));
  const auto x = bf16_values(size_t(rows) * H, 1.0f);
  model::MoeWeights w{router.data(), gate_up.data(), down.data(), E, k, H, I, true};
  std::vector<float> want(size_t(rows) * H);
  model::moe_mlp(w, x.data(), rows, want.data());

  std::vector<uint16_t> logits(size_t(rows) * E);  // the BF16 router GEMM's output
  for (int r = 0; r < rows; ++r)
    for (int e = 0; e < E; ++e) {
      double l = 0;
      for (int i = 0; i < H; ++i) l += double(x[size_t(r) * H + i]) * router[size_t(e) * H + i];
      logits[size_t(r) * E + e] = float_to_bf16_bits(float(l));
    }
  const MoeRouteReference route = ref_moe_route(logits, rows, E, k, true);
  std::vector<float> float_logits(logits.size());
  for (size_t i = 0; i < logits.size(); ++i) float_logits[i] = bf16_bits_to_float(logits[i]);
  const model::MoeRouting exact = model::route_tokens(float_logits.data(), rows, E, k, true);
  for (int r = 0; r < rows; ++r) {
    std::vector<int> a(route.experts.begin() + r * k, route.experts.begin() + (r + 1) * k);
    std::vector<int> b(exact.experts.begin() + r * k, exact.experts.begin() + (r + 1) * k);
    std::sort(b.begin(), b.end());
    EXPECT_EQ(a, b) << "row " << r;
  }
  const auto act = ref_moe_experts(bits_of(x), bits_of(gate_up), route.experts, rows, k, H, I).act;
  const auto out = ref_moe_combine(act, bits_of(down), route.experts, route.weights, rows, k, H, I).out;
  for (int r = 0; r < rows; ++r) {
    float scale = 0;
    for (int h = 0; h < H; ++h) scale = std::max(scale, std::fabs(want[size_t(r) * H + h]));
    for (int h = 0; h < H; ++h) {
      const size_t i = size_t(r) * H + h;
      EXPECT_NEAR(bf16_bits_to_float(out[i]), want[i], 0.03f * scale) << "row " << r << " h " << h;
    }
  }
}

}  // namespace
}  // namespace fp4kv::ops
