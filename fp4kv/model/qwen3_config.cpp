#include "fp4kv/model/qwen3_config.h"

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "fp4kv/core/error.h"
#include "fp4kv/core/input_file.h"
#include "fp4kv/model/generation_config.h"

namespace fp4kv::model {

namespace {

using nlohmann::json;

class Reader {
 public:
  Reader(const json& j, const std::string& source) : j_(j), source_(source) {}

  [[noreturn]] void fail(const std::string& what) const { throw Error(source_ + ": " + what); }

  bool has(const char* key) const { return j_.contains(key) && !j_.at(key).is_null(); }

  const json& required(const char* key) const {
    if (!has(key)) fail(std::string("missing required field '") + key + "'");
    return j_.at(key);
  }

  int positive_int(const char* key) const {
    const json& v = required(key);
    if (!v.is_number_integer() || v.get<int64_t>() <= 0 || v.get<int64_t>() > (1 << 30)) {
      fail(std::string("field '") + key + "' must be a positive integer, got " + v.dump());
    }
    return v.get<int>();
  }

  double positive_number(const json& v, const char* key) const {
    if (!v.is_number() || !(v.get<double>() > 0)) {
      fail(std::string("field '") + key + "' must be a positive number, got " + v.dump());
    }
    return v.get<double>();
  }

  bool flag(const char* key, bool fallback) const {
    if (!has(key)) return fallback;
    const json& v = j_.at(key);
    if (!v.is_boolean()) fail(std::string("field '") + key + "' must be true or false, got " + v.dump());
    return v.get<bool>();
  }

  int optional_token(const char* key) const {
    if (!has(key)) return -1;
    const json& v = j_.at(key);
    if (!v.is_number_integer()) fail(std::string("field '") + key + "' must be a token id, got " + v.dump());
    return v.get<int>();
  }

 private:
  const json& j_;
  const std::string& source_;
};

// A RoPE description (rope_parameters or legacy rope_scaling): only "default" is run.
void check_rope(const Reader& r, const json& rope, const char* key) {
  if (rope.is_null()) return;
  if (!rope.is_object()) r.fail(std::string("field '") + key + "' must be an object, got " + rope.dump());
  std::string type = "default";
  for (const char* type_key : {"rope_type", "type"}) {
    if (rope.contains(type_key) && rope.at(type_key).is_string()) type = rope.at(type_key).get<std::string>();
  }
  if (type != "default") {
    r.fail("unsupported RoPE type '" + type + "' in '" + key + "' (fp4kv supports default RoPE without scaling)");
  }
  if (rope.contains("partial_rotary_factor") && rope.at("partial_rotary_factor").is_number() &&
      rope.at("partial_rotary_factor").get<double>() != 1.0) {
    r.fail("unsupported partial_rotary_factor " + rope.at("partial_rotary_factor").dump() + " in '" + key + "'");
  }
}

// Qwen3MoeConfig's fields (the ones the forward pass reads).
void read_moe(const Reader& r, const json& j, Qwen3Config& c) {
  // The Hub's Qwen3-MoE configs say num_experts; transformers >= 5 writes num_local_experts.
  const bool local_name = r.has("num_local_experts") && !r.has("num_experts");
  c.num_experts = r.positive_int(local_name ? "num_local_experts" : "num_experts");
  c.num_experts_per_tok = r.positive_int("num_experts_per_tok");
  if (c.num_experts_per_tok > c.num_experts) {
    r.fail("num_experts_per_tok " + std::to_string(c.num_experts_per_tok) + " exceeds num_experts " +
           std::to_string(c.num_experts));
  }
  c.moe_intermediate_size = r.positive_int("moe_intermediate_size");
  c.norm_topk_prob = r.flag("norm_topk_prob", false);
  if (r.has("decoder_sparse_step")) c.decoder_sparse_step = r.positive_int("decoder_sparse_step");
  if (r.has("mlp_only_layers")) {
    const json& m = j.at("mlp_only_layers");
    if (!m.is_array()) r.fail("field 'mlp_only_layers' must be a list of layer indices, got " + m.dump());
    for (const json& l : m) {
      if (!l.is_number_integer() || l.get<int64_t>() < 0 || l.get<int64_t>() >= c.num_hidden_layers) {
        r.fail("field 'mlp_only_layers' holds " + l.dump() + ", not a layer index below num_hidden_layers " +
               std::to_string(c.num_hidden_layers));
      }
      c.mlp_only_layers.push_back(l.get<int>());
    }
  }
}

}  // namespace

bool Qwen3Config::is_sparse_layer(int layer) const {
  if (num_experts <= 0) return false;
  if (std::find(mlp_only_layers.begin(), mlp_only_layers.end(), layer) != mlp_only_layers.end()) return false;
  return (layer + 1) % decoder_sparse_step == 0;
}

bool Qwen3Config::has_dense_layer() const {
  for (int l = 0; l < num_hidden_layers; ++l) {
    if (!is_sparse_layer(l)) return true;
  }
  return false;
}

bool Qwen3Config::has_sparse_layer() const {
  for (int l = 0; l < num_hidden_layers; ++l) {
    if (is_sparse_layer(l)) return true;
  }
  return false;
}

bool Qwen3Config::is_eos(int token) const {
  return std::find(eos_token_ids.begin(), eos_token_ids.end(), token) != eos_token_ids.end();
}

Qwen3Config Qwen3Config::parse(const std::string& json_text, const std::string& source) {
  json j;
  try {
    j = json::parse(json_text);
  } catch (const json::exception& e) {
    throw Error(source + ": not valid JSON (" + e.what() + ")");
  }
  if (!j.is_object()) throw Error(source + ": not a JSON object");
  const Reader r(j, source);

  // Architecture: the runner implements Qwen3ForCausalLM and Qwen3MoeForCausalLM.
  const bool type_moe = r.has("model_type") && j.at("model_type") == "qwen3_moe";
  bool is_qwen3 = r.has("model_type") && (j.at("model_type") == "qwen3" || type_moe), is_moe = type_moe;
  std::string arch = r.has("model_type") && j.at("model_type").is_string()
                         ? "model_type " + j.at("model_type").get<std::string>()
                         : "(none given)";
  if (r.has("architectures")) {
    const json& a = j.at("architectures");
    if (!a.is_array()) r.fail("field 'architectures' must be a list");
    is_qwen3 = is_moe = false;  // an explicit architecture list is authoritative
    arch.clear();
    for (const json& name : a) {
      if (name == "Qwen3ForCausalLM") is_qwen3 = true;
      if (name == "Qwen3MoeForCausalLM") is_qwen3 = is_moe = true;
      arch += (arch.empty() ? "" : ", ") + (name.is_string() ? name.get<std::string>() : name.dump());
    }
    if (arch.empty()) arch = "(empty list)";
  }
  if (!is_qwen3) {
    r.fail("unsupported architecture " + arch + " (fp4kv supports Qwen3ForCausalLM and Qwen3MoeForCausalLM)");
  }

  Qwen3Config c;
  c.vocab_size = r.positive_int("vocab_size");
  c.hidden_size = r.positive_int("hidden_size");
  c.num_hidden_layers = r.positive_int("num_hidden_layers");
  if (is_moe) read_moe(r, j, c);
  if (c.has_dense_layer() || r.has("intermediate_size")) c.intermediate_size = r.positive_int("intermediate_size");
  c.num_attention_heads = r.positive_int("num_attention_heads");
  c.num_key_value_heads = r.has("num_key_value_heads") ? r.positive_int("num_key_value_heads") : c.num_attention_heads;
  if (r.has("head_dim")) {
    c.head_dim = r.positive_int("head_dim");
  } else {
    if (c.hidden_size % c.num_attention_heads != 0) {
      r.fail("no head_dim and hidden_size " + std::to_string(c.hidden_size) + " is not a multiple of " +
             "num_attention_heads " + std::to_string(c.num_attention_heads));
    }
    c.head_dim = c.hidden_size / c.num_attention_heads;
  }
  if (c.head_dim % 2 != 0) r.fail("head_dim " + std::to_string(c.head_dim) + " must be even for RoPE");
  if (c.num_attention_heads % c.num_key_value_heads != 0) {
    r.fail("num_attention_heads " + std::to_string(c.num_attention_heads) + " is not a multiple of " +
           "num_key_value_heads " + std::to_string(c.num_key_value_heads));
  }
  c.rms_norm_eps = r.positive_number(r.required("rms_norm_eps"), "rms_norm_eps");
  c.tie_word_embeddings = r.flag("tie_word_embeddings", false);
  if (r.has("max_position_embeddings")) c.max_position_embeddings = r.positive_int("max_position_embeddings");
  c.bos_token_id = r.optional_token("bos_token_id");
  if (r.has("eos_token_id")) {
    const json& e = j.at("eos_token_id");
    if (e.is_number_integer()) {
      c.eos_token_ids.push_back(e.get<int>());
    } else if (e.is_array()) {
      for (const json& id : e) {
        if (!id.is_number_integer()) r.fail("field 'eos_token_id' must hold token ids, got " + e.dump());
        c.eos_token_ids.push_back(id.get<int>());
      }
    } else {
      r.fail("field 'eos_token_id' must be a token id or a list, got " + e.dump());
    }
  }

  // Features the runner does not implement.
  if (r.has("hidden_act") && j.at("hidden_act") != "silu") {
    r.fail("unsupported hidden_act " + j.at("hidden_act").dump() + " (fp4kv supports silu)");
  }
  if (r.flag("attention_bias", false)) r.fail("unsupported attention_bias true (fp4kv supports attention without bias)");
  if (r.flag("use_sliding_window", false)) {
    r.fail("unsupported sliding-window attention (use_sliding_window true); fp4kv supports full attention only");
  }
  if (r.has("layer_types")) {
    for (const json& t : j.at("layer_types")) {
      if (t != "full_attention") r.fail("unsupported layer type " + t.dump() + " (fp4kv supports full_attention)");
    }
  }

  // RoPE: transformers >= 5 writes rope_parameters {rope_type, rope_theta}; older
  // configs have a top-level rope_theta and rope_scaling (null for default RoPE).
  if (j.contains("rope_parameters")) check_rope(r, j.at("rope_parameters"), "rope_parameters");
  if (j.contains("rope_scaling")) check_rope(r, j.at("rope_scaling"), "rope_scaling");
  const json* theta = nullptr;
  if (r.has("rope_parameters") && j.at("rope_parameters").contains("rope_theta")) {
    theta = &j.at("rope_parameters").at("rope_theta");
  } else if (r.has("rope_theta")) {
    theta = &j.at("rope_theta");
  }
  if (theta == nullptr) r.fail("missing required field 'rope_theta' (top level or in rope_parameters)");
  c.rope_theta = r.positive_number(*theta, "rope_theta");
  return c;
}

namespace {

// generation_config.json's eos_token_id (one id or a list) joins config.json's: chat models
// end a turn with a token config.json may not name (Qwen3's <|im_end|> beside
// <|endoftext|>), and transformers' generate and vLLM stop at both.
void add_generation_eos(const std::string& dir, Qwen3Config& c) {
  const GenerationConfig g = read_generation_config(dir);
  for (const long long id : g.eos_token_ids) {
    if (id >= c.vocab_size)
      throw Error(g.path + ": 'eos_token_id' must hold token ids below vocab_size " + std::to_string(c.vocab_size) +
                  ", got " + std::to_string(id));
    if (!c.is_eos(int(id))) c.eos_token_ids.push_back(int(id));
  }
}

}  // namespace

Qwen3Config Qwen3Config::load_dir(const std::string& dir) {
  namespace fs = std::filesystem;
  if (!fs::exists(dir)) throw Error("model directory " + dir + " does not exist");
  if (!fs::is_directory(dir)) throw Error("model directory " + dir + " is not a directory");
  const fs::path path = fs::path(dir) / "config.json";
  if (fs::is_directory(path)) throw Error("model directory " + dir + ": config.json is a directory, not a file");
  const std::optional<std::string> text = read_file(path.string());
  if (!text) throw Error("model directory " + dir + " has no config.json");
  Qwen3Config c = parse(*text, path.string());
  add_generation_eos(dir, c);
  return c;
}

}  // namespace fp4kv::model
