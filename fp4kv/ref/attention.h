// CPU reference of decode attention for one KV head group (G query heads) at one decode
// step: (a) exact attention in double, the ground truth; (b) quantized attention with the
// semantics of Algorithm 1 for every recipe (the oracle of the GPU decode kernels).
#pragma once

#include <cstdint>
#include <vector>

#include "fp4kv/core/decode_layout.h"
#include "fp4kv/core/recipe.h"
#include "fp4kv/ref/quant_page.h"

namespace fp4kv::ref {

struct AttentionOutput {
  std::vector<float> out;  // [G][d]
  std::vector<float> lse;  // [G] natural-log log-sum-exp of the logits q.k / sqrt(d)
};

// Ground truth: softmax(q k^T / sqrt(d)) v in double over n keys. q [G][d], k/v [n][d].
AttentionOutput exact_attention(const float* q, int G, const float* k, const float* v, int n, int d);

// What one decode step of one (request, KV head) attends to, as stored: quantized pages
// (K transformed) and BF16 tokens (transformed K and V, already rounded to BF16; exact
// floats for the fp32 recipe).
struct HeadCacheView {
  int d = 0;
  DecodeLayout layout;
  std::vector<const QuantPage*> pages;  // layout.quant_pages pages, in order
  const float* bf16_k = nullptr;        // [layout.bf16_tokens()][d]: sink first, then recent
  const float* bf16_v = nullptr;
  // mu_k the keys were smoothed with (or null): softmax ignores the shift q.mu_k of every
  // logit, but the returned LSE adds it back so it is the LSE of the true logits.
  const float* mu_k = nullptr;
};

// How the quantized pages are split across CTAs: split s covers pages
// [bounds[s], bounds[s+1]). The BF16 tokens are always one extra split. Empty = one split.
using SplitBounds = std::vector<int>;

// Statistics of the FP4 probability blocks (native mode), for the error analysis.
struct PBlockStats {
  long blocks = 0;             // blocks with at least one attended key
  long zero_scale_blocks = 0;  // ... whose block scale rounded to zero (all of P lost)
  std::vector<long> pmax_log2_hist = std::vector<long>(41, 0);  // max(p_b) in [2^-(i+1), 2^-i), i < 40; last: below
};

// Quantizes one tile's probabilities (128 keys of one head, masked keys 0) as the P.V
// product sees them (FP16 in mixed mode; FP4 blocks in native mode, dequantized), and
// returns the factor the tile's P.V partial is multiplied by (two-level scaling, else 1).
float quantize_tile_probs(const float* p, const Recipe& recipe, float* pq, PBlockStats* stats = nullptr);

// Quantized decode attention (Algorithm 1). q: [G][d] post-RoPE queries (not transformed:
// the recipe's rotation is applied here). Tiles are pages in order; each split keeps its
// own running maximum, and splits are merged by log-sum-exp.
AttentionOutput quantized_attention(const float* q, int G, const HeadCacheView& view, const Recipe& recipe,
                                    const SplitBounds& bounds = {}, PBlockStats* stats = nullptr);

// CPU twin of one KV head's cache over a whole sequence: transformed keys, BF16 copies and
// every promoted page, from which the view of any decode step can be formed.
class HeadSequence {
 public:
  // k, v: [n][d] post-RoPE keys and values; mu_k: [d] or null (zero).
  HeadSequence(const float* k, const float* v, int n, int d, const Recipe& recipe, const float* mu_k = nullptr);

  struct View {
    HeadCacheView view;
    std::vector<float> bf16_k, bf16_v;  // gathered BF16 rows
    QuantPage partial;                  // the unfinished page when BF16 recent is off
  };
  // The view of the decode step that attends to the first n_tokens tokens.
  // (View is returned by unique storage so the internal pointers stay valid.)
  void view(int n_tokens, View& out) const;

  int d() const { return d_; }
  int size() const { return n_; }
  const Recipe& recipe() const { return recipe_; }
  const std::vector<float>& transformed_keys() const { return k_t_; }
  const std::vector<float>& values() const { return v_; }
  const std::vector<float>& bf16_keys() const { return k_bf16_; }    // as stored in the BF16 slot
  const std::vector<float>& bf16_values() const { return v_bf16_; }
  const float* mu_k() const { return mu_.empty() ? nullptr : mu_.data(); }
  const std::vector<QuantPage>& pages() const { return pages_; }
  long nonfinite() const { return nonfinite_; }

 private:
  int n_, d_;
  Recipe recipe_;
  std::vector<float> k_t_, v_;           // transformed keys and values, float (as given)
  std::vector<float> k_bf16_, v_bf16_;   // as stored in the BF16 slot
  std::vector<QuantPage> pages_;         // full pages, quantized from the BF16 copies
  std::vector<float> mu_;                // empty when not smoothing
  long nonfinite_ = 0;
};

// Convenience: quantized attention of G queries at the decode step that sees all n keys.
AttentionOutput decode_attention(const float* q, int G, const float* k, const float* v, int n, int d,
                                 const Recipe& recipe, const float* mu_k = nullptr, const SplitBounds& bounds = {},
                                 PBlockStats* stats = nullptr);

// The query as the Q.K product sees it, per head, for the error analysis: the effective
// (dequantized) vector in the transformed space. q: [G][d] post-RoPE.
std::vector<float> effective_query(const float* q, int G, int d, const Recipe& recipe);

}  // namespace fp4kv::ref
