#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "fp4kv/core/hadamard.h"
#include "fp4kv/core/transform.h"

namespace fp4kv {
namespace {

class HadamardTest : public ::testing::TestWithParam<int> {};

TEST_P(HadamardTest, OrthonormalAndSelfInverse) {
  const int d = GetParam();
  ASSERT_TRUE(hadamard_supported(d));
  // Rows of H are H applied to unit vectors (H is symmetric).
  std::vector<float> h(size_t(d) * d, 0.0f);
  for (int i = 0; i < d; ++i) {
    h[size_t(i) * d + i] = 1.0f;
    fwht_inplace(&h[size_t(i) * d], d);
  }
  double worst = 0;
  for (int i = 0; i < d; ++i)
    for (int j = 0; j < d; ++j) {
      double dot = 0;
      for (int k = 0; k < d; ++k) dot += double(h[size_t(i) * d + k]) * h[size_t(j) * d + k];
      worst = std::max(worst, std::fabs(dot - (i == j ? 1.0 : 0.0)));
      // Sylvester: H[i][j] = (-1)^popcount(i & j) / sqrt(d)
      const double want = (__builtin_popcount(unsigned(i & j)) % 2 ? -1.0 : 1.0) / std::sqrt(double(d));
      ASSERT_NEAR(h[size_t(i) * d + j], want, 1e-7);
    }
  EXPECT_LT(worst, 1e-6);

  std::mt19937 rng(d);
  std::normal_distribution<float> nd;
  std::vector<float> x(d), y;
  for (auto& v : x) v = nd(rng);
  y = x;
  fwht_inplace(y.data(), d);
  fwht_inplace(y.data(), d);
  for (int i = 0; i < d; ++i) EXPECT_NEAR(y[i], x[i], 1e-6 * std::max(1.0f, std::fabs(x[i])));
}

INSTANTIATE_TEST_SUITE_P(AllSupported, HadamardTest, ::testing::Values(64, 128, 256, 512));

TEST(Hadamard, UnsupportedSizes) {
  for (int d : {0, 1, 32, 96, 100, 1024}) EXPECT_FALSE(hadamard_supported(d)) << d;
}

TEST(Transform, PreservesInnerProductUpToTheMeanShift) {
  const int d = 128;
  std::mt19937 rng(1);
  std::normal_distribution<float> nd;
  std::vector<float> q(d), k(d), mu(d), qt(d), kt(d);
  for (int i = 0; i < d; ++i) {
    q[i] = nd(rng);
    k[i] = nd(rng) + 3.0f;
    mu[i] = 3.0f + 0.1f * nd(rng);
  }
  transform_query(q.data(), d, true, qt.data());
  transform_key(k.data(), mu.data(), d, true, true, kt.data());
  double a = 0, b = 0;
  for (int i = 0; i < d; ++i) {
    a += double(qt[i]) * kt[i];
    b += double(q[i]) * (k[i] - mu[i]);
  }
  EXPECT_NEAR(a, b, 1e-4);
}

TEST(Transform, Log2eOverSqrtDTable) {
  for (int d : {64, 128, 256, 512}) EXPECT_EQ(log2e_over_sqrt_d(d), log2e_over_sqrt_d_any(d)) << d;
  EXPECT_EQ(log2e_over_sqrt_d_any(128), float(1.4426950408889634 / std::sqrt(128.0)));
}

}  // namespace
}  // namespace fp4kv
