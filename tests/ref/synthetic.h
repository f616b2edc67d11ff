// Synthetic attention inputs with the structure that makes FP4 KV hard: keys with a static
// per-channel bias and a few large outlier channels, queries whose logits have a chosen
// spread (a wide spread makes a long, mostly tiny softmax).
#pragma once

#include <cmath>
#include <random>
#include <vector>

namespace fp4kv::test {

struct Synthetic {
  int n = 0, d = 0, G = 0;
  std::vector<float> q, k, v, mu;  // q [G][d], k/v [n][d], mu [d] = mean key (the calibration)
};

inline Synthetic make_synthetic(int n, int d, int G, unsigned seed, float logit_std = 1.0f, int outliers = 4) {
  Synthetic s{n, d, G, {}, {}, {}, {}};
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> bias(d), spread(d, 1.0f);
  for (int c = 0; c < d; ++c) bias[c] = 2.0f * nd(rng);
  for (int o = 0; o < outliers; ++o) {
    const int c = int(rng() % unsigned(d));
    bias[c] = (o % 2 ? -1.0f : 1.0f) * 15.0f;
    spread[c] = 5.0f;
  }
  s.k.resize(size_t(n) * d);
  s.v.resize(size_t(n) * d);
  s.mu.assign(d, 0.0f);
  for (int t = 0; t < n; ++t)
    for (int c = 0; c < d; ++c) {
      s.k[size_t(t) * d + c] = bias[c] + spread[c] * nd(rng);
      s.v[size_t(t) * d + c] = nd(rng);
      s.mu[c] += s.k[size_t(t) * d + c] / float(n);
    }
  // Logit spread: q.(k - mu)/sqrt(d) has variance |q|^2 * mean(spread^2) / d per unit q.
  double var = 0;
  for (int c = 0; c < d; ++c) var += spread[c] * spread[c];
  const float scale = logit_std / float(std::sqrt(var / d));
  s.q.resize(size_t(G) * d);
  for (auto& x : s.q) x = scale * nd(rng);
  return s;
}

}  // namespace fp4kv::test
