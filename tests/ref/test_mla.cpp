// The MLA reference (ref/mla.h): the exact path against GQA attention over the concatenated
// key [c | r]; each recipe against the exact path on synthetic latents with the structure the
// recipe is built for (a non-zero mean, a few outlier channels); the parts of the recipe each
// lowering the error; short sequences (one token, one page, page + 1) through the BF16 rows.
//
// Tolerances: a BF16 latent is a relative error of at most 2^-9 per element, so the bf16
// recipe's output and logits are within ~1e-3 relative (bound 5e-3 below); the FP4 bounds
// are measured margins (x2) of the error table this test prints (docs/ACCURACY.md), and the
// ordering checks compare recipes on the same data.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "fp4kv/core/error.h"
#include "fp4kv/core/recipe.h"
#include "fp4kv/ref/attention.h"
#include "fp4kv/ref/mla.h"

namespace fp4kv::ref {
namespace {

constexpr int kHeads = 16;

struct Latents {
  MlaShape shape;
  int n = 0;
  std::vector<float> c, r, q_c, q_r, mu;  // mu: the sample mean (what calibration measures)
};

// Latents c_t = mean + noise with 8 outlier channels (mean +-10, spread 4); content queries
// of std 1.5 (logit spread ~2.5 at scale 1/sqrt(192)); positional keys and queries N(0, 1).
Latents make_latents(int n, uint32_t seed) {
  Latents s;
  s.n = n;
  const int dc = s.shape.latent_dim, dr = s.shape.rope_dim;
  std::mt19937 rng(seed);
  std::normal_distribution<float> unit(0.0f, 1.0f);
  std::vector<float> mean(dc), spread(dc, 1.0f);
  for (int k = 0; k < dc; ++k) mean[k] = unit(rng);
  for (int o = 0; o < 8; ++o) {
    const int k = (o * 61 + 7) % dc;
    mean[k] = (o % 2 ? -10.0f : 10.0f);
    spread[k] = 4.0f;
  }
  s.c.resize(size_t(n) * dc);
  s.r.resize(size_t(n) * dr);
  for (int t = 0; t < n; ++t) {
    for (int k = 0; k < dc; ++k) s.c[size_t(t) * dc + k] = mean[k] + spread[k] * unit(rng);
    for (int k = 0; k < dr; ++k) s.r[size_t(t) * dr + k] = unit(rng);
  }
  s.q_c.resize(size_t(kHeads) * dc);
  s.q_r.resize(size_t(kHeads) * dr);
  for (float& x : s.q_c) x = 1.5f * unit(rng);
  for (float& x : s.q_r) x = unit(rng);
  s.mu.assign(dc, 0.0f);
  for (int t = 0; t < n; ++t)
    for (int k = 0; k < dc; ++k) s.mu[k] += s.c[size_t(t) * dc + k] / float(n);
  return s;
}

struct MlaError {
  double out_rel = 0;  // ||u - u_exact|| / ||u_exact||, over every head
  double lse_abs = 0;  // max |lse - lse_exact|
};

MlaError error_of(const Latents& s, const std::string& recipe, int n_tokens) {
  const MlaOutput want = exact_mla(s.q_c.data(), s.q_r.data(), kHeads, s.c.data(), s.r.data(), n_tokens, s.shape);
  const MlaSequence seq(s.c.data(), s.r.data(), s.n, s.shape, parse_recipe(recipe), s.mu.data());
  const MlaOutput got = seq.decode(s.q_c.data(), s.q_r.data(), kHeads, n_tokens);
  double num = 0, den = 0;
  MlaError e;
  for (size_t i = 0; i < want.out.size(); ++i) {
    num += std::pow(double(got.out[i]) - want.out[i], 2);
    den += std::pow(double(want.out[i]), 2);
  }
  e.out_rel = std::sqrt(num / den);
  for (int h = 0; h < kHeads; ++h) e.lse_abs = std::max(e.lse_abs, std::fabs(double(got.lse[h]) - want.lse[h]));
  return e;
}

TEST(MlaReference, ExactEqualsGqaAttentionOverTheConcatenatedKey) {
  const Latents s = make_latents(300, 1);
  const int dc = s.shape.latent_dim, dr = s.shape.rope_dim, d = dc + dr;
  // softmax((q_c.c + q_r.r) / sqrt(192)) as attention over k = [c | r] (scale 1/sqrt(576)):
  // q scaled by sqrt(576 / 192); values [c | 0].
  const float up = float(std::sqrt(double(d) / double(s.shape.nope_dim + dr)));
  std::vector<float> q(size_t(kHeads) * d), k(size_t(s.n) * d), v(size_t(s.n) * d, 0.0f);
  for (int h = 0; h < kHeads; ++h)
    for (int i = 0; i < d; ++i) q[size_t(h) * d + i] = up * (i < dc ? s.q_c[size_t(h) * dc + i] : s.q_r[size_t(h) * dr + i - dc]);
  for (int t = 0; t < s.n; ++t)
    for (int i = 0; i < d; ++i) {
      k[size_t(t) * d + i] = i < dc ? s.c[size_t(t) * dc + i] : s.r[size_t(t) * dr + i - dc];
      if (i < dc) v[size_t(t) * d + i] = s.c[size_t(t) * dc + i];
    }
  const AttentionOutput want = exact_attention(q.data(), kHeads, k.data(), v.data(), s.n, d);
  const MlaOutput got = exact_mla(s.q_c.data(), s.q_r.data(), kHeads, s.c.data(), s.r.data(), s.n, s.shape);
  for (int h = 0; h < kHeads; ++h) {
    EXPECT_NEAR(got.lse[h], want.lse[h], 1e-4 * std::fabs(want.lse[h]) + 1e-4);
    for (int i = 0; i < dc; ++i)
      ASSERT_NEAR(got.out[size_t(h) * dc + i], want.out[size_t(h) * d + i], 1e-4 + 1e-5 * std::fabs(want.out[size_t(h) * d + i]));
  }
}

// Every length runs (one token, the sink, one page, page + 1, the last BF16 row, two pages):
// bf16 within BF16 rounding of the latents (the outlier channels near 10 round by up to half
// a BF16 ulp, 0.031, which moves a logit by ~0.01-0.02 through q_c of std 1.5: bound 0.05 on
// the LSE), the FP4 recipes within twice the largest error measured (output 0.067, LSE 0.58).
TEST(MlaReference, EveryLengthRunsAndBf16IsNearExact) {
  const Latents s = make_latents(400, 2);
  for (int n : {1, 16, 17, 128, 129, 143, 144, 145, 256, 257, 400}) {
    for (const char* recipe : {"bf16", "fp8", "nvfp4", "nvfp4-native", "mxfp4-native"}) {
      const MlaError e = error_of(s, recipe, n);
      std::printf("  n %3d %-14s output %.5f  LSE %.5f\n", n, recipe, e.out_rel, e.lse_abs);
      const bool bf16 = std::string(recipe) == "bf16";
      EXPECT_LT(e.out_rel, bf16 ? 5e-3 : 0.15) << recipe << " n " << n;
      EXPECT_LT(e.lse_abs, bf16 ? 0.05 : 1.2) << recipe << " n " << n;
    }
  }
}

// The error table of docs/ACCURACY.md ("MLA on synthetic latents"). Asserted: what holds by a
// clear margin on latents with a mean and outlier channels (bf16 < fp8 < the full FP4
// recipes < the vanilla ones; smoothing and the dual-residual query each matter). The
// rotation is reported, not asserted: after smoothing these outliers sit in single blocks,
// and spreading them over all 512 channels does not pay here.
TEST(MlaReference, ErrorAnalysisOnStructuredLatents) {
  const Latents s = make_latents(2048, 3);
  const char* recipes[] = {"bf16",          "fp8",
                           "nvfp4-vanilla", "nvfp4-vanilla-native",
                           "nvfp4",         "nvfp4-native",
                           "mxfp4-vanilla", "mxfp4-vanilla-native",
                           "mxfp4",         "mxfp4-native",
                           "nvfp4-native:no-dualq", "nvfp4-native:no-smooth",
                           "nvfp4-native:no-rotate", "nvfp4-native:no-search",
                           "nvfp4-native:no-sink", "nvfp4-native:no-recent"};
  std::printf("MLA, %d tokens, %d heads, d_c %d, d_r %d: recipe, output relative error, max |LSE error|\n", s.n,
              kHeads, s.shape.latent_dim, s.shape.rope_dim);
  std::map<std::string, MlaError> e;
  for (const char* r : recipes) {
    e[r] = error_of(s, r, s.n);
    std::printf("  %-26s %.5f  %.5f\n", r, e[r].out_rel, e[r].lse_abs);
  }
  EXPECT_LT(e["bf16"].out_rel, 5e-3);
  EXPECT_LT(e["fp8"].out_rel, e["nvfp4"].out_rel);
  EXPECT_LT(e["nvfp4"].out_rel, e["nvfp4-vanilla"].out_rel);
  EXPECT_LT(e["nvfp4-native"].out_rel, e["nvfp4-vanilla-native"].out_rel);
  EXPECT_LT(e["mxfp4-native"].out_rel, e["mxfp4-vanilla-native"].out_rel);
  for (const char* ablation : {"nvfp4-native:no-dualq", "nvfp4-native:no-smooth"})
    EXPECT_LT(e["nvfp4-native"].out_rel, e[ablation].out_rel) << ablation;
}

TEST(MlaReference, RecipesWithoutAnMlaFormAreRefused) {
  const Latents s = make_latents(8, 4);
  for (const char* r : {"fp32", "nvfp4-native:smoothq", "nvfp4-native:twolevel", "nvfp4:fp8qp"})
    EXPECT_THROW(MlaSequence(s.c.data(), s.r.data(), s.n, s.shape, parse_recipe(r), s.mu.data()), Error) << r;
  const MlaSequence seq(s.c.data(), s.r.data(), s.n, s.shape, parse_recipe("nvfp4"), s.mu.data());
  EXPECT_THROW(seq.decode(s.q_c.data(), s.q_r.data(), kHeads, 9), Error);  // beyond the sequence
  EXPECT_THROW(seq.decode(s.q_c.data(), s.q_r.data(), kHeads, 0), Error);
}

}  // namespace
}  // namespace fp4kv::ref
