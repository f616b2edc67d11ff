// The fast whole-window attention equals the reference decoder called per query.
#include <gtest/gtest.h>

#include <cmath>

#include "fp4kv/eval/window_attention.h"
#include "synthetic.h"

namespace fp4kv::eval {
namespace {

TEST(WindowAttention, EqualsTheReferencePerQuery) {
  const int d = 128, G = 4;
  for (const char* name : {"fp32", "bf16", "fp8", "nvfp4-vanilla", "nvfp4", "nvfp4-native", "nvfp4-vanilla-native",
                           "mxfp4", "mxfp4-native", "nvfp4-native:no-sink", "nvfp4-native:no-recent", "fp8:no-recent",
                           "nvfp4-native:no-sink,no-recent", "nvfp4-native:twolevel",
                           "nvfp4-native:smoothq"}) {
    const Recipe r = parse_recipe(name);
    for (int n : {1, 17, 128, 129, 300}) {
      const int nq = std::min(n, 150);  // the last nq positions are queries
      const auto s = test::make_synthetic(n, d, G, unsigned(n) * 7 + 1, 2.0f);
      // Queries for every position: [G][nq][d].
      std::vector<float> q(size_t(G) * nq * d);
      std::mt19937 rng(n);
      std::normal_distribution<float> nd(0.0f, 0.15f);
      for (auto& x : q) x = nd(rng);
      std::vector<float> out(q.size());
      window_attention(q.data(), G, nq, s.k.data(), s.v.data(), n, d, r, s.mu.data(), out.data());
      const ref::HeadSequence seq(s.k.data(), s.v.data(), n, d, r, s.mu.data());
      double worst = 0;
      for (int i = 0; i < nq; ++i) {
        const int pos = n - nq + i;
        ref::HeadSequence::View view;
        seq.view(pos + 1, view);
        std::vector<float> qi(size_t(G) * d);
        for (int h = 0; h < G; ++h) std::copy_n(&q[(size_t(h) * nq + i) * d], d, &qi[size_t(h) * d]);
        const auto want = ref::quantized_attention(qi.data(), G, view.view, r);
        double num = 0, den = 0;
        for (int h = 0; h < G; ++h)
          for (int c = 0; c < d; ++c) {
            const double a = out[(size_t(h) * nq + i) * d + c], b = want.out[size_t(h) * d + c];
            num += (a - b) * (a - b);
            den += b * b;
          }
        worst = std::max(worst, std::sqrt(num / den));
      }
      // Float summation order only; in native mode an exp2 or dot-product rounding
      // difference can flip the FP4 rounding of a P or Q element now and then.
      EXPECT_LT(worst, r.native() ? 2e-2 : 1e-4) << name << " n=" << n;
    }
  }
}

}  // namespace
}  // namespace fp4kv::eval
