// Limits of requested work (eval/limits.h): positions, memory estimates and input paths
// are checked with errors naming the option; std::bad_alloc becomes an Error.
#include "fp4kv/eval/limits.h"

#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "fp4kv/core/error.h"
#include "fp4kv/testing/error_of.h"

namespace fp4kv::eval {
namespace {

namespace fs = std::filesystem;

using testing::error_of;

model::Qwen3Config small_config(int max_positions) {
  model::Qwen3Config c;
  c.vocab_size = 1000;
  c.hidden_size = 64;
  c.intermediate_size = 128;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 16;
  c.max_position_embeddings = max_positions;
  return c;
}

TEST(Limits, PositionsBeyondTheModelAreRefused) {
  const model::Qwen3Config c = small_config(1000);
  EXPECT_EQ(error_of([&] { require_within_positions(c, 1000, "--context"); }), "no error");
  const std::string msg = error_of([&] { require_within_positions(c, 1001, "--context"); });
  EXPECT_NE(msg.find("--context"), std::string::npos) << msg;
  EXPECT_NE(msg.find("max_position_embeddings of 1000"), std::string::npos) << msg;
  // A config without max_position_embeddings sets no limit.
  EXPECT_EQ(error_of([&] { require_within_positions(small_config(0), 1 << 30, "--context"); }), "no error");
}

TEST(Limits, ForwardEstimateCoversLogitsAndKeptState) {
  const model::Qwen3Config c = small_config(0);
  const double L = 4096;
  // The logits alone are L x vocab float32 per copy.
  EXPECT_GE(forward_pass_bytes(c, 4096, {.logits_copies = 2}), 2 * L * c.vocab_size * 4);
  // A kept K/V state is every layer's K and V: layers x 2 x kv_heads x L x d floats.
  const double kv = 2.0 * 2 * 2 * L * 16 * 4;
  EXPECT_GE(forward_pass_bytes(c, 4096, {.kv_states = 1}) - forward_pass_bytes(c, 4096, {}), kv * 0.999);
  // Absurd requests stay finite and large instead of wrapping around.
  EXPECT_GE(forward_pass_bytes(c, int64_t(1) << 40, {}), std::ldexp(1.0, 40) * c.vocab_size * 4);
}

TEST(Limits, MemoryBeyondWhatIsAvailableIsRefused) {
  const std::string msg = error_of([] { require_fits_memory(3.0 * (1u << 30), 1u << 30, "--context", "a window"); });
  EXPECT_NE(msg.find("--context"), std::string::npos) << msg;
  EXPECT_NE(msg.find("3.00 GiB"), std::string::npos) << msg;
  EXPECT_NE(msg.find("1.00 GiB"), std::string::npos) << msg;
  EXPECT_EQ(error_of([] { require_fits_memory(1e30, 0, "--context", "x"); }), "no error");  // 0: unknown
  EXPECT_GT(available_memory_bytes(), 0u);  // Linux has /proc/meminfo
}

TEST(Limits, BadAllocBecomesAnErrorNamingTheWork) {
  const std::string msg = error_of([] { with_memory_guard("evaluating 5 windows", []() -> int { throw std::bad_alloc(); }); });
  EXPECT_NE(msg.find("out of memory while evaluating 5 windows"), std::string::npos) << msg;
  EXPECT_EQ(with_memory_guard("adding", [] { return 2 + 3; }), 5);
}

TEST(Limits, InputMustBeARegularFile) {
  const fs::path dir = fs::temp_directory_path() / ("fp4kv_limits_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  std::ofstream(dir / "f.txt") << "x";
  EXPECT_EQ(error_of([&] { require_regular_file((dir / "f.txt").string(), "--text"); }), "no error");
  const std::string d = error_of([&] { require_regular_file(dir.string(), "--text"); });
  EXPECT_NE(d.find("--text"), std::string::npos) << d;
  EXPECT_NE(d.find("is a directory"), std::string::npos) << d;
  EXPECT_NE(error_of([&] { require_regular_file((dir / "no").string(), "--in"); }).find("does not exist"),
            std::string::npos);
  EXPECT_NE(error_of([] { require_regular_file("/dev/null", "--in"); }).find("not a regular file"), std::string::npos);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace fp4kv::eval
