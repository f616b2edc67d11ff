// The CPU sampler (ref/sampling.h) against the rule of core/sampling_rule.h: greedy ties,
// top-k ties, the nucleus cut, the softmax frequencies, the prefix search. The GPU sampler
// is compared with this one in tests/ops.
#include "fp4kv/ref/sampling.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <vector>

#include "fp4kv/core/error.h"
#include "fp4kv/core/host_device.h"
#include "fp4kv/core/sampling_rule.h"

namespace fp4kv::ref {
namespace {

SamplingRow sampled(float t, int k, float p, uint64_t seed, uint64_t step = 0) {
  SamplingRow r;
  r.temperature = t;
  r.top_k = k;
  r.top_p = p;
  r.seed = seed;
  r.request_id = 7;
  r.step = step;
  return r;
}

TEST(Sampling, GreedyTakesTheLowestIndexOfTies) {
  const std::vector<float> logits = {1, 5, 2, 5, NAN};
  EXPECT_EQ(sample_token(logits.data(), 5, sampled(0.0f, 0, 1.0f, 0)), 1);
}

TEST(Sampling, TopOneIsGreedyAndTiesInTopKGoToTheLowerIndex) {
  const std::vector<float> logits = {0, 3, 1, 3, 2};
  for (uint64_t seed = 0; seed < 50; ++seed) {
    EXPECT_EQ(sample_token(logits.data(), 5, sampled(1.0f, 1, 1.0f, seed)), 1);
    const int32_t t = sample_token(logits.data(), 5, sampled(1.0f, 2, 1.0f, seed));
    EXPECT_TRUE(t == 1 || t == 3) << t;
  }
}

TEST(Sampling, NucleusKeepsTheShortestPrefixReachingTopP) {
  // Probabilities ~ (0.5, 0.3, 0.2) (logits log p): top_p 0.5 keeps token 0 only, top_p 0.7
  // keeps tokens 0 and 1, never 2.
  const std::vector<float> logits = {std::log(0.5f), std::log(0.3f), std::log(0.2f)};
  std::map<int, int> seen;
  for (uint64_t seed = 0; seed < 400; ++seed) {
    EXPECT_EQ(sample_token(logits.data(), 3, sampled(1.0f, 0, 0.5f, seed)), 0);
    ++seen[sample_token(logits.data(), 3, sampled(1.0f, 0, 0.7f, seed))];
  }
  EXPECT_EQ(seen.count(2), 0u);
  EXPECT_GT(seen[1], 100);  // ~ 0.3 / 0.8 of 400
  EXPECT_LT(seen[1], 200);
}

TEST(Sampling, FrequenciesFollowTheSoftmax) {
  const std::vector<float> logits = {0.0f, std::log(3.0f)};  // p = (0.25, 0.75)
  int ones = 0;
  constexpr int kDraws = 4000;
  for (int s = 0; s < kDraws; ++s) ones += sample_token(logits.data(), 2, sampled(1.0f, 0, 1.0f, 99, uint64_t(s)));
  EXPECT_NEAR(double(ones) / kDraws, 0.75, 0.03);  // ~4.4 standard deviations
}

TEST(Sampling, ShortestPrefixFindsTheKthToken) {
  // Weights (as a count condition): the prefix of length 3 in (w desc, index asc) order.
  const std::vector<float> w = {0.5f, 1.0f, 0.5f, 0.25f, 0.5f};
  struct CountAtLeast {
    const std::vector<float>& w;
    int k;
    bool operator()(Prefix p) const {
      int n = 0;
      for (int i = 0; i < int(w.size()); ++i) n += in_prefix(float_bits(w[size_t(i)]), i, p);
      return n >= k;
    }
  };
  EXPECT_EQ(shortest_prefix(5, CountAtLeast{w, 1}).index, 1);
  EXPECT_EQ(shortest_prefix(5, CountAtLeast{w, 2}).index, 0);
  EXPECT_EQ(shortest_prefix(5, CountAtLeast{w, 3}).index, 2);
  EXPECT_EQ(shortest_prefix(5, CountAtLeast{w, 4}).index, 4);
  EXPECT_EQ(shortest_prefix(5, CountAtLeast{w, 5}).index, 3);
}

TEST(Sampling, UserParametersAreChecked) {
  SamplingRow p;
  EXPECT_NO_THROW(check_sampling(p));
  p.temperature = -1.0f;
  EXPECT_THROW(check_sampling(p), Error);
  p = SamplingRow{};
  p.temperature = NAN;
  EXPECT_THROW(check_sampling(p), Error);
  p = SamplingRow{};
  p.top_k = -2;
  EXPECT_THROW(check_sampling(p), Error);
  for (float top_p : {0.0f, -0.5f, 1.5f}) {
    p = SamplingRow{};
    p.top_p = top_p;
    EXPECT_THROW(check_sampling(p), Error) << top_p;
  }
}

}  // namespace
}  // namespace fp4kv::ref
