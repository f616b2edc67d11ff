// `fp4kv check-model`: pk8l reproduces its reference activations; copies whose bytes no
// longer mean what the header says (BF16 bytes labelled F16) or whose weights moved by one
// bf16 ulp must fail with exit 1 and a MISMATCH verdict.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "cli.h"

namespace fp4kv {
namespace {

namespace fs = std::filesystem;
const fs::path kModel = fs::path(FP4KV_SOURCE_DIR) / "models/pk8l";
const std::string kShard = "model-00001-of-00004.safetensors";  // holds model.embed_tokens.weight first

struct TempDir {
  fs::path path = fs::temp_directory_path() / ("fp4kv_cli_check_" + std::to_string(::getpid()));
  TempDir() { fs::create_directories(path); }
  ~TempDir() { fs::remove_all(path); }
};

std::string read_all(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), {});
}

// A model folder in `dir` linking every pk8l file except kShard, which becomes `shard`.
fs::path copy_with_shard(const fs::path& dir, const std::string& name, const std::string& shard) {
  const fs::path out = dir / name;
  fs::create_directories(out);
  for (const auto& e : fs::directory_iterator(kModel)) {
    if (e.path().filename() == kShard) continue;
    fs::create_symlink(e.path(), out / e.path().filename());
  }
  std::ofstream(out / kShard, std::ios::binary) << shard;
  return out;
}

uint64_t header_length(const std::string& file) {
  uint64_t n = 0;
  std::memcpy(&n, file.data(), 8);
  return n;
}

TEST(CliCheckModel, Pk8lPasses) {
  const test::CliResult r = test::run_cli("check-model --model " + kModel.string());
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("verdict: PASS"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("layer7.k_rope"), std::string::npos) << r.output;  // every reference tensor is compared
  EXPECT_NE(r.output.find("logits"), std::string::npos) << r.output;
}

TEST(CliCheckModel, HeaderDtypeThatDoesNotMatchTheBytesFails) {
  TempDir dir;
  std::string shard = read_all(kModel / kShard);
  const uint64_t n = header_length(shard);
  std::string header = shard.substr(8, n);
  const std::string bf16 = "\"BF16\"", f16 = "\"F16\"";
  int relabelled = 0;
  for (size_t at = header.find(bf16); at != std::string::npos; at = header.find(bf16, at)) {
    header.replace(at, bf16.size(), f16);
    ++relabelled;
  }
  ASSERT_GT(relabelled, 0);
  header.resize(n, ' ');  // same length: every data offset stays valid, only the dtype lies
  shard.replace(8, n, header);
  const fs::path model = copy_with_shard(dir.path, "relabelled", shard);
  const test::CliResult r = test::run_cli("check-model --model " + model.string());
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_NE(r.output.find("verdict: MISMATCH"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("PASS"), std::string::npos) << r.output;
}

TEST(CliCheckModel, WeightsMovedByOneBf16UlpFail) {
  TempDir dir;
  std::string shard = read_all(kModel / kShard);
  // model.embed_tokens.weight is the shard's first tensor: [264, 512] BF16 at data offset 0.
  const size_t data = 8 + header_length(shard), bytes = 264 * 512 * 2;
  ASSERT_GE(shard.size(), data + bytes);
  for (size_t i = 0; i < bytes; i += 2) shard[data + i] = char(shard[data + i] ^ 1);  // low mantissa bit
  const fs::path model = copy_with_shard(dir.path, "perturbed", shard);
  const test::CliResult r = test::run_cli("check-model --model " + model.string());
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_NE(r.output.find("verdict: MISMATCH"), std::string::npos) << r.output;
}

TEST(CliCheckModel, MissingReferenceIsAnInputError) {
  TempDir dir;
  const test::CliResult r =
      test::run_cli("check-model --model " + kModel.string() + " --reference " + (dir.path / "none").string());
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("--reference"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace fp4kv
