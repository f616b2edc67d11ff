// The CLI as an adversary uses it: outputs that cannot be written (full disk, missing
// folder, a directory), sizes beyond the model or the memory, and directories where files
// belong. Every case must end in exit 2 with a message naming the option, and checks that
// can be made before the work must be made before it.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <vector>

#include "cli.h"

namespace fp4kv {
namespace {

namespace fs = std::filesystem;
const std::string kSource = FP4KV_SOURCE_DIR;
const std::string kModel = kSource + "/models/pk8l";
const std::string kText = kSource + "/data/eval.txt";
const std::string kCalibText = kSource + "/data/calib.txt";
// The smallest useful evaluation: one 256-token window of a recipe that needs no
// calibration; a test overrides one field (CLI11 refuses an option given twice).
struct EvalArgs {
  std::string text = kText, context = "256", windows = "1", configs = "bf16";
};
std::string fast_eval(const EvalArgs& a = {}) {
  return "eval --quiet --model " + kModel + " --text " + a.text + " --context " + a.context + " --windows " + a.windows +
         " --retrieval-docs 0 --configs " + a.configs + " --baseline " + a.configs;
}
std::string fast_calibrate(const std::string& text = kCalibText, const std::string& context = "256") {
  return "calibrate --model " + kModel + " --text " + text + " --context " + context + " --continuation 0";
}
const std::string kEvalTable = "KL (1e-3)";  // the header of eval's table

struct TempDir {
  fs::path path = fs::temp_directory_path() / ("fp4kv_cli_rel_" + std::to_string(::getpid()));
  TempDir() { fs::create_directories(path); }
  ~TempDir() { fs::remove_all(path); }
  std::string operator/(const std::string& name) const { return (path / name).string(); }
};

// Runs `args`, expects exit 2 (an fp4kv::Error) with every one of `parts` in the output.
test::CliResult expect_error(const std::string& args, const std::vector<std::string>& parts) {
  const test::CliResult r = test::run_cli(args);
  EXPECT_EQ(r.code, 2) << args << "\n" << r.output;
  for (const std::string& p : parts) EXPECT_NE(r.output.find(p), std::string::npos) << args << "\n" << r.output;
  EXPECT_EQ(r.output.find("internal error"), std::string::npos) << r.output;
  return r;
}

TEST(CliOutputFiles, FullDiskIsAnErrorNeverWrote) {
  if (!fs::exists("/dev/full")) GTEST_SKIP() << "no /dev/full";
  TempDir dir;
  const std::vector<float> block(16, 1.0f);  // one NVFP4 block
  std::ofstream(dir / "x.f32", std::ios::binary).write(reinterpret_cast<const char*>(block.data()), 64);
  for (const auto& [args, option] :
       std::vector<std::pair<std::string, std::string>>{{fast_eval() + " --json /dev/full", "--json"},
                                                        {fast_calibrate() + " --out /dev/full", "--out"},
                                                        {"quantize --in " + (dir / "x.f32") + " --out /dev/full", "--out"}}) {
    const test::CliResult r = expect_error(args, {option, "No space left on device"});
    EXPECT_EQ(r.output.find("wrote"), std::string::npos) << r.output;
  }
}

TEST(CliOutputFiles, UnwritablePathsFailBeforeTheWork) {
  TempDir dir;
  const std::string missing = dir / "no_such_folder/out.json";
  for (const std::string& bad : {missing, dir.path.string()}) {
    const test::CliResult e = expect_error(fast_eval() + " --json " + bad, {"--json", bad});
    EXPECT_EQ(e.output.find(kEvalTable), std::string::npos) << "evaluated before checking --json:\n" << e.output;
    const test::CliResult c = expect_error(fast_calibrate() + " --out " + bad, {"--out", bad});
    EXPECT_EQ(c.output.find("calibrated"), std::string::npos) << c.output;
  }
  EXPECT_FALSE(fs::exists(dir / "no_such_folder"));
}

TEST(CliLimits, PositionsBeyondTheModelAreRefused) {
  // pk8l's config.json: max_position_embeddings 32768.
  expect_error(fast_eval({.context = "32769"}), {"--context", "max_position_embeddings of 32768"});
  expect_error("eval --quiet --model " + kModel + " --retrieval-docs 1 --retrieval-context 40000",
               {"--retrieval-context", "max_position_embeddings"});
  expect_error(fast_calibrate(kCalibText, "40000"), {"--context", "max_position_embeddings"});
  expect_error("calibrate --model " + kModel + " --continuation 32768", {"--continuation", "max_position_embeddings"});
  expect_error("calibrate --model " + kModel + " --continuation -1", {"--continuation", ">= 0"});
  // eval.txt holds about 400 K distinct windows.
  expect_error(fast_eval({.windows = "100000000"}), {"--windows", "distinct windows"});
}

TEST(CliLimits, MemoryBeyondWhatIsAvailableIsRefusedAtOnce) {
  TempDir dir;
  // A config allowing 2^30 positions with a 2^30-token vocabulary: one window of 2^30 tokens
  // needs exabytes of logits. Only config.json exists: the check must come before the weights.
  std::ifstream in(kModel + "/config.json");
  nlohmann::json cfg = nlohmann::json::parse(in);
  cfg["max_position_embeddings"] = 1 << 30;
  cfg["vocab_size"] = 1 << 30;
  fs::create_directories(dir / "huge");
  std::ofstream(dir / "huge/config.json") << cfg.dump();
  expect_error("eval --quiet --model " + (dir / "huge") + " --context 1073741824", {"--context", "of memory"});
  expect_error("calibrate --model " + (dir / "huge") + " --context 1073741824", {"--context", "of memory"});
  // The real model under a 1.5 GiB address-space limit: a 30000-token window needs more.
  const test::CliResult r = test::run_cli_in_shell("ulimit -v 1500000; " + test::cli_path() + " " +
                                                   fast_eval({.context = "30000"}));
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("--context"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("memory"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("internal error"), std::string::npos) << r.output;
}

TEST(CliInputs, DirectoriesWhereFilesBelong) {
  TempDir dir;
  const std::string d = dir.path.string();
  expect_error(fast_eval({.text = d}), {"--text", "is a directory"});
  expect_error(fast_eval({.configs = "nvfp4"}) + " --calibration " + d, {"--calibration", "is a directory"});
  expect_error(fast_calibrate(d), {"--text", "is a directory"});
  expect_error("quantize --in " + d + " --out " + (dir / "o.bin"), {"--in", "is a directory"});
  std::ofstream(dir / "file") << "x";
  expect_error("eval --quiet --model " + (dir / "file"), {"--model", "is not a directory"});
  expect_error("check-model --model " + kModel + " --reference " + d, {"--reference", "is a directory"});
}

}  // namespace
}  // namespace fp4kv
