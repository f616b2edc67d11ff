// Error analysis of the recipe on given Q/K/V (paper Eq. 2, Table 6, Figure 4): where the
// logit error comes from (key term vs query term), how the FP4 probability blocks fare,
// and how far the attention output lands from exact attention.
#pragma once

#include "fp4kv/core/recipe.h"
#include "fp4kv/ref/attention.h"

namespace fp4kv::ref {

// Mean squared logit error over heads x keys, in natural logit units (q.k / sqrt(d)),
// split as q~.k~ - q.k = q~.dk (key term) + dq.k (query term) in the transformed space.
// Every key is quantized as its cache page would be (the BF16 sink/recent are ignored:
// this measures the formats).
struct LogitError {
  double total = 0.0;
  double key_term = 0.0;
  double query_term = 0.0;
  double query_share() const { return total > 0.0 ? query_term / total : 0.0; }
};
LogitError logit_error(const float* q, int G, const float* k, int n, int d, const Recipe& recipe,
                       const float* mu_k = nullptr);

// Attention output of the decode step that sees all n keys against exact attention.
struct OutputError {
  double relative_error = 0.0;  // ||o - o_exact|| / ||o_exact|| over all G heads
  double max_lse_error = 0.0;   // max |lse - lse_exact| (natural log)
  PBlockStats p_blocks;         // native mode: FP4 probability blocks
  double zero_scale_fraction() const {
    return p_blocks.blocks ? double(p_blocks.zero_scale_blocks) / double(p_blocks.blocks) : 0.0;
  }
};
OutputError output_error(const float* q, int G, const float* k, const float* v, int n, int d, const Recipe& recipe,
                         const float* mu_k = nullptr, const SplitBounds& bounds = {});

}  // namespace fp4kv::ref
