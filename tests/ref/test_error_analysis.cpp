// The recipe's claims on synthetic keys with channel outliers and a static bias. Each test
// prints the numbers it checks (they go into the closing notes and docs/ACCURACY.md).
#include <gtest/gtest.h>

#include <cstdio>

#include "fp4kv/ref/error_analysis.h"
#include "synthetic.h"

namespace fp4kv::ref {
namespace {

constexpr int kD = 128, kG = 4;

TEST(ErrorAnalysis, KeyTransformLowersLogitError) {
  const auto s = test::make_synthetic(1024, kD, kG, 21, 2.0f);
  for (const char* base : {"nvfp4-native", "mxfp4-native"}) {
    const Recipe full = parse_recipe(base);
    const Recipe plain = parse_recipe(std::string(base) + ":no-smooth,no-rotate");
    const LogitError a = logit_error(s.q.data(), kG, s.k.data(), s.n, kD, full, s.mu.data());
    const LogitError b = logit_error(s.q.data(), kG, s.k.data(), s.n, kD, plain, s.mu.data());
    const LogitError c = logit_error(s.q.data(), kG, s.k.data(), s.n, kD, parse_recipe(std::string(base) + ":no-rotate"),
                                     s.mu.data());
    std::printf("[%s] key term: no transform %.4g, smoothing only %.4g, smoothing + Hadamard %.4g\n", base, b.key_term,
                c.key_term, a.key_term);
    EXPECT_LT(a.key_term, b.key_term) << base;
    EXPECT_LT(c.key_term, b.key_term) << base;
    EXPECT_LT(a.total, b.total) << base;
  }
}

TEST(ErrorAnalysis, DualResidualQueryCutsTheQueryTerm10x) {
  const auto s = test::make_synthetic(1024, kD, kG, 22, 2.0f);
  for (const char* base : {"nvfp4-native", "mxfp4-native"}) {
    const LogitError dual = logit_error(s.q.data(), kG, s.k.data(), s.n, kD, parse_recipe(base), s.mu.data());
    const LogitError single =
        logit_error(s.q.data(), kG, s.k.data(), s.n, kD, parse_recipe(std::string(base) + ":no-dualq"), s.mu.data());
    const LogitError smooth =
        logit_error(s.q.data(), kG, s.k.data(), s.n, kD, parse_recipe(std::string(base) + ":smoothq"), s.mu.data());
    const LogitError mixed = logit_error(s.q.data(), kG, s.k.data(), s.n, kD,
                                         parse_recipe(std::string(base).substr(0, 5)), s.mu.data());
    std::printf("[%s] logit MSE (total / query term / share): single FP4 Q %.4g / %.4g / %.1f%%, "
                "smoothing-Q (GQA mean) %.4g / %.4g / %.1f%%, dual-residual %.4g / %.4g / %.2f%%, 16-bit Q %.4g / %.3g\n",
                base, single.total, single.query_term, 100 * single.query_share(), smooth.total, smooth.query_term,
                100 * smooth.query_share(), dual.total, dual.query_term, 100 * dual.query_share(), mixed.total,
                mixed.query_term);
    EXPECT_LT(dual.query_term * 10.0, single.query_term) << base;
    EXPECT_LT(dual.total, single.total) << base;
    EXPECT_LT(mixed.query_term, dual.query_term) << base;
  }
}

TEST(ErrorAnalysis, UnderflowAwarePScalingKeepsBlocksAlive) {
  // A long softmax with a wide logit spread: most P blocks hold tiny probabilities.
  const auto s = test::make_synthetic(8192 + 16, kD, kG, 23, 3.0f);
  const OutputError aware = output_error(s.q.data(), kG, s.k.data(), s.v.data(), s.n, kD,
                                         parse_recipe("nvfp4-native"), s.mu.data());
  const OutputError max6 = output_error(s.q.data(), kG, s.k.data(), s.v.data(), s.n, kD,
                                        parse_recipe("nvfp4-native:no-pscale"), s.mu.data());
  const OutputError two = output_error(s.q.data(), kG, s.k.data(), s.v.data(), s.n, kD,
                                       parse_recipe("nvfp4-native:twolevel"), s.mu.data());
  std::printf("[P blocks, %ld per config] zero-scale fraction: max/6 %.2f%%, two-level %.2f%%, underflow-aware %.2f%%; "
              "output rel. error: %.4g, %.4g, %.4g\n",
              aware.p_blocks.blocks, 100 * max6.zero_scale_fraction(), 100 * two.zero_scale_fraction(),
              100 * aware.zero_scale_fraction(), max6.relative_error, two.relative_error, aware.relative_error);
  std::printf("[P blocks] max(p_b) histogram, bins [2^-(i+1), 2^-i):");
  for (int i = 0; i < 16; ++i) std::printf(" %ld", aware.p_blocks.pmax_log2_hist[i]);
  std::printf("\n");
  EXPECT_LT(aware.p_blocks.zero_scale_blocks, max6.p_blocks.zero_scale_blocks);
  EXPECT_GT(max6.zero_scale_fraction(), 0.05);  // the test case does exercise underflow
  EXPECT_LT(aware.relative_error, max6.relative_error);
}

TEST(ErrorAnalysis, FullRecipeBeatsVanillaOnOutputError) {
  const auto s = test::make_synthetic(4096 + 50, kD, kG, 24, 2.0f);
  auto err = [&](const char* name) {
    return output_error(s.q.data(), kG, s.k.data(), s.v.data(), s.n, kD, parse_recipe(name), s.mu.data()).relative_error;
  };
  const double fp8 = err("fp8"), vn = err("nvfp4-vanilla"), vnn = err("nvfp4-vanilla-native"), n = err("nvfp4"),
               nn = err("nvfp4-native"), mvn = err("mxfp4-vanilla-native"), m = err("mxfp4"), mn = err("mxfp4-native");
  std::printf("[output rel. error, n=%d] fp8 %.4g | nvfp4-vanilla %.4g, nvfp4-vanilla-native %.4g, nvfp4 %.4g, "
              "nvfp4-native %.4g | mxfp4-vanilla-native %.4g, mxfp4 %.4g, mxfp4-native %.4g\n",
              s.n, fp8, vn, vnn, n, nn, mvn, m, mn);
  EXPECT_LT(nn, vnn);
  EXPECT_LT(mn, mvn);
  EXPECT_LT(n, vn);
  EXPECT_LT(fp8, n);
}

}  // namespace
}  // namespace fp4kv::ref
