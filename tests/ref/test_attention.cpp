// The reference decoder: exact attention, and quantized attention with quantization off,
// split plans, layouts and bad input.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <string>
#include <limits>

#include "fp4kv/core/error.h"
#include "fp4kv/ref/attention.h"
#include "synthetic.h"

namespace fp4kv::ref {
namespace {

double rel_error(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += double(a[i] - b[i]) * (a[i] - b[i]);
    den += double(b[i]) * b[i];
  }
  return std::sqrt(num / den);
}

double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, double(std::fabs(a[i] - b[i])));
  return m;
}

TEST(ExactAttention, MatchesAHandComputedCase) {
  // Two keys, d = 1: weights softmax([1*2, 1*(-1)]) with scale 1.
  const float q[1] = {1.0f}, k[2] = {2.0f, -1.0f}, v[2] = {10.0f, 20.0f};
  const AttentionOutput o = exact_attention(q, 1, k, v, 2, 1);
  const double w0 = std::exp(2.0) / (std::exp(2.0) + std::exp(-1.0));
  EXPECT_NEAR(o.out[0], 10 * w0 + 20 * (1 - w0), 1e-5);
  EXPECT_NEAR(o.lse[0], std::log(std::exp(2.0) + std::exp(-1.0)), 1e-6);
}

// With every quantization off, the decoder is exact attention: for every length (sink,
// page, page + 1, ...), with and without the key transform.
TEST(QuantizedAttention, QuantizationOffEqualsExact) {
  Recipe transform = parse_recipe("fp32");
  transform.smooth_keys = transform.rotate_keys = true;
  for (const Recipe& r : {parse_recipe("fp32"), transform}) {
    for (int n : {1, 15, 16, 17, 127, 128, 129, 300}) {
      const auto s = test::make_synthetic(n, 128, 4, unsigned(n), 2.0f);
      const AttentionOutput e = exact_attention(s.q.data(), 4, s.k.data(), s.v.data(), n, 128);
      const AttentionOutput got = decode_attention(s.q.data(), 4, s.k.data(), s.v.data(), n, 128, r, s.mu.data());
      EXPECT_LT(rel_error(got.out, e.out), 1e-6) << r.name << " n=" << n;
      EXPECT_LT(max_abs_diff(got.lse, e.lse), 1e-5) << r.name << " n=" << n;
    }
  }
}

TEST(QuantizedAttention, Bf16CacheIsCloseToExact) {
  const auto s = test::make_synthetic(700, 128, 2, 3, 2.0f);
  const AttentionOutput e = exact_attention(s.q.data(), 2, s.k.data(), s.v.data(), 700, 128);
  const AttentionOutput b = decode_attention(s.q.data(), 2, s.k.data(), s.v.data(), 700, 128, parse_recipe("bf16"));
  EXPECT_LT(rel_error(b.out, e.out), 5e-3);
  EXPECT_GT(rel_error(b.out, e.out), 1e-6);  // BF16 rounding is really applied
}

// fp8qp: a mixed preset's Q and P in E4M3 (Q with its head's amax / 448 scale, P as
// E4M3(p x 2^8) x 2^-8) on the quantized pages. Against the same cache read with FP16
// operands the output moves by the operands' rounding: E4M3 keeps 3 mantissa bits (relative
// error <= 2^-4 per element), and the errors of 128 channels and hundreds of probabilities
// largely average out: ~4 % on this synthetic data with the rotation (nvfp4, mxfp4), ~10 %
// without it (fp8: an outlier channel sets the head's scale and the others keep fewer
// bits). The bound 0.2 sits far below what a wrong scale or a missing token does (O(1)).
// On BF16 tokens both run the same exact float math: a sequence short enough to live in
// the BF16 rows gives the same bits.
TEST(QuantizedAttention, Fp8QueryAndProbabilitiesStayNearTheMixedPreset) {
  const auto s = test::make_synthetic(1000, 128, 4, 5, 2.0f);
  const AttentionOutput e = exact_attention(s.q.data(), 4, s.k.data(), s.v.data(), 1000, 128);
  auto run = [&](const std::string& name) {
    return decode_attention(s.q.data(), 4, s.k.data(), s.v.data(), 1000, 128, parse_recipe(name), s.mu.data());
  };
  for (const std::string base : {"nvfp4", "mxfp4", "fp8"}) {
    const AttentionOutput mixed = run(base), fp8qp = run(base + ":fp8qp");
    const double moved = rel_error(fp8qp.out, mixed.out);
    std::printf("%-6s output rel. error against exact %.3g, with fp8qp %.3g; fp8qp against %s: %.3g\n",
                base.c_str(), rel_error(mixed.out, e.out), rel_error(fp8qp.out, e.out), base.c_str(), moved);
    EXPECT_GT(moved, 1e-4) << base << ": the E4M3 operands are really applied";
    EXPECT_LT(moved, 0.2) << base;
  }
  const auto short_seq = test::make_synthetic(100, 128, 4, 6, 2.0f);  // BF16 sink + recent rows only
  const auto a = decode_attention(short_seq.q.data(), 4, short_seq.k.data(), short_seq.v.data(), 100, 128,
                                  parse_recipe("nvfp4"), short_seq.mu.data());
  const auto b = decode_attention(short_seq.q.data(), 4, short_seq.k.data(), short_seq.v.data(), 100, 128,
                                  parse_recipe("nvfp4:fp8qp"), short_seq.mu.data());
  EXPECT_EQ(a.out, b.out);
}

// The split plan changes only where the running maximum resets: mixed mode stays within
// FP16 rounding of P, and every plan covers the same keys.
TEST(QuantizedAttention, SplitPlansAgree) {
  const int n = 128 * 9 + 40;
  const auto s = test::make_synthetic(n, 128, 4, 11, 2.0f);
  for (const char* name : {"nvfp4", "mxfp4", "fp8", "nvfp4-native", "mxfp4-native"}) {
    const Recipe r = parse_recipe(name);
    const int pages = decode_layout(n, true, r.bf16_sink, r.bf16_recent).quant_pages;
    const AttentionOutput one = decode_attention(s.q.data(), 4, s.k.data(), s.v.data(), n, 128, r, s.mu.data());
    const AttentionOutput three =
        decode_attention(s.q.data(), 4, s.k.data(), s.v.data(), n, 128, r, s.mu.data(), {0, 3, 4, pages});
    // Native P is quantized relative to the split's running maximum, so another plan gives
    // another rounding of P: a difference of the size of the P quantization error itself.
    const double tol = r.native() ? 0.15 : 2e-3;
    EXPECT_LT(rel_error(three.out, one.out), tol) << name;
    EXPECT_LT(max_abs_diff(three.lse, one.lse), tol) << name;
  }
}

TEST(QuantizedAttention, SmoothingShiftIsRestoredInTheLse) {
  const int n = 1000;
  const auto s = test::make_synthetic(n, 128, 4, 5, 1.0f);
  const AttentionOutput e = exact_attention(s.q.data(), 4, s.k.data(), s.v.data(), n, 128);
  const AttentionOutput got =
      decode_attention(s.q.data(), 4, s.k.data(), s.v.data(), n, 128, parse_recipe("nvfp4"), s.mu.data());
  EXPECT_LT(max_abs_diff(got.lse, e.lse), 0.05);
}

TEST(QuantizedAttention, HeadSequenceViewsFollowTheDecodeLayout) {
  const int n = 300;
  const auto s = test::make_synthetic(n, 64, 1, 6);
  const HeadSequence seq(s.k.data(), s.v.data(), n, 64, parse_recipe("nvfp4"), s.mu.data());
  EXPECT_EQ(seq.pages().size(), 2u);
  HeadSequence::View v;
  seq.view(129, v);
  EXPECT_EQ(v.view.pages.size(), 1u);
  EXPECT_EQ(v.view.layout.bf16_tokens(), 17);
  EXPECT_EQ(v.bf16_k.size(), 17u * 64);
  seq.view(256, v);
  EXPECT_EQ(v.view.pages.size(), 1u);  // page 1 is promoted only after token 255's step
  EXPECT_EQ(v.view.layout.bf16_tokens(), 16 + 128);

  const HeadSequence all(s.k.data(), s.v.data(), n, 64, parse_recipe("nvfp4-vanilla:no-recent"));
  all.view(130, v);
  ASSERT_EQ(v.view.pages.size(), 2u);
  EXPECT_EQ(v.view.pages[1]->tokens, 2);  // the unfinished page, quantized as it stands
  EXPECT_EQ(v.view.layout.bf16_tokens(), 0);
}

TEST(QuantizedAttention, NonFiniteQueryElementsDoNotPoison) {
  auto s = test::make_synthetic(200, 128, 2, 7);
  s.q[3] = std::numeric_limits<float>::quiet_NaN();
  s.q[130] = std::numeric_limits<float>::infinity();
  for (const char* name : {"nvfp4", "nvfp4-native", "mxfp4-native", "bf16"}) {
    const AttentionOutput o = decode_attention(s.q.data(), 2, s.k.data(), s.v.data(), 200, 128, parse_recipe(name),
                                               s.mu.data());
    for (float x : o.out) ASSERT_TRUE(std::isfinite(x)) << name;
  }
}

TEST(QuantizedAttention, BadInputIsAClearError) {
  const auto s = test::make_synthetic(300, 128, 2, 8);
  const Recipe r = parse_recipe("nvfp4");
  auto message = [](auto&& f) {
    try {
      f();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  // head_dim 96 is not a power of two: no Hadamard transform.
  EXPECT_NE(message([&] { decode_attention(s.q.data(), 1, s.k.data(), s.v.data(), 10, 96, r); }).find("Hadamard"),
            std::string::npos);
  EXPECT_NE(message([&] { decode_attention(s.q.data(), 1, s.k.data(), s.v.data(), 0, 128, r); }).find("empty"),
            std::string::npos);
  EXPECT_NE(message([&] {
              decode_attention(s.q.data(), 1, s.k.data(), s.v.data(), 300, 128, r, nullptr, {0, 5});
            }).find("split bounds"),
            std::string::npos);
  EXPECT_NE(message([&] { exact_attention(s.q.data(), 1, s.k.data(), s.v.data(), 0, 128); }).find("empty"),
            std::string::npos);
}

}  // namespace
}  // namespace fp4kv::ref
