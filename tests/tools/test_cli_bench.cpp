// `fp4kv bench decode` and `fp4kv bench mla` check their arguments before they touch a GPU,
// so bad input gets a clear error on any machine. (Their speed is measured on the device by
// bench/, never here.)
#include <gtest/gtest.h>

#include <string>

#include "cli.h"

namespace fp4kv::test {
namespace {

// `--help` after an unknown subcommand prints the main help and exits 0, so look for an
// option only `bench decode` has.
bool bench_built() { return run_cli("bench decode --help").output.find("--pages-per-split") != std::string::npos; }

void expect_error(const std::string& args, const std::string& says) {
  const CliResult r = run_cli("bench decode " + args);
  EXPECT_NE(r.code, 0) << args;
  EXPECT_NE(r.output.find(says), std::string::npos) << args << "\n" << r.output;
}

TEST(CliBench, BadArgumentsGetClearErrors) {
  if (!bench_built()) GTEST_SKIP() << "fp4kv bench needs a CUDA build";
  expect_error("--shapes llama-70b", "unknown shape 'llama-70b'");
  expect_error("--shapes deepseek-v3-mla", "fp4kv bench mla");
  expect_error("--contexts 4096,abc", "contexts must be positive integers, got 'abc'");
  expect_error("--batches 0", "batches must be positive integers, got '0'");
  expect_error("--contexts 4k", "contexts must be positive integers, got '4k'");
  expect_error("--presets nvfp4,nvfp9", "nvfp9");
  expect_error("--pages-per-split -1", "pages-per-split");
}

// `fp4kv bench mla` refuses what its kernels cannot run, by name, before any GPU work.
TEST(CliBench, MlaBadArgumentsGetClearErrors) {
  if (!bench_built()) GTEST_SKIP() << "fp4kv bench needs a CUDA build";
  auto expect_mla_error = [](const std::string& args, const std::string& says) {
    const CliResult r = run_cli("bench mla " + args);
    EXPECT_NE(r.code, 0) << args;
    EXPECT_NE(r.output.find(says), std::string::npos) << args << "\n" << r.output;
  };
  expect_mla_error("--heads 24", "heads 24");
  expect_mla_error("--presets bf16,fp8", "fp8");
  expect_mla_error("--presets nvfp4-native", "mixed mode");
  expect_mla_error("--presets nvfp4,nvfp9", "nvfp9");
  expect_mla_error("--contexts 0", "contexts must be positive integers");
}

}  // namespace
}  // namespace fp4kv::test
