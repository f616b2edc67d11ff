// Qwen3-MoE sparse MLP block on the CPU (moe.h).
#include "fp4kv/model/moe.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>

#include "fp4kv/core/error.h"
#include "fp4kv/model/mlp.h"

namespace fp4kv::model {

namespace {

// One token's routing: softmax over `logits`, the top_k indices by decreasing probability
// (stable: equal probabilities keep index order), their probabilities (renormalized on request).
void route_one(const float* logits, int num_experts, int top_k, bool normalize, int* experts, float* weights) {
  const float m = *std::max_element(logits, logits + num_experts);
  std::vector<float> p(static_cast<size_t>(num_experts));
  double sum = 0;
  for (int e = 0; e < num_experts; ++e) sum += (p[size_t(e)] = std::exp(logits[e] - m));
  const float inv = float(1.0 / sum);
  for (float& x : p) x *= inv;
  std::vector<int> order(static_cast<size_t>(num_experts));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return p[size_t(a)] > p[size_t(b)]; });
  float kept = 0;
  for (int j = 0; j < top_k; ++j) {
    experts[j] = order[size_t(j)];
    weights[j] = p[size_t(order[size_t(j)])];
    kept += weights[j];
  }
  if (normalize) {
    for (int j = 0; j < top_k; ++j) weights[j] /= kept;
  }
}

}  // namespace

MoeRouting route_tokens(const float* router_logits, int tokens, int num_experts, int top_k, bool normalize_top_k) {
  require(num_experts >= 1 && top_k >= 1 && top_k <= num_experts,
          "MoE routing: top_k " + std::to_string(top_k) + " outside [1, " + std::to_string(num_experts) + "] experts");
  require(tokens >= 0, "MoE routing: negative token count");
  MoeRouting r;
  r.top_k = top_k;
  r.experts.resize(size_t(tokens) * top_k);
  r.weights.resize(r.experts.size());
  for (int t = 0; t < tokens; ++t) {
    const float* row = router_logits + size_t(t) * num_experts;
    for (int e = 0; e < num_experts; ++e) {
      if (!std::isfinite(row[e]))
        throw Error("MoE routing: token " + std::to_string(t) + " has a non-finite router logit for expert " +
                    std::to_string(e));
    }
    route_one(row, num_experts, top_k, normalize_top_k, r.experts.data() + size_t(t) * top_k,
              r.weights.data() + size_t(t) * top_k);
  }
  return r;
}

void moe_mlp(const MoeWeights& w, const float* x, int tokens, float* out) {
  moe_mlp_experts(w, 0, w.num_experts, x, tokens, out);
}

void moe_mlp_experts(const MoeWeights& w, int first, int count, const float* x, int tokens, float* out) {
  require(w.router && w.gate_up && w.down, "MoE block: a weight pointer is null");
  require(first >= 0 && count >= 0 && first + count <= w.num_experts,
          "MoE block: experts [" + std::to_string(first) + ", " + std::to_string(first + count) + ") outside [0, " +
              std::to_string(w.num_experts) + ")");
  require(w.hidden > 0 && w.intermediate > 0, "MoE block: hidden and intermediate sizes must be positive");
  require(tokens >= 0, "MoE block: negative token count");
  const int E = w.num_experts, H = w.hidden, I = w.intermediate, k = w.top_k;
  std::fill(out, out + size_t(tokens) * H, 0.0f);
  if (tokens == 0) return;
  std::vector<float> logits(size_t(tokens) * E);
  linear(x, w.router, tokens, E, H, logits.data());
  const MoeRouting r = route_tokens(logits.data(), tokens, E, k, w.normalize_top_k);

  // Per expert, the tokens routed to it (ascending) and their weights.
  std::vector<std::vector<int>> rows(static_cast<size_t>(E));
  std::vector<std::vector<float>> row_weights(static_cast<size_t>(E));
  for (int t = 0; t < tokens; ++t) {
    for (int j = 0; j < k; ++j) {
      const size_t s = size_t(t) * k + j;
      rows[size_t(r.experts[s])].push_back(t);
      row_weights[size_t(r.experts[s])].push_back(r.weights[s]);
    }
  }
  std::vector<float> xe, y;
  for (int e = first; e < first + count; ++e) {  // ascending expert order: each token's sum in transformers' order
    const std::vector<int>& ts = rows[size_t(e)];
    if (ts.empty()) continue;
    const int n = int(ts.size());
    xe.resize(size_t(n) * H);
    for (int i = 0; i < n; ++i) std::copy_n(x + size_t(ts[size_t(i)]) * H, H, xe.data() + size_t(i) * H);
    y.resize(size_t(n) * H);
    const size_t held = size_t(e - first);
    swiglu_mlp(xe.data(), n, H, I, w.gate_up + held * 2 * I * H, w.down + held * H * I, y.data());
    for (int i = 0; i < n; ++i) {
      float* o = out + size_t(ts[size_t(i)]) * H;
      const float* yi = y.data() + size_t(i) * H;
      const float wt = row_weights[size_t(e)][size_t(i)];
      for (int c = 0; c < H; ++c) o[c] += yi[c] * wt;
    }
  }
}

}  // namespace fp4kv::model
