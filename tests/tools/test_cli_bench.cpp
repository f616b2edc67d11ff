// `fp4kv bench decode` checks its arguments before it touches a GPU, so bad input gets a
// clear error on any machine. (Its speed is measured on the device by bench/, never here.)
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
  expect_error("--contexts 4096,abc", "contexts must be positive integers, got 'abc'");
  expect_error("--batches 0", "batches must be positive integers, got '0'");
  expect_error("--contexts 4k", "contexts must be positive integers, got '4k'");
  expect_error("--presets nvfp4,nvfp9", "nvfp9");
  expect_error("--pages-per-split -1", "pages-per-split");
}

}  // namespace
}  // namespace fp4kv::test
