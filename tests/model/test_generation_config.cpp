// generation_config.json: the sampling fields read and checked, eos_token_id joining
// config.json's, and every malformed field an error naming the file and the field.
#include "fp4kv/model/generation_config.h"

#include <gtest/gtest.h>

#include "fixtures.h"
#include "fp4kv/core/error.h"
#include "fp4kv/model/qwen3_config.h"

namespace fp4kv::model {
namespace {

using namespace fp4kv::model::testing;
using nlohmann::json;

// Qwen3-4B's file as the Hub ships it.
const json kQwen3 = {{"bos_token_id", 151643}, {"do_sample", true},  {"eos_token_id", {151645, 151643}},
                     {"pad_token_id", 151643}, {"temperature", 0.6}, {"top_k", 20},
                     {"top_p", 0.95},          {"transformers_version", "4.51.0"}};

TEST(GenerationConfig, ReadsTheSamplingFields) {
  TempDir dir;
  write_text(dir / "generation_config.json", kQwen3.dump());
  const GenerationConfig g = read_generation_config(dir.str());
  EXPECT_EQ(g.path, dir / "generation_config.json");
  EXPECT_EQ(g.eos_token_ids, (std::vector<long long>{151645, 151643}));
  EXPECT_FLOAT_EQ(g.temperature.value(), 0.6f);
  EXPECT_FLOAT_EQ(g.top_p.value(), 0.95f);
  EXPECT_EQ(g.top_k.value(), 20);
  EXPECT_FALSE(g.max_new_tokens || g.repetition_penalty || g.min_p);
  json more = kQwen3;
  more["max_new_tokens"] = 2048;
  more["repetition_penalty"] = 1.05;
  more["min_p"] = 0.0;
  more["eos_token_id"] = 7;
  more["top_k"] = nullptr;
  write_text(dir / "generation_config.json", more.dump());
  const GenerationConfig m = read_generation_config(dir.str());
  EXPECT_EQ(m.max_new_tokens.value(), 2048);
  EXPECT_FLOAT_EQ(m.repetition_penalty.value(), 1.05f);
  EXPECT_FLOAT_EQ(m.min_p.value(), 0.0f);
  EXPECT_EQ(m.eos_token_ids, std::vector<long long>{7});
  EXPECT_FALSE(m.top_k.has_value());  // null: absent
}

TEST(GenerationConfig, NoFileIsAnEmptyConfig) {
  TempDir dir;
  const GenerationConfig g = read_generation_config(dir.str());
  EXPECT_TRUE(g.path.empty());
  EXPECT_TRUE(g.eos_token_ids.empty());
  EXPECT_FALSE(g.temperature || g.top_p || g.top_k || g.max_new_tokens);
}

TEST(GenerationConfig, BadFieldsNameTheFileAndTheField) {
  TempDir dir;
  const std::vector<std::pair<json, std::string>> cases = {
      {{{"temperature", -0.1}}, "'temperature' must be >= 0"},
      {{{"temperature", "hot"}}, "'temperature' must be a number"},
      {{{"top_p", 0}}, "'top_p' must be in (0, 1]"},
      {{{"top_p", 1.5}}, "'top_p' must be in (0, 1]"},
      {{{"top_k", 2.5}}, "'top_k' must be an integer"},
      {{{"max_new_tokens", 0}}, "'max_new_tokens' must be >= 1"},
      {{{"repetition_penalty", 0}}, "'repetition_penalty' must be > 0"},
      {{{"min_p", 2}}, "'min_p' must be in [0, 1]"},
      {{{"eos_token_id", {1, "x"}}}, "'eos_token_id' must be a token id or a list of them"},
      {{{"eos_token_id", -1}}, "'eos_token_id' must be a token id or a list of them"},
  };
  for (const auto& [fields, message] : cases) {
    SCOPED_TRACE(fields.dump());
    write_text(dir / "generation_config.json", fields.dump());
    try {
      read_generation_config(dir.str());
      ADD_FAILURE() << "no error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(dir / "generation_config.json"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(message), std::string::npos) << e.what();
    }
  }
  write_text(dir / "generation_config.json", "[1, 2]");
  EXPECT_THROW(read_generation_config(dir.str()), Error);
}

// The file's EOS ids join config.json's; one beyond the vocabulary is an error.
TEST(GenerationConfig, EosIdsJoinTheConfigs) {
  TempDir dir;
  json config = tiny_config();
  config["eos_token_id"] = 7;
  write_text(dir / "config.json", config.dump());
  write_text(dir / "generation_config.json", json{{"eos_token_id", {9, 7}}}.dump());
  const Qwen3Config c = Qwen3Config::load_dir(dir.str());
  EXPECT_TRUE(c.is_eos(7));
  EXPECT_TRUE(c.is_eos(9));
  EXPECT_EQ(c.eos_token_ids.size(), 2u);
  write_text(dir / "generation_config.json", json{{"eos_token_id", config["vocab_size"]}}.dump());
  EXPECT_THROW(Qwen3Config::load_dir(dir.str()), Error);
}

}  // namespace
}  // namespace fp4kv::model
