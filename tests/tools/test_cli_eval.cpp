// `fp4kv eval` and `fp4kv calibrate` through the binary: bad input gives a clear message
// and a non-zero exit; calibration writes a file the evaluation can load.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <unistd.h>

#include "cli.h"
#include "fp4kv/eval/calibration.h"
#include "fp4kv/model/qwen3_config.h"

namespace fp4kv {
namespace {

namespace fs = std::filesystem;
const std::string kModel = std::string(FP4KV_SOURCE_DIR) + "/models/pk8l";
const std::string kText = std::string(FP4KV_SOURCE_DIR) + "/data/eval.txt";

struct TempDir {
  fs::path path = fs::temp_directory_path() / ("fp4kv_cli_eval_" + std::to_string(::getpid()));
  TempDir() { fs::create_directories(path); }
  ~TempDir() { fs::remove_all(path); }
};

void expect_failure(const std::string& args, const std::string& message) {
  const auto r = test::run_cli(args);
  EXPECT_NE(r.code, 0) << args;
  EXPECT_NE(r.code, 3) << "internal error for: " << args << "\n" << r.output;  // 3: uncaught exception
  EXPECT_NE(r.output.find(message), std::string::npos) << args << "\n" << r.output;
}

TEST(CliEval, BadInputIsAClearError) {
  TempDir dir;
  // A model directory whose config is not Qwen3.
  fs::create_directories(dir.path / "llama");
  std::ifstream in(kModel + "/config.json");
  std::string cfg((std::istreambuf_iterator<char>(in)), {});
  cfg.replace(cfg.find("Qwen3ForCausalLM"), 16, "LlamaForCausalLM");
  std::ofstream(dir.path / "llama" / "config.json") << cfg;
  std::ofstream(dir.path / "short.txt") << "too short";

  expect_failure("eval --quiet --model " + (dir.path / "nope").string(), "does not exist");
  expect_failure("eval --quiet --model " + (dir.path / "llama").string(), "LlamaForCausalLM");
  expect_failure("eval --quiet --model " + kModel + " --text " + (dir.path / "short.txt").string(), "shorter than the context");
  expect_failure("eval --quiet --model " + kModel + " --text " + (dir.path / "missing.txt").string(), "cannot read");
  expect_failure("eval --quiet --model " + kModel + " --configs bf16,nvfp5", "unknown preset 'nvfp5'");
  expect_failure("eval --quiet --model " + kModel + " --configs nvfp4:no-dualq", "does not apply");
  expect_failure("eval --quiet --model " + kModel + " --baseline nvfp5", "unknown preset");
  expect_failure("eval --quiet --model " + kModel + " --context 100", "at least 256");
  expect_failure("eval --quiet --model " + kModel + " --text " + kText + " --calibration " +
                     (dir.path / "short.txt").string(),
                 "malformed");
  expect_failure("calibrate --model " + (dir.path / "nope").string(), "does not exist");
}

// --device: a bad name is an error; cuda runs the GPU engine where a device is visible and
// is a clear error elsewhere; a CPU-reference-only variant is refused on the GPU by name.
TEST(CliEval, DeviceChoice) {
  expect_failure("eval --quiet --model " + kModel + " --device tpu", "--device");
  const std::string small = "eval --quiet --model " + kModel + " --text " + kText +
                            " --context 256 --windows 1 --retrieval-docs 0 --baseline nvfp4 --device cuda --configs ";
  const auto r = test::run_cli(small + "bf16,nvfp4");
  if (r.code == 0) {
    EXPECT_NE(r.output.find("fp4kv eval (cuda)"), std::string::npos) << r.output;
    expect_failure(small + "nvfp4-native:smoothq", "--device cpu");
  } else {
    EXPECT_TRUE(r.output.find("no CUDA device") != std::string::npos ||
                r.output.find("this build has no CUDA") != std::string::npos)
        << r.output;
  }
}

TEST(CliCalibrate, WritesAFileTheEvaluationLoads) {
  TempDir dir;
  const std::string out = (dir.path / "calib.json").string();
  const auto r = test::run_cli("calibrate --model " + kModel + " --text " + std::string(FP4KV_SOURCE_DIR) +
                               "/data/calib.txt --context 512 --continuation 8 --out " + out);
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("tau: E4M3 code"), std::string::npos) << r.output;
  const eval::Calibration c = eval::Calibration::load(out, model::Qwen3Config::load_dir(kModel));
  EXPECT_EQ(c.context, 512);
  EXPECT_GE(c.tau_code, 0);
  EXPECT_LT(c.tau_code, 126);
  for (float x : c.mu_k) ASSERT_TRUE(std::isfinite(x));
  // The evaluation uses the given file and says so.
  const auto e = test::run_cli("eval --quiet --model " + kModel + " --text " + kText +
                               " --context 256 --windows 1 --retrieval-docs 0 --configs nvfp4 --baseline nvfp4 "
                               "--calibration " + out);
  ASSERT_EQ(e.code, 0) << e.output;
  EXPECT_NE(e.output.find(out + " (given)"), std::string::npos) << e.output;
}

}  // namespace
}  // namespace fp4kv
