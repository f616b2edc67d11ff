// The chunked-prefill attention reference (ref/prefill_attention.h): with no prefix it is
// exact causal attention over BF16 K/V; with a BF16 cache any chunking equals one chunk; a
// one-token chunk is the decode step over the same tokens; and the prefix is read as the
// cache holds it after prefill (full pages quantized, the rest BF16).
//
// Tolerances. Exact parts are double math on the same BF16 values: 1e-5 covers float output
// rounding. A BF16 or quantized prefix goes through quantized_attention, whose mixed-mode
// P (and Q) are FP16 operands: relative errors of 2^-11 per term, so 2e-3 of max|v| (|v| <= 5
// here) holds. A one-token chunk differs from the decode step only by where its key is
// rounded to BF16 (raw here, after the recipe's transform in the decode step): a logit error
// of at most 2^-9 sum_c |q_c k_c| / sqrt(d), a few 1e-3 of the output for keys without outlier
// channels; 2e-2 leaves margin and is far below a wrong page or token (errors of order 1).
#include "fp4kv/ref/prefill_attention.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>

#include "fp4kv/core/error.h"
#include "fp4kv/core/half.h"
#include "synthetic.h"

namespace fp4kv::ref {
namespace {

constexpr int kD = 64, kG = 4;

std::vector<float> chunk_queries(int T, unsigned seed) {
  std::vector<float> q;
  for (int t = 0; t < T; ++t) {
    const test::Synthetic s = test::make_synthetic(1, kD, kG, seed + unsigned(t), 2.0f);
    q.insert(q.end(), s.q.begin(), s.q.end());
  }
  return q;
}

float max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  float m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::fmax(m, std::fabs(a[i] - b[i]));
  return m;
}

TEST(PrefillAttention, WithoutPrefixIsCausalAttentionOverBf16) {
  const test::Synthetic s = test::make_synthetic(40, kD, kG, 3);
  const HeadSequence seq(s.k.data(), s.v.data(), s.n, kD, parse_recipe("nvfp4"), s.mu.data());
  const std::vector<float> q = chunk_queries(40, 100);
  const PrefillChunkOutput got = prefill_chunk_attention(q.data(), 40, kG, seq, s.k.data(), s.v.data(), 0);
  std::vector<float> kb(s.k.size()), vb(s.v.size());
  for (size_t i = 0; i < kb.size(); ++i) kb[i] = round_bf16(s.k[i]), vb[i] = round_bf16(s.v[i]);
  for (int t = 0; t < 40; t += 13) {
    const AttentionOutput want = exact_attention(&q[size_t(t) * kG * kD], kG, kb.data(), vb.data(), t + 1, kD);
    for (int i = 0; i < kG * kD; ++i) EXPECT_NEAR(got.out[size_t(t) * kG * kD + i], want.out[i], 1e-5) << t;
    for (int h = 0; h < kG; ++h) EXPECT_NEAR(got.lse[size_t(t) * kG + h], want.lse[h], 1e-5) << t;
  }
}

// A BF16 cache holds the same values either way: chunks of 1, 100, 128 + 29 ... tokens give the
// one-chunk result.
TEST(PrefillAttention, Bf16CacheChunkingEqualsOneChunk) {
  const int n = 300;
  const test::Synthetic s = test::make_synthetic(n, kD, kG, 5);
  const HeadSequence seq(s.k.data(), s.v.data(), n, kD, parse_recipe("bf16"));
  const std::vector<float> q = chunk_queries(n, 200);
  const PrefillChunkOutput whole = prefill_chunk_attention(q.data(), n, kG, seq, s.k.data(), s.v.data(), 0);
  for (const std::vector<int>& cuts : {std::vector<int>{0, 1, 101, 300}, std::vector<int>{0, 128, 157, 256, 300}}) {
    for (size_t c = 0; c + 1 < cuts.size(); ++c) {
      const int start = cuts[c], T = cuts[c + 1] - cuts[c];
      const PrefillChunkOutput part =
          prefill_chunk_attention(&q[size_t(start) * kG * kD], T, kG, seq, s.k.data(), s.v.data(), start);
      const std::vector<float> want(whole.out.begin() + size_t(start) * kG * kD,
                                    whole.out.begin() + size_t(start + T) * kG * kD);
      EXPECT_LT(max_abs_diff(part.out, want), 2e-3f) << "chunk at " << start;
    }
  }
}

// A one-token chunk is the decode step that attends to the same start + 1 tokens (recipes
// with BF16 recent tokens: without them the decode step reads its new token quantized). The
// keys here have no outlier channels: the chunk rounds its raw key to BF16 and the decode step
// its transformed key, and on outlier channels (|k| ~ 15-25) those roundings alone move a
// logit by ~0.05.
TEST(PrefillAttention, OneTokenChunkIsTheDecodeStep) {
  const int n = 400;
  const test::Synthetic s = test::make_synthetic(n, kD, kG, 7, 1.0f, /*outliers=*/0);
  float worst = 0;
  for (const char* preset : {"nvfp4", "mxfp4", "fp8", "nvfp4-native", "bf16"}) {
    const Recipe r = parse_recipe(preset);
    const HeadSequence seq(s.k.data(), s.v.data(), n, kD, r, s.mu.data());
    for (const int start : {1, 15, 16, 127, 128, 129, 255, 256, 399}) {
      const std::vector<float> q = chunk_queries(1, 300 + unsigned(start));
      const PrefillChunkOutput got = prefill_chunk_attention(q.data(), 1, kG, seq, s.k.data(), s.v.data(), start);
      HeadSequence::View view;
      seq.view(start + 1, view);
      const AttentionOutput want = quantized_attention(q.data(), kG, view.view, r);
      worst = std::fmax(worst, max_abs_diff(got.out, want.out));
      EXPECT_LT(max_abs_diff(got.out, want.out), 2e-2f) << preset << " at " << start;
      EXPECT_LT(max_abs_diff(got.lse, want.lse), 2e-2f) << preset << " at " << start;
    }
  }
  std::printf("one-token chunk vs decode step: largest output difference %.3g\n", worst);
}

// The prefix is read as the cache holds it after prefill: at start = 256 both full pages are
// quantized (a decode view of 256 tokens would still hold page 1 in BF16), so the result
// differs from a BF16 cache's; and the first query of a longer chunk sees exactly what a
// one-token chunk sees (the same prefix, its own token).
TEST(PrefillAttention, PrefixPagesAreQuantizedAfterPrefill) {
  const int n = 300;
  const test::Synthetic s = test::make_synthetic(n, kD, kG, 11);
  const HeadSequence fp4(s.k.data(), s.v.data(), n, kD, parse_recipe("nvfp4"), s.mu.data());
  const HeadSequence bf16(s.k.data(), s.v.data(), n, kD, parse_recipe("bf16"));
  const std::vector<float> q = chunk_queries(8, 400);
  const PrefillChunkOutput a = prefill_chunk_attention(q.data(), 8, kG, fp4, s.k.data(), s.v.data(), 256);
  const PrefillChunkOutput b = prefill_chunk_attention(q.data(), 8, kG, bf16, s.k.data(), s.v.data(), 256);
  EXPECT_GT(max_abs_diff(a.out, b.out), 1e-4f);
  const PrefillChunkOutput one = prefill_chunk_attention(q.data(), 1, kG, fp4, s.k.data(), s.v.data(), 256);
  for (int i = 0; i < kG * kD; ++i) EXPECT_EQ(a.out[size_t(i)], one.out[size_t(i)]) << i;
}

TEST(PrefillAttention, RejectsAChunkOutsideTheSequence) {
  const test::Synthetic s = test::make_synthetic(10, kD, kG, 13);
  const HeadSequence seq(s.k.data(), s.v.data(), 10, kD, parse_recipe("nvfp4"));
  const std::vector<float> q = chunk_queries(4, 500);
  EXPECT_THROW(prefill_chunk_attention(q.data(), 4, kG, seq, s.k.data(), s.v.data(), 7), Error);
  EXPECT_THROW(prefill_chunk_attention(q.data(), 0, kG, seq, s.k.data(), s.v.data(), 0), Error);
}

}  // namespace
}  // namespace fp4kv::ref
