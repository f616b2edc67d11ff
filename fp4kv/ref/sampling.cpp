// The CPU sampler (sampling.h): the rule of core/sampling_rule.h with the GPU kernel's
// summation order and prefix search, step for step.
#include "fp4kv/ref/sampling.h"

#include <cmath>
#include <string>
#include <vector>

#include "fp4kv/core/error.h"
#include "fp4kv/core/hd_math.h"
#include "fp4kv/core/host_device.h"

namespace fp4kv::ref {
namespace {

// The fixed sum of sampling.h over partials[kSampleThreads]: a tree within each warp, then
// the same tree over the warp results.
float fixed_tree_sum(std::vector<float>& partials) {
  float warp_results[kSampleThreads / kSampleWarp];
  for (int w = 0; w < kSampleThreads / kSampleWarp; ++w) {
    float* p = partials.data() + size_t(w) * kSampleWarp;
    for (int off = kSampleWarp / 2; off > 0; off /= 2)
      for (int l = 0; l < off; ++l) p[l] = p[l] + p[l + off];
    warp_results[w] = p[0];
  }
  for (int off = kSampleWarp / 2; off > 0; off /= 2)
    for (int l = 0; l < off; ++l) warp_results[l] = warp_results[l] + warp_results[l + off];
  return warp_results[0];
}

struct TwinRow {
  const std::vector<float>& weights;
  int vocab;
};

float twin_fixed_sum(const TwinRow& row, Prefix c, Prefix p) {
  std::vector<float> partials(kSampleThreads, 0.0f);
  for (int t = 0; t < kSampleThreads; ++t) {
    float acc = 0.0f;
    for (int i = t; i < row.vocab; i += kSampleThreads) {
      const uint32_t b = float_bits(row.weights[size_t(i)]);
      if (in_prefix(b, i, c) && in_prefix(b, i, p)) acc = acc + row.weights[size_t(i)];
    }
    partials[size_t(t)] = acc;
  }
  return fixed_tree_sum(partials);
}

struct TwinTopK {
  const TwinRow& row;
  int k;
  bool operator()(Prefix p) const {
    int n = 0;
    for (int i = 0; i < row.vocab; ++i) n += in_prefix(float_bits(row.weights[size_t(i)]), i, p);
    return n >= k;
  }
};
struct TwinMassAtLeast {
  const TwinRow& row;
  Prefix within;
  float goal;
  bool operator()(Prefix p) const {
    const float s = twin_fixed_sum(row, within, p);
    return s > 0.0f && s >= goal;
  }
};
struct TwinMassAbove {
  const TwinRow& row;
  Prefix within;
  float target;
  bool operator()(Prefix p) const { return twin_fixed_sum(row, within, p) > target; }
};

int greedy_index(const float* logits, int vocab) {
  float best = -std::numeric_limits<float>::infinity();
  int best_i = -1;
  for (int i = 0; i < vocab; ++i) {
    if (logits[i] > best) {
      best = logits[i];
      best_i = i;
    }
  }
  return best_i < 0 ? 0 : best_i;
}

}  // namespace

int32_t sample_token(const float* logits, int vocab, const SamplingRow& p) {
  require(vocab >= 1, "sampling: empty vocabulary");
  const int greedy = greedy_index(logits, vocab);
  if (!(p.temperature > 0.0f)) return greedy;
  const float m = logits[greedy] / p.temperature;
  std::vector<float> weights(static_cast<size_t>(vocab));
  for (int i = 0; i < vocab; ++i) weights[size_t(i)] = exp_nonpositive(logits[i] / p.temperature - m);
  const TwinRow row{weights, vocab};
  Prefix kept = all_tokens(vocab);
  if (uses_top_k(p, vocab)) kept = shortest_prefix(vocab, TwinTopK{row, p.top_k});
  if (uses_top_p(p)) {
    const float goal = p.top_p * twin_fixed_sum(row, kept, all_tokens(vocab));
    kept = shortest_prefix(vocab, TwinMassAtLeast{row, kept, goal});
  }
  const float total = twin_fixed_sum(row, kept, all_tokens(vocab));
  const float target = sampling_uniform(p) * total;
  return shortest_prefix(vocab, TwinMassAbove{row, kept, target}).index;
}

void check_sampling(const SamplingRow& p) {
  require(std::isfinite(p.temperature) && p.temperature >= 0.0f,
          "sampling: temperature must be a finite number >= 0 (0: greedy), got " + std::to_string(p.temperature));
  require(p.top_k >= 0, "sampling: top_k must be >= 0 (0: no top-k cut), got " + std::to_string(p.top_k));
  require(p.top_p > 0.0f && p.top_p <= 1.0f, "sampling: top_p must be in (0, 1] (1: no nucleus), got " +
                                                   std::to_string(p.top_p));
}

}  // namespace fp4kv::ref
