// The parts of a Hugging Face Qwen3 config.json that the float32 runner needs. Anything the
// runner does not implement (other architectures, RoPE scaling, sliding windows, biases)
// is refused with a clear fp4kv::Error rather than silently run wrong.
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

  int group_size() const { return num_attention_heads / num_key_value_heads; }
  bool is_eos(int token) const;

  // Parses and validates config.json text; `source` names it in error messages.
  static Qwen3Config parse(const std::string& json_text, const std::string& source = "config.json");
  // Reads <dir>/config.json.
  static Qwen3Config load_dir(const std::string& dir);
};

}  // namespace fp4kv::model
