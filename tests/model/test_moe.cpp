// The Qwen3-MoE block's CPU reference (model/moe.h): routing by hand-computed examples, errors,
// and properties of the block (identical experts equal one dense MLP; top_k = every expert
// equals the softmax-weighted sum of all of them).
#include "fp4kv/model/moe.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "fixtures.h"

namespace fp4kv::model {
namespace {

using testing::expect_error;

TEST(MoeRouting, TopKByProbabilityRenormalized) {
  // Probabilities proportional to 1, 2, 3, 4 (sum 10): the top two are experts 3 and 2.
  const std::vector<float> logits = {0.0f, std::log(2.0f), std::log(3.0f), std::log(4.0f)};
  MoeRouting r = route_tokens(logits.data(), 1, 4, 2, /*normalize_top_k=*/false);
  ASSERT_EQ(r.experts, (std::vector<int>{3, 2}));
  EXPECT_NEAR(r.weights[0], 0.4f, 1e-6f);
  EXPECT_NEAR(r.weights[1], 0.3f, 1e-6f);
  r = route_tokens(logits.data(), 1, 4, 2, /*normalize_top_k=*/true);
  EXPECT_NEAR(r.weights[0], 4.0f / 7.0f, 1e-6f);
  EXPECT_NEAR(r.weights[1], 3.0f / 7.0f, 1e-6f);
}

TEST(MoeRouting, TiesKeepIndexOrderAndRowsAreIndependent) {
  const std::vector<float> logits = {1.0f, 1.0f, 1.0f, 1.0f, /*row 1*/ 5.0f, -1.0f, 7.0f, 7.0f};
  const MoeRouting r = route_tokens(logits.data(), 2, 4, 3, /*normalize_top_k=*/true);
  EXPECT_EQ(r.experts, (std::vector<int>{0, 1, 2, /*row 1*/ 2, 3, 0}));
  for (int j = 0; j < 3; ++j) EXPECT_NEAR(r.weights[size_t(j)], 1.0f / 3.0f, 1e-6f);
  EXPECT_NEAR(r.weights[3], r.weights[4], 0.0f);
  EXPECT_NEAR(r.weights[3] + r.weights[4] + r.weights[5], 1.0f, 1e-6f);
}

TEST(MoeRouting, RejectsBadArguments) {
  const std::vector<float> logits = {0.0f, 1.0f, NAN, 2.0f};
  expect_error([&] { route_tokens(logits.data(), 1, 4, 5, true); }, {"top_k 5", "[1, 4]"});
  expect_error([&] { route_tokens(logits.data(), 1, 4, 0, true); }, {"top_k 0"});
  expect_error([&] { route_tokens(logits.data(), 1, 4, 2, true); }, {"token 0", "non-finite", "expert 2"});
}

struct RandomMoe {
  int E, k, H, I;
  std::vector<float> router, gate_up, down;
  MoeWeights weights(bool normalize) const {
    return {router.data(), gate_up.data(), down.data(), E, k, H, I, normalize};
  }
};

RandomMoe random_moe(int E, int k, int H, int I, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> n(0.0f, 1.0f);
  RandomMoe m{E, k, H, I, std::vector<float>(size_t(E) * H), std::vector<float>(size_t(E) * 2 * I * H),
              std::vector<float>(size_t(E) * H * I)};
  for (float& x : m.router) x = n(rng) / std::sqrt(float(H));
  for (float& x : m.gate_up) x = n(rng) / std::sqrt(float(H));
  for (float& x : m.down) x = n(rng) / std::sqrt(float(I));
  return m;
}

// rows x cols standard normal values.
std::vector<float> random_rows(int rows, int cols, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> n(0.0f, 1.0f);
  std::vector<float> x(size_t(rows) * cols);
  for (float& v : x) v = n(rng);
  return x;
}

// One dense SwiGLU MLP of expert e on one row, in double.
std::vector<double> expert_output(const RandomMoe& m, int e, const float* x) {
  std::vector<double> act(size_t(m.I)), y(size_t(m.H), 0.0);
  const float* gu = m.gate_up.data() + size_t(e) * 2 * m.I * m.H;
  for (int c = 0; c < m.I; ++c) {
    double g = 0, u = 0;
    for (int i = 0; i < m.H; ++i) {
      g += double(gu[size_t(c) * m.H + i]) * x[i];
      u += double(gu[size_t(m.I + c) * m.H + i]) * x[i];
    }
    act[size_t(c)] = g / (1.0 + std::exp(-g)) * u;
  }
  const float* dn = m.down.data() + size_t(e) * m.H * m.I;
  for (int o = 0; o < m.H; ++o)
    for (int c = 0; c < m.I; ++c) y[size_t(o)] += double(dn[size_t(o) * m.I + c]) * act[size_t(c)];
  return y;
}

TEST(MoeMlp, EveryExpertChosenIsTheSoftmaxWeightedSum) {
  const RandomMoe m = random_moe(6, 6, 16, 10, 3);
  const int T = 4;
  const std::vector<float> x = random_rows(T, m.H, 9);
  std::vector<float> out(x.size());
  moe_mlp(m.weights(/*normalize=*/false), x.data(), T, out.data());
  for (int t = 0; t < T; ++t) {
    const float* xt = x.data() + size_t(t) * m.H;
    std::vector<double> logit(size_t(m.E)), want(size_t(m.H), 0.0);
    double mx = -1e300, sum = 0;
    for (int e = 0; e < m.E; ++e) {
      for (int i = 0; i < m.H; ++i) logit[size_t(e)] += double(m.router[size_t(e) * m.H + i]) * xt[i];
      mx = std::max(mx, logit[size_t(e)]);
    }
    for (double& l : logit) sum += (l = std::exp(l - mx));
    for (int e = 0; e < m.E; ++e) {
      const auto y = expert_output(m, e, xt);
      for (int i = 0; i < m.H; ++i) want[size_t(i)] += logit[size_t(e)] / sum * y[size_t(i)];
    }
    for (int i = 0; i < m.H; ++i) EXPECT_NEAR(out[size_t(t) * m.H + i], want[size_t(i)], 2e-5) << t << " " << i;
  }
}

TEST(MoeMlp, IdenticalExpertsRenormalizedEqualOneDenseMlp) {
  RandomMoe m = random_moe(8, 3, 12, 20, 5);
  for (int e = 1; e < m.E; ++e) {  // every expert a copy of expert 0
    std::copy_n(m.gate_up.begin(), 2 * m.I * m.H, m.gate_up.begin() + size_t(e) * 2 * m.I * m.H);
    std::copy_n(m.down.begin(), m.H * m.I, m.down.begin() + size_t(e) * m.H * m.I);
  }
  const int T = 7;
  const std::vector<float> x = random_rows(T, m.H, 2);
  std::vector<float> out(x.size());
  moe_mlp(m.weights(/*normalize=*/true), x.data(), T, out.data());
  for (int t = 0; t < T; ++t) {
    const auto want = expert_output(m, 0, x.data() + size_t(t) * m.H);
    for (int i = 0; i < m.H; ++i) EXPECT_NEAR(out[size_t(t) * m.H + i], want[size_t(i)], 2e-5) << t << " " << i;
  }
  std::vector<float> none(1, 5.0f);
  moe_mlp(m.weights(true), x.data(), 0, none.data());  // no tokens: nothing written
  EXPECT_EQ(none[0], 5.0f);
  expect_error([&] { moe_mlp(MoeWeights{}, x.data(), T, out.data()); }, {"null"});
}

}  // namespace
}  // namespace fp4kv::model
