// Test fixtures: temporary directories, a minimal safetensors writer, and a tiny Qwen3
// checkpoint (random weights) to provoke loader errors without touching the real model.
#pragma once

#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "fp4kv/core/error.h"
#include "fp4kv/core/half.h"

namespace fp4kv::model::testing {

namespace fs = std::filesystem;

// EXPECT that `fn` throws fp4kv::Error whose message contains every one of `parts`.
template <class F>
void expect_error(F&& fn, const std::vector<std::string>& parts) {
  try {
    fn();
    ADD_FAILURE() << "no fp4kv::Error thrown (expected one mentioning '" << parts.front() << "')";
  } catch (const Error& e) {
    const std::string msg = e.what();
    for (const std::string& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << "message: " << msg;
  }
}

inline std::string source_dir() { return FP4KV_SOURCE_DIR; }
inline std::string pk8l_dir() { return source_dir() + "/models/pk8l"; }

// A fresh directory under the system temp dir, removed at scope exit.
class TempDir {
 public:
  TempDir() {
    static int counter = 0;
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    const std::string tag = info ? std::string(info->test_suite_name()) + "_" + info->name() : "fixture";
    path_ = fs::temp_directory_path() / ("fp4kv_model_" + tag + "_" + std::to_string(::getpid()) + "_" +
                                         std::to_string(counter++));
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string str() const { return path_.string(); }
  std::string operator/(const std::string& name) const { return (path_ / name).string(); }

 private:
  fs::path path_;
};

inline void write_text(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

struct RawTensor {
  std::string name;
  std::string dtype;  // "F32", "BF16", "F16", "I32"
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
};

inline RawTensor f32_tensor(const std::string& name, std::vector<int64_t> shape, const std::vector<float>& values) {
  RawTensor t{name, "F32", std::move(shape), std::vector<uint8_t>(values.size() * 4)};
  std::memcpy(t.bytes.data(), values.data(), t.bytes.size());
  return t;
}

inline RawTensor bf16_tensor(const std::string& name, std::vector<int64_t> shape, const std::vector<float>& values) {
  RawTensor t{name, "BF16", std::move(shape), std::vector<uint8_t>(values.size() * 2)};
  for (size_t i = 0; i < values.size(); ++i) {
    const uint16_t h = float_to_bf16_bits(values[i]);
    std::memcpy(t.bytes.data() + 2 * i, &h, 2);
  }
  return t;
}

// Serialized safetensors bytes (header padded to 8 bytes, as the reference writer does).
inline std::string safetensors_bytes(const std::vector<RawTensor>& tensors) {
  nlohmann::json header = nlohmann::json::object();
  header["__metadata__"] = {{"format", "pt"}};
  uint64_t offset = 0;
  std::string data;
  for (const RawTensor& t : tensors) {
    header[t.name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {offset, offset + t.bytes.size()}}};
    data.append(reinterpret_cast<const char*>(t.bytes.data()), t.bytes.size());
    offset += t.bytes.size();
  }
  std::string text = header.dump();
  while (text.size() % 8 != 0) text.push_back(' ');
  const uint64_t n = text.size();
  std::string out(8, '\0');
  std::memcpy(out.data(), &n, 8);
  return out + text + data;
}

inline void write_safetensors(const std::string& path, const std::vector<RawTensor>& tensors) {
  write_text(path, safetensors_bytes(tensors));
}

// A 1-layer Qwen3 config small enough to write by hand: hidden 8, 2 query heads, 1 KV head,
// head_dim 4, MLP 16, vocab 10.
inline nlohmann::json tiny_config(bool tied = true) {
  return {{"architectures", {"Qwen3ForCausalLM"}},
          {"model_type", "qwen3"},
          {"vocab_size", 10},
          {"hidden_size", 8},
          {"intermediate_size", 16},
          {"num_hidden_layers", 1},
          {"num_attention_heads", 2},
          {"num_key_value_heads", 1},
          {"head_dim", 4},
          {"rms_norm_eps", 1e-6},
          {"tie_word_embeddings", tied},
          {"attention_bias", false},
          {"use_sliding_window", false},
          {"bos_token_id", 8},
          {"eos_token_id", 9},
          {"rope_parameters", {{"rope_type", "default"}, {"rope_theta", 10000.0}}}};
}

// Two layers of GQA (4 query heads, 2 KV heads, head_dim 8), hidden 32, MLP 48, vocab 40,
// untied: big enough for head grouping and multi-layer bugs to show.
inline nlohmann::json small_config() {
  nlohmann::json c = tiny_config(/*tied=*/false);
  c["hidden_size"] = 32;
  c["intermediate_size"] = 48;
  c["num_hidden_layers"] = 2;
  c["num_attention_heads"] = 4;
  c["num_key_value_heads"] = 2;
  c["head_dim"] = 8;
  c["vocab_size"] = 40;
  c["eos_token_id"] = 39;
  return c;
}

// A small Qwen3-MoE config on tiny_config's attention: 8 experts of intermediate 12, 2 per
// token, renormalized; 2 layers, layer 1 dense (mlp_only_layers) with intermediate 16.
inline nlohmann::json tiny_moe_config() {
  nlohmann::json c = tiny_config(/*tied=*/false);
  c["architectures"] = {"Qwen3MoeForCausalLM"};
  c["model_type"] = "qwen3_moe";
  c["num_hidden_layers"] = 2;
  c["num_experts"] = 8;
  c["num_experts_per_tok"] = 2;
  c["moe_intermediate_size"] = 12;
  c["norm_topk_prob"] = true;
  c["decoder_sparse_step"] = 1;
  c["mlp_only_layers"] = {1};
  return c;
}

// transformers' Qwen3MoeDecoderLayer rule (Qwen3Config::is_sparse_layer), on the JSON.
inline bool is_sparse_layer(const nlohmann::json& config, int layer) {
  if (config.value("num_experts", 0) <= 0) return false;
  for (int l : config.value("mlp_only_layers", std::vector<int>{})) {
    if (l == layer) return false;
  }
  return (layer + 1) % config.value("decoder_sparse_step", 1) == 0;
}

// The Hub's per-expert tensors of every sparse layer replaced by transformers 5's fused ones
// (mlp.experts.gate_up_proj [E][2 EI][H], mlp.experts.down_proj [E][H][EI]); values unchanged.
inline std::vector<RawTensor> fuse_experts(const nlohmann::json& config, const std::vector<RawTensor>& tensors) {
  auto bytes_of = [&](const std::string& name) -> const std::vector<uint8_t>& {
    for (const RawTensor& t : tensors) {
      if (t.name == name) return t.bytes;
    }
    throw std::runtime_error("no tensor " + name);
  };
  const int64_t E = config["num_experts"], EI = config["moe_intermediate_size"], H = config["hidden_size"];
  std::vector<RawTensor> out;
  for (const RawTensor& t : tensors) {
    if (t.name.find(".mlp.experts.") == std::string::npos) out.push_back(t);
  }
  for (int l = 0; l < int(config["num_hidden_layers"]); ++l) {
    if (!is_sparse_layer(config, l)) continue;
    const std::string p = "model.layers." + std::to_string(l) + ".mlp.experts.";
    RawTensor gate_up{p + "gate_up_proj", "F32", {E, 2 * EI, H}, {}}, down{p + "down_proj", "F32", {E, H, EI}, {}};
    for (int64_t e = 0; e < E; ++e) {
      const std::string x = p + std::to_string(e) + ".";
      for (const char* proj : {"gate_proj.weight", "up_proj.weight"}) {
        const auto& b = bytes_of(x + proj);
        gate_up.bytes.insert(gate_up.bytes.end(), b.begin(), b.end());
      }
      const auto& b = bytes_of(x + "down_proj.weight");
      down.bytes.insert(down.bytes.end(), b.begin(), b.end());
    }
    out.push_back(std::move(gate_up));
    out.push_back(std::move(down));
  }
  return out;
}

// Every tensor of a Qwen3 checkpoint for `config`, random F32 values with norms near 1
// (Qwen3-MoE configs: the Hub's per-expert tensors for every sparse layer).
inline std::vector<RawTensor> qwen3_tensors(const nlohmann::json& config, uint32_t seed = 1) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const int64_t H = config["hidden_size"], I = config["intermediate_size"], V = config["vocab_size"];
  const int64_t d = config["head_dim"], nq = config["num_attention_heads"], nkv = config["num_key_value_heads"];
  auto make = [&](const std::string& name, std::vector<int64_t> shape, float scale, float mean = 0.0f) {
    int64_t n = 1;
    for (int64_t s : shape) n *= s;
    std::vector<float> v(static_cast<size_t>(n));
    for (float& x : v) x = mean + scale * normal(rng);
    return f32_tensor(name, std::move(shape), v);
  };
  std::vector<RawTensor> t;
  t.push_back(make("model.embed_tokens.weight", {V, H}, 1.0f));
  for (int l = 0; l < int(config["num_hidden_layers"]); ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    t.push_back(make(p + "input_layernorm.weight", {H}, 0.1f, 1.0f));
    t.push_back(make(p + "post_attention_layernorm.weight", {H}, 0.1f, 1.0f));
    t.push_back(make(p + "self_attn.q_proj.weight", {nq * d, H}, 1.0f / std::sqrt(float(H))));
    t.push_back(make(p + "self_attn.k_proj.weight", {nkv * d, H}, 1.0f / std::sqrt(float(H))));
    t.push_back(make(p + "self_attn.v_proj.weight", {nkv * d, H}, 1.0f / std::sqrt(float(H))));
    t.push_back(make(p + "self_attn.o_proj.weight", {H, nq * d}, 1.0f / std::sqrt(float(nq * d))));
    t.push_back(make(p + "self_attn.q_norm.weight", {d}, 0.1f, 1.0f));
    t.push_back(make(p + "self_attn.k_norm.weight", {d}, 0.1f, 1.0f));
    if (!is_sparse_layer(config, l)) {
      t.push_back(make(p + "mlp.gate_proj.weight", {I, H}, 1.0f / std::sqrt(float(H))));
      t.push_back(make(p + "mlp.up_proj.weight", {I, H}, 1.0f / std::sqrt(float(H))));
      t.push_back(make(p + "mlp.down_proj.weight", {H, I}, 1.0f / std::sqrt(float(I))));
      continue;
    }
    const int64_t E = config["num_experts"], EI = config["moe_intermediate_size"];
    t.push_back(make(p + "mlp.gate.weight", {E, H}, 2.0f / std::sqrt(float(H))));  // spread-out routing
    for (int64_t e = 0; e < E; ++e) {
      const std::string x = p + "mlp.experts." + std::to_string(e) + ".";
      t.push_back(make(x + "gate_proj.weight", {EI, H}, 1.0f / std::sqrt(float(H))));
      t.push_back(make(x + "up_proj.weight", {EI, H}, 1.0f / std::sqrt(float(H))));
      t.push_back(make(x + "down_proj.weight", {H, EI}, 1.0f / std::sqrt(float(EI))));
    }
  }
  t.push_back(make("model.norm.weight", {H}, 0.1f, 1.0f));
  if (!config.value("tie_word_embeddings", false)) t.push_back(make("lm_head.weight", {V, H}, 1.0f));
  return t;
}

// Writes config.json and model.safetensors for `config` into `dir`.
inline void write_checkpoint(const std::string& dir, const nlohmann::json& config,
                             const std::vector<RawTensor>& tensors) {
  write_text(dir + "/config.json", config.dump(2));
  write_safetensors(dir + "/model.safetensors", tensors);
}

// The BPE test tokenizer's files (tests/model/make_bpe_fixture.py): tiny_bpe_tokenizer.json and
// tiny_bpe_cases.json (texts with their reference ids).
inline std::string bpe_fixture_path(const std::string& name) { return source_dir() + "/tests/model/data/" + name; }
inline nlohmann::json read_bpe_fixture(const std::string& name) {
  return nlohmann::json::parse(std::ifstream(bpe_fixture_path(name)));
}

// A checkpoint with a subword vocabulary in `dir`: random weights of small_config's shape with
// head_dim 64 (the smallest the FP4 recipes' Hadamard transform takes) and the BPE test
// tokenizer's vocabulary size; its tokenizer.json beside them when `with_tokenizer`.
inline void write_bpe_checkpoint(const std::string& dir, bool with_tokenizer = true) {
  const nlohmann::json tokenizer = read_bpe_fixture("tiny_bpe_tokenizer.json");
  nlohmann::json config = small_config();
  config["vocab_size"] = int(tokenizer["model"]["vocab"].size() + tokenizer["added_tokens"].size());
  config["head_dim"] = 64;
  write_checkpoint(dir, config, qwen3_tensors(config));
  if (with_tokenizer) write_text(dir + "/tokenizer.json", tokenizer.dump());
}

}  // namespace fp4kv::model::testing
