// A float32 CPU runner for Hugging Face Qwen3ForCausalLM and Qwen3MoeForCausalLM checkpoints
// (the MoE block: moe.h). Attention is a callback, so that the same forward pass can run exact attention (the oracle) or any
// quantized-cache attention under test; everything else follows transformers' fp32 math
// (RMSNorm, QK-norm, rotate-half RoPE, SwiGLU) closely enough to agree to ~1e-5.
#pragma once

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "fp4kv/model/collective.h"
#include "fp4kv/model/qwen3_config.h"
#include "fp4kv/model/tensor_parallel.h"

namespace fp4kv::model {

// Attention of one layer. q: [heads][nq][d], the queries of positions n - nq .. n - 1;
// k and v: [kv_heads][n][d], the keys and values of positions 0 .. n - 1 (q and k after
// QK-norm and RoPE); out: [heads][nq][d]. Causal: the query at position t sees keys 0..t.
using AttentionFn = std::function<void(int layer, const float* q, const float* k, const float* v, int nq, int n,
                                       float* out)>;

// Exact causal softmax attention with GQA (head h reads KV head h / (heads / kv_heads)),
// scale 1/sqrt(d). Products go through sgemm; softmax runs in float with a double sum.
void exact_causal_attention(const float* q, const float* k, const float* v, int heads, int kv_heads, int L,
                            int d, float* out);

// Intermediate tensors of one forward pass, for comparison with a reference implementation.
struct Capture {
  std::vector<float> hidden_after_embed;                 // [L][hidden]
  std::map<int, std::vector<float>> q_rope, k_rope, v;  // per captured layer, in AttentionFn layout
  std::vector<int> layers;                               // which layers to capture (set by the caller)
};

// Every layer's post-RoPE keys and values of the positions processed so far, so that
// further tokens can extend a prefix without recomputing it.
struct KvState {
  int length = 0;
  std::vector<std::vector<float>> k, v;  // per layer [kv_heads][length][head_dim]
};

class Qwen3Model {
 public:
  // Loads <dir>/config.json and the safetensors weights, validating every tensor name and shape.
  static Qwen3Model load(const std::string& dir);

  const Qwen3Config& config() const { return config_; }
  int64_t parameter_count() const;
  // Per layer, an upper bound of a post-RoPE key vector's norm: QK-norm leaves an RMS of at
  // most 1 (norm <= sqrt(head_dim)) before the k_norm weight scales each channel, and RoPE
  // only rotates channel pairs. A mean key (calibration's mu_k) cannot exceed it either.
  std::vector<float> key_norm_bounds() const {
    std::vector<float> out;
    for (const Layer& layer : layers_) {
      float w = 0.0f;
      for (float x : layer.k_norm) w = std::max(w, std::fabs(x));
      out.push_back(w * std::sqrt(float(config_.head_dim)));
    }
    return out;
  }

  // Logits [L][vocab] for `tokens` at positions 0..L-1; with `state`, also the K/V of
  // every layer (to extend later).
  std::vector<float> forward(const std::vector<int>& tokens, const AttentionFn& attend, Capture* capture = nullptr,
                             KvState* state = nullptr) const;
  // The same with exact_causal_attention.
  std::vector<float> forward(const std::vector<int>& tokens, Capture* capture = nullptr) const;
  // Logits [L][vocab] of `tokens` at positions prefix.length.. after the prefix; with
  // `state` (may be &prefix), the extended K/V.
  std::vector<float> extend(const KvState& prefix, const std::vector<int>& tokens, const AttentionFn& attend,
                            KvState* state = nullptr) const;
  // Logits [vocab] of the last of `tokens`, run at positions prefix->length.. (0.. when
  // prefix is null); with `state` (may be prefix), the extended K/V. What a generator needs
  // per step: no [L][vocab] logits of a long prompt.
  std::vector<float> last_logits(const KvState* prefix, const std::vector<int>& tokens, const AttentionFn& attend,
                                 KvState* state) const;
  // An AttentionFn that runs exact causal attention with this model's head counts (a
  // shard's: its own heads).
  AttentionFn exact_attention() const;

  // Tensor parallelism (tensor_parallel.h): this model's shard for rank group.rank() of
  // group.ranks(). A shard's forward passes meet the group's other ranks at the all-reduces
  // (embedding, attention output, MLP) and the LM head's all-gather, so every rank must run
  // the same calls at the same time (one thread per rank). The logits are the whole
  // vocabulary's on every rank; AttentionFn and KvState see the rank's heads only. The
  // group must outlive the shard. Throws fp4kv::Error when the model does not divide.
  Qwen3Model shard(Collective& group) const;
  // The part of the model this object holds (the whole model: rank 0 of 1).
  const TpSlice& tp() const { return tp_; }

  // Greedy continuation: returns `new_tokens` argmax tokens appended after `prompt` (stops
  // early at eos when stop_at_eos). The prompt is prefilled once; every further token is
  // one step over the cached K/V with exact attention.
  std::vector<int> generate_greedy(const std::vector<int>& prompt, int new_tokens, bool stop_at_eos = true) const;

 private:
  struct Layer {
    std::vector<float> input_norm, post_norm;  // [hidden]
    std::vector<float> q_norm, k_norm;         // [head_dim]
    std::vector<float> wqkv;                   // q, k, v projections stacked: [(heads + 2 kv_heads) d][hidden]
    std::vector<float> wo;                     // [hidden][heads d]
    std::vector<float> w_gate_up;              // dense MLP, gate then up: [2 intermediate][hidden]
    std::vector<float> w_down;                 // dense MLP: [hidden][intermediate]
    // The sparse MoE block instead (Qwen3-MoE layers; moe.h's layouts), empty otherwise.
    std::vector<float> router;                 // [experts][hidden]
    std::vector<float> expert_gate_up;         // [experts][2 moe_intermediate][hidden]
    std::vector<float> expert_down;            // [experts][hidden][moe_intermediate]
  };
  // Runs tokens[0..L) at positions prefix->length.. (0 without a prefix). Returns logits
  // for every row, or for the last row only when `last_only`.
  std::vector<float> run(const int* tokens, int L, const KvState* prefix, const AttentionFn& attend,
                         Capture* capture, KvState* state, bool last_only) const;

  // The MLP block of one layer, dense or sparse: out[L][hidden] from the normed xn[L][hidden].
  void mlp(const Layer& W, const float* xn, int L, float* out) const;

  Qwen3Config config_;
  std::vector<float> embed_;       // [vocab][hidden]
  std::vector<float> final_norm_;  // [hidden]
  std::vector<float> lm_head_;     // [vocab][hidden]; empty when tied to embed_
  std::vector<Layer> layers_;
  std::vector<float> inv_freq_;    // [head_dim / 2], as transformers computes it in float32
  // Tensor parallelism: the slice held (heads, KV heads, intermediate, experts, vocabulary
  // rows of embed_ and lm_head_), and the group to meet (null: the whole model).
  TpSlice tp_;
  Collective* group_ = nullptr;
};

}  // namespace fp4kv::model
