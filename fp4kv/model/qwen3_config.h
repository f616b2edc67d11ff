// The parts of a Hugging Face Qwen3 config.json (Qwen3ForCausalLM, or Qwen3MoeForCausalLM:
// the same decoder with sparse MLP blocks) that the float32 runner needs. Anything the runner
// does not implement (other architectures, RoPE scaling, sliding windows, biases) is refused
// with a clear fp4kv::Error rather than silently run wrong.
#pragma once

#include <string>
#include <vector>

namespace fp4kv::model {

struct Qwen3Config {
  int vocab_size = 0;
  int hidden_size = 0;
  int intermediate_size = 0;
  int num_hidden_layers = 0;
  int num_attention_heads = 0;
  int num_key_value_heads = 0;
  int head_dim = 0;  // default hidden_size / num_attention_heads
  double rms_norm_eps = 1e-6;
  double rope_theta = 0;  // default RoPE only
  bool tie_word_embeddings = false;
  int max_position_embeddings = 0;  // 0 when absent; informational
  int bos_token_id = -1;            // -1 when absent or null
  std::vector<int> eos_token_ids;   // config allows one id or a list

  // Qwen3-MoE (transformers' names); num_experts 0 for a dense Qwen3.
  int num_experts = 0;
  int num_experts_per_tok = 0;
  int moe_intermediate_size = 0;
  bool norm_topk_prob = false;  // transformers' default when absent
  int decoder_sparse_step = 1;
  std::vector<int> mlp_only_layers;

  int group_size() const { return num_attention_heads / num_key_value_heads; }
  bool is_moe() const { return num_experts > 0; }
  // Whether `layer` has the sparse MoE block (else the dense MLP of intermediate_size), as
  // transformers' Qwen3MoeDecoderLayer decides: not listed in mlp_only_layers, and
  // (layer + 1) a multiple of decoder_sparse_step.
  bool is_sparse_layer(int layer) const;
  // Whether some layer has the dense MLP / the sparse MoE block.
  bool has_dense_layer() const;
  bool has_sparse_layer() const;
  bool is_eos(int token) const;

  // Parses and validates config.json text; `source` names it in error messages.
  static Qwen3Config parse(const std::string& json_text, const std::string& source = "config.json");
  // Reads <dir>/config.json (and generation_config.json's eos_token_id, when present, added to
  // eos_token_ids).
  static Qwen3Config load_dir(const std::string& dir);
};

}  // namespace fp4kv::model
