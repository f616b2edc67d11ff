// check_output_writable and write_output_file: a result is either written whole or the
// failure is an Error naming the option, whatever the path is (missing folder, directory,
// full disk).
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>

#include "fp4kv/core/error.h"
#include "fp4kv/core/output_file.h"
#include "fp4kv/testing/error_of.h"

namespace fp4kv {
namespace {

namespace fs = std::filesystem;

struct TempDir {
  fs::path path = fs::temp_directory_path() / ("fp4kv_output_file_" + std::to_string(::getpid()));
  TempDir() { fs::create_directories(path); }
  ~TempDir() { fs::remove_all(path); }
};

std::string read_all(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), {});
}

using testing::error_of;

TEST(OutputFile, WritesTheWholeContent) {
  TempDir dir;
  const fs::path p = dir.path / "out.bin";
  std::string content(100000, '\0');
  for (size_t i = 0; i < content.size(); ++i) content[i] = char(i * 7 + 3);
  write_output_file(p.string(), content, "--out");
  EXPECT_EQ(read_all(p), content);
  write_output_file(p.string(), "short", "--out");  // replaces, no leftover bytes
  EXPECT_EQ(read_all(p), "short");
}

TEST(OutputFile, CheckLeavesNoTraceAndKeepsExistingFiles) {
  TempDir dir;
  const fs::path fresh = dir.path / "fresh.json";
  check_output_writable(fresh.string(), "--json");
  EXPECT_FALSE(fs::exists(fresh));
  const fs::path old = dir.path / "old.json";
  std::ofstream(old) << "keep me";
  check_output_writable(old.string(), "--json");
  EXPECT_EQ(read_all(old), "keep me");
}

TEST(OutputFile, MissingFolderAndDirectoryAreErrorsNamingTheOption) {
  TempDir dir;
  const std::string missing = (dir.path / "no_such_folder" / "x.json").string();
  for (const std::string& msg : {error_of([&] { check_output_writable(missing, "--json"); }),
                                 error_of([&] { write_output_file(missing, "x", "--json"); })}) {
    EXPECT_NE(msg.find("--json"), std::string::npos) << msg;
    EXPECT_NE(msg.find(missing), std::string::npos) << msg;
  }
  for (const std::string& msg : {error_of([&] { check_output_writable(dir.path.string(), "--out"); }),
                                 error_of([&] { write_output_file(dir.path.string(), "x", "--out"); })}) {
    EXPECT_NE(msg.find("--out"), std::string::npos) << msg;
    EXPECT_NE(msg.find("is a directory"), std::string::npos) << msg;
  }
  EXPECT_NE(error_of([] { check_output_writable("", "--out"); }).find("empty"), std::string::npos);
}

TEST(OutputFile, FullDiskIsAnError) {
  if (!fs::exists("/dev/full")) GTEST_SKIP() << "no /dev/full on this system";
  // /dev/full accepts the open and fails the flush, as a full disk does.
  check_output_writable("/dev/full", "--json");
  const std::string msg = error_of([] { write_output_file("/dev/full", std::string(10000, 'x'), "--json"); });
  EXPECT_NE(msg.find("--json"), std::string::npos) << msg;
  EXPECT_NE(msg.find("No space left on device"), std::string::npos) << msg;
}

}  // namespace
}  // namespace fp4kv
