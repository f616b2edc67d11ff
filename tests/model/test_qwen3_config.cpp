#include "fp4kv/model/qwen3_config.h"

#include <gtest/gtest.h>

#include "fixtures.h"

namespace fp4kv::model {
namespace {

using namespace fp4kv::model::testing;
using nlohmann::json;

Qwen3Config parse(const json& j) { return Qwen3Config::parse(j.dump(), "test config"); }

TEST(Qwen3Config, ParsesPk8l) {
  const Qwen3Config c = Qwen3Config::load_dir(pk8l_dir());
  EXPECT_EQ(c.vocab_size, 264);
  EXPECT_EQ(c.hidden_size, 512);
  EXPECT_EQ(c.intermediate_size, 1024);
  EXPECT_EQ(c.num_hidden_layers, 8);
  EXPECT_EQ(c.num_attention_heads, 8);
  EXPECT_EQ(c.num_key_value_heads, 2);
  EXPECT_EQ(c.group_size(), 4);
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_DOUBLE_EQ(c.rms_norm_eps, 1e-6);
  EXPECT_DOUBLE_EQ(c.rope_theta, 1e6);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_EQ(c.max_position_embeddings, 32768);
  EXPECT_EQ(c.bos_token_id, 256);
  EXPECT_TRUE(c.is_eos(257));
  EXPECT_FALSE(c.is_eos(256));
}

TEST(Qwen3Config, LegacyRopeFieldsAndDefaults) {
  json j = tiny_config();
  j.erase("rope_parameters");
  j.erase("head_dim");
  j["rope_theta"] = 5e5;
  j["rope_scaling"] = nullptr;
  j["eos_token_id"] = {9, 7};
  j["bos_token_id"] = nullptr;
  const Qwen3Config c = parse(j);
  EXPECT_DOUBLE_EQ(c.rope_theta, 5e5);
  EXPECT_EQ(c.head_dim, 4);  // hidden / heads
  EXPECT_EQ(c.bos_token_id, -1);
  EXPECT_TRUE(c.is_eos(7));
  EXPECT_TRUE(c.is_eos(9));

  // model_type alone identifies Qwen3 when there is no architectures list.
  j.erase("architectures");
  EXPECT_NO_THROW(parse(j));
}

// Qwen3-30B-A3B's MoE fields, transformers' defaults, and which layers are sparse.
TEST(Qwen3Config, ParsesQwen3Moe) {
  json j = tiny_moe_config();
  j["num_hidden_layers"] = 48;
  j["num_experts"] = 128;
  j["num_experts_per_tok"] = 8;
  j["moe_intermediate_size"] = 768;
  j["mlp_only_layers"] = json::array();
  const Qwen3Config c = parse(j);
  EXPECT_TRUE(c.is_moe());
  EXPECT_EQ(c.num_experts, 128);
  EXPECT_EQ(c.num_experts_per_tok, 8);
  EXPECT_EQ(c.moe_intermediate_size, 768);
  EXPECT_TRUE(c.norm_topk_prob);
  for (int l = 0; l < 48; ++l) EXPECT_TRUE(c.is_sparse_layer(l)) << l;

  j.erase("norm_topk_prob");
  j["decoder_sparse_step"] = 2;
  j["mlp_only_layers"] = {3};
  const Qwen3Config d = parse(j);
  EXPECT_FALSE(d.norm_topk_prob);  // transformers' default
  EXPECT_FALSE(d.is_sparse_layer(0));
  EXPECT_TRUE(d.is_sparse_layer(1));
  EXPECT_FALSE(d.is_sparse_layer(3));  // listed in mlp_only_layers
  EXPECT_TRUE(d.is_sparse_layer(5));

  j = tiny_moe_config();  // architectures omitted: model_type decides
  j.erase("architectures");
  EXPECT_TRUE(parse(j).is_moe());
  j.erase("intermediate_size");  // layer 1 is dense and needs it
  expect_error([&] { parse(j); }, {"intermediate_size"});
  j["mlp_only_layers"] = json::array();  // every layer sparse: not needed
  EXPECT_EQ(parse(j).intermediate_size, 0);
  EXPECT_FALSE(parse(tiny_config()).is_moe());
  EXPECT_FALSE(parse(tiny_config()).is_sparse_layer(0));

  j = tiny_moe_config();  // transformers >= 5 writes num_local_experts
  j["num_local_experts"] = j["num_experts"];
  j.erase("num_experts");
  EXPECT_EQ(parse(j).num_experts, 8);
  j.erase("num_local_experts");
  expect_error([&] { parse(j); }, {"missing", "num_experts"});
}

TEST(Qwen3Config, BadMoeFields) {
  json j = tiny_moe_config();
  j["num_experts_per_tok"] = 9;
  expect_error([&] { parse(j); }, {"num_experts_per_tok 9", "num_experts 8"});
  j = tiny_moe_config();
  j.erase("moe_intermediate_size");
  expect_error([&] { parse(j); }, {"moe_intermediate_size"});
  j = tiny_moe_config();
  j["mlp_only_layers"] = {2};
  expect_error([&] { parse(j); }, {"mlp_only_layers", "2"});
  j["mlp_only_layers"] = "1";
  expect_error([&] { parse(j); }, {"mlp_only_layers", "list"});
  j = tiny_moe_config();
  j["decoder_sparse_step"] = 0;
  expect_error([&] { parse(j); }, {"decoder_sparse_step"});
  j = tiny_moe_config();
  j["norm_topk_prob"] = 1;
  expect_error([&] { parse(j); }, {"norm_topk_prob"});
}

TEST(Qwen3Config, UnsupportedArchitecture) {
  json j = tiny_config();
  j["architectures"] = {"LlamaForCausalLM"};
  j["model_type"] = "llama";
  EXPECT_THROW(parse(j), Error);
  expect_error([&] { parse(j); }, {"unsupported architecture LlamaForCausalLM", "Qwen3ForCausalLM"});
}

TEST(Qwen3Config, UnsupportedRope) {
  for (const char* type : {"yarn", "linear", "dynamic", "llama3", "longrope"}) {
    json j = tiny_config();
    j["rope_parameters"] = {{"rope_type", type}, {"rope_theta", 1e6}, {"factor", 4.0}};
    expect_error([&] { parse(j); }, {"unsupported RoPE type", std::string("'") + type + "'"});
  }
  json legacy = tiny_config();
  legacy.erase("rope_parameters");
  legacy["rope_theta"] = 1e6;
  legacy["rope_scaling"] = {{"type", "yarn"}, {"factor", 4.0}};
  expect_error([&] { parse(legacy); }, {"unsupported RoPE type 'yarn'", "rope_scaling"});
}

TEST(Qwen3Config, UnsupportedFeatures) {
  json j = tiny_config();
  j["use_sliding_window"] = true;
  j["sliding_window"] = 4096;
  expect_error([&] { parse(j); }, {"unsupported sliding-window"});
  j = tiny_config();
  j["attention_bias"] = true;
  expect_error([&] { parse(j); }, {"unsupported attention_bias"});
  j = tiny_config();
  j["hidden_act"] = "gelu";
  expect_error([&] { parse(j); }, {"unsupported hidden_act", "gelu"});
  j = tiny_config();
  j["layer_types"] = {"sliding_attention"};
  expect_error([&] { parse(j); }, {"unsupported layer type", "sliding_attention"});
}

TEST(Qwen3Config, MissingOrBadFields) {
  for (const char* field : {"vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                            "num_attention_heads", "rms_norm_eps"}) {
    json j = tiny_config();
    j.erase(field);
    expect_error([&] { parse(j); }, {"test config", "missing required field", field});
  }
  json j = tiny_config();
  j.erase("rope_parameters");
  expect_error([&] { parse(j); }, {"missing required field 'rope_theta'"});
  j = tiny_config();
  j["num_key_value_heads"] = 3;
  j["num_attention_heads"] = 4;
  expect_error([&] { parse(j); }, {"num_attention_heads 4", "num_key_value_heads 3"});
  j = tiny_config();
  j["hidden_size"] = "8";
  expect_error([&] { parse(j); }, {"'hidden_size'", "positive integer"});
  expect_error([&] { Qwen3Config::parse("{oops", "cfg.json"); }, {"cfg.json", "not valid JSON"});
  expect_error([&] { Qwen3Config::load_dir("/nonexistent/fp4kv/model"); }, {"/nonexistent/fp4kv/model", "does not exist"});
  TempDir empty;
  expect_error([&] { Qwen3Config::load_dir(empty.str()); }, {"no config.json"});
}

}  // namespace
}  // namespace fp4kv::model
