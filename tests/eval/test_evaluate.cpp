// A short version of the accuracy evaluation on the embedded pk8l model: the paper's
// ordering of the recipes must hold, so a numerical regression anywhere in the formats,
// the recipe or the runner fails CI.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "fp4kv/eval/evaluate.h"
#include "fp4kv/testing/error_of.h"

namespace fp4kv::eval {
namespace {

TEST(Evaluate, Pk8lOrderingOfThePaperHolds) {
  EvalOptions o;
  o.model_dir = std::string(FP4KV_SOURCE_DIR) + "/models/pk8l";
  o.text_path = std::string(FP4KV_SOURCE_DIR) + "/data/eval.txt";
  o.context = 768;
  o.windows = 2;
  o.retrieval_docs = 1;
  o.retrieval_context = 768;
  o.progress = false;
  o.configs = parse_recipe_list(
      "bf16,fp8,nvfp4,nvfp4-native,nvfp4-vanilla-native,mxfp4-native,mxfp4-vanilla-native");
  std::ostringstream log;
  const EvalReport rep = evaluate(o, log);
  std::printf("%s", rep.table().c_str());
  std::map<std::string, double> kl;
  for (const auto& c : rep.configs) {
    kl[c.name] = c.kl_1e3;
    ASSERT_TRUE(c.retrieval_acc.has_value());
    EXPECT_GE(c.retrieval_questions, 4);
  }
  EXPECT_EQ(kl["bf16"], 0.0);  // the reference against itself
  EXPECT_LT(kl["bf16"], kl["fp8"]);
  EXPECT_LT(kl["fp8"], kl["nvfp4"]);
  EXPECT_LE(kl["nvfp4"], kl["nvfp4-native"]);
  EXPECT_LT(kl["nvfp4-native"], kl["nvfp4-vanilla-native"]);
  EXPECT_LT(kl["mxfp4-native"], kl["mxfp4-vanilla-native"]);
  // The JSON has the documented shape.
  const std::string j = rep.json();
  for (const char* key : {"\"model\"", "\"context\": 768", "\"windows\": 2", "\"kl_1e3\"", "\"top1_mismatch_pct\"",
                          "\"t_vs_baseline\"", "\"retrieval_acc\""})
    EXPECT_NE(j.find(key), std::string::npos) << key;
}

// The evaluation feeds text as byte tokens: a checkpoint with another vocabulary (here pk8l's
// config with Qwen3's BOS and vocabulary size) is refused before any work, not evaluated on
// ids that mean nothing to it.
TEST(Evaluate, ACheckpointWithoutTheByteTokenizerIsRefused) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("fp4kv_eval_subword_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  nlohmann::json config = nlohmann::json::parse(std::ifstream(std::string(FP4KV_SOURCE_DIR) + "/models/pk8l/config.json"));
  config["bos_token_id"] = 151643;
  config["eos_token_id"] = 151645;
  config["vocab_size"] = 151936;
  std::ofstream(dir / "config.json") << config.dump();
  EvalOptions o;
  o.model_dir = dir.string();
  o.text_path = std::string(FP4KV_SOURCE_DIR) + "/data/eval.txt";
  o.configs = parse_recipe_list("nvfp4");
  std::ostringstream log;
  const std::string msg = testing::error_of([&] { evaluate(o, log); });
  fs::remove_all(dir);
  EXPECT_NE(msg.find("byte tokenizer"), std::string::npos) << msg;
  EXPECT_NE(msg.find(dir.string()), std::string::npos) << msg;
}

}  // namespace
}  // namespace fp4kv::eval
