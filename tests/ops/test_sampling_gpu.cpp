// GPU sampling against the CPU twin: the same token for the same inputs, over random
// logits, many seeds and steps, several (temperature, top_k, top_p), vocab sizes from 1
// to Qwen3's 151936.
#include <gtest/gtest.h>

#include <random>

#include "fp4kv/ops/reference.h"
#include "fp4kv/ref/sampling.h"
#include "fp4kv/ops/sampling.h"
#include "ops_test_util.h"

namespace fp4kv::ops::test {
namespace {

struct Params {
  float t;
  int k;
  float p;
};

void check_rows(int vocab, int rows, float logit_std, const Params& pr, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, logit_std);
  std::vector<float> logits(size_t(rows) * vocab);
  for (auto& x : logits) x = dist(rng);
  if (vocab > 4) logits[3] = logits[1];  // a tie
  std::vector<SamplingRow> params(static_cast<size_t>(rows));
  for (int r = 0; r < rows; ++r) {
    params[size_t(r)] = SamplingRow{pr.t, pr.k, pr.p, 0, seed * 31ull + uint64_t(r), uint64_t(r) * 1000003ull,
                                    uint64_t(r % 5)};
  }
  const Sampler sampler(rows, vocab);
  DeviceBuffer<float> d_logits(logits);
  DeviceBuffer<SamplingRow> d_params(params);
  DeviceBuffer<int32_t> d_tokens(static_cast<size_t>(rows));
  sampler.run(d_logits.get(), rows, d_params.get(), d_tokens.get(), nullptr);
  const auto tokens = d_tokens.download();
  for (int r = 0; r < rows; ++r) {
    ASSERT_EQ(tokens[size_t(r)], ref::sample_token(logits.data() + size_t(r) * vocab, vocab, params[size_t(r)]))
        << "vocab " << vocab << " row " << r << " T " << pr.t << " k " << pr.k << " p " << pr.p;
  }
}

TEST(SamplingGpu, SameTokenAsTwin) {
  SKIP_WITHOUT_GPU();
  const Params settings[] = {{0.0f, 0, 1.0f}, {1.0f, 0, 1.0f}, {0.7f, 50, 0.9f}, {1.3f, 0, 0.95f},
                             {0.5f, 1, 1.0f}, {1.0f, 5, 1.0f},  {2.0f, 1000, 0.5f}, {1.0f, 0, 0.0f}};
  uint32_t seed = 1;
  for (const Params& p : settings) {
    for (int vocab : {1, 2, 17, 1023, 1025, 5000}) check_rows(vocab, 24, 3.0f, p, seed++);
  }
}

TEST(SamplingGpu, SameTokenAsTwinAtQwen3Vocab) {
  SKIP_WITHOUT_GPU();
  check_rows(151936, 4, 4.0f, Params{0.0f, 0, 1.0f}, 91);
  check_rows(151936, 4, 4.0f, Params{0.8f, 20, 0.95f}, 92);
  check_rows(151936, 3, 2.0f, Params{1.0f, 0, 0.9f}, 93);
}

TEST(SamplingGpu, RejectsBadRows) {
  SKIP_WITHOUT_GPU();
  const Sampler s(2, 10);
  DeviceBuffer<float> l(20);
  DeviceBuffer<SamplingRow> p(2);
  DeviceBuffer<int32_t> t(2);
  EXPECT_THROW(s.run(l.get(), 3, p.get(), t.get(), nullptr), Error);
}

}  // namespace
}  // namespace fp4kv::ops::test
