// Qwen3-MoE's sparse MLP block (transformers' Qwen3MoeSparseMoeBlock) in float32 on the CPU:
// the reference the CPU runner runs and the GPU's router and expert kernels are checked against.
//
// Routing, per token: router logits = x W_router^T; probabilities = softmax over every expert
// (float32); the top_k largest are kept (ties: the lower expert index first), and divided by
// their sum when `normalize_top_k` (the config's norm_topk_prob). The block's output is the
// sum over the chosen experts of weight * down(silu(gate(x)) * up(x)), added in ascending
// expert order (transformers loops over the experts hit, in index order, and index_adds).
//
// Layouts: router [experts][hidden]; gate_up [experts][2 intermediate][hidden] (per expert the
// gate projection's rows, then the up projection's: transformers' fused gate_up_proj);
// down [experts][hidden][intermediate].
#pragma once

#include <vector>

namespace fp4kv::model {

struct MoeWeights {
  const float* router = nullptr;
  const float* gate_up = nullptr;
  const float* down = nullptr;
  int num_experts = 0;
  int top_k = 0;
  int hidden = 0;
  int intermediate = 0;  // per expert (moe_intermediate_size)
  bool normalize_top_k = false;
};

// The experts each token uses and their weights: experts[t * top_k + j], weights likewise,
// j in order of decreasing probability.
struct MoeRouting {
  int top_k = 0;
  std::vector<int> experts;
  std::vector<float> weights;
};

// Routing of `tokens` rows of router logits [tokens][num_experts]. Throws fp4kv::Error for
// top_k outside [1, num_experts] or a non-finite logit.
MoeRouting route_tokens(const float* router_logits, int tokens, int num_experts, int top_k, bool normalize_top_k);

// out[tokens][hidden] = the sparse MLP block of x[tokens][hidden] (out may not alias x).
// Throws fp4kv::Error for inconsistent sizes.
void moe_mlp(const MoeWeights& w, const float* x, int tokens, float* out);

// The contributions of experts [first, first + count) alone (expert parallelism: the block's
// output is the sum of every rank's part): routing over all w.num_experts experts (w.router
// holds them all), w.gate_up and w.down holding only experts first .. first + count - 1.
void moe_mlp_experts(const MoeWeights& w, int first, int count, const float* x, int tokens, float* out);

}  // namespace fp4kv::model
