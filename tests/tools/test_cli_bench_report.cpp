// `fp4kv bench-report` re-renders a sweep's JSON on a CPU-only machine, and rejects bad
// input with exit code 2 and a message naming it.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "cli.h"
#include "sample_sweep.h"

namespace fp4kv::test {
namespace {

namespace fs = std::filesystem;

fs::path temp_dir() {
  fs::path d = fs::temp_directory_path() / ("fp4kv_bench_report_" + std::to_string(::getpid()));
  fs::create_directories(d);
  return d;
}

void write_text(const fs::path& p, const std::string& text) { std::ofstream(p) << text; }

std::string read_text(const fs::path& p) {
  std::ifstream in(p);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

TEST(CliBenchReport, RendersAllThreeOutputs) {
  const fs::path dir = temp_dir();
  write_text(dir / "sweep.json", kSampleSweep);
  const CliResult r = run_cli("bench-report --json " + (dir / "sweep.json").string() + " --markdown " +
                              (dir / "sweep.md").string() + " --svg " + (dir / "sweep.svg").string() +
                              " --perf-tables " + (dir / "perf.md").string() + " --contexts 4096");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(read_text(dir / "sweep.md").find("| qwen3-4b | 4K | 8 | nvfp4 | 40.0 | 126.0 | 3.15 | 70% | 2.50 |"),
            std::string::npos);
  const std::string perf = read_text(dir / "perf.md");
  EXPECT_NE(perf.find("| nvfp4 | 40.0 us, 3.15 TB/s (70%), 2.50x / 3.00x |"), std::string::npos) << perf;
  EXPECT_EQ(perf.find("context 128K"), std::string::npos) << "only --contexts 4096 was asked for";
  const std::string svg = read_text(dir / "sweep.svg");
  EXPECT_EQ(svg.rfind("<svg ", 0), 0u);
  EXPECT_NE(svg.find("</svg>"), std::string::npos);
  fs::remove_all(dir);
}

void expect_exit2(const std::string& args, const std::string& says) {
  const CliResult r = run_cli("bench-report " + args);
  EXPECT_EQ(r.code, 2) << args << "\n" << r.output;
  EXPECT_NE(r.output.find(says), std::string::npos) << args << "\n" << r.output;
}

TEST(CliBenchReport, BadInputExitsWithTwo) {
  const fs::path dir = temp_dir();
  const std::string md = " --markdown " + (dir / "out.md").string();
  write_text(dir / "broken.json", "{\"date\": \"2026-12-01\", \"points\": [");
  expect_exit2("--json " + (dir / "broken.json").string() + md, "not valid JSON");
  std::string no_tbs = kSampleSweep;
  no_tbs.replace(no_tbs.find("\"read_tbs\""), 10, "\"read_tb\"");
  write_text(dir / "no_tbs.json", no_tbs);
  expect_exit2("--json " + (dir / "no_tbs.json").string() + md, "missing field \"read_tbs\"");
  expect_exit2("--json " + (dir / "absent.json").string() + md, "cannot read");
  write_text(dir / "sweep.json", kSampleSweep);
  expect_exit2("--json " + (dir / "sweep.json").string(), "nothing to write");
  expect_exit2("--json " + (dir / "sweep.json").string() + " --svg " + (dir / "no_such_dir" / "x.svg").string(),
               "--svg");
  expect_exit2("--json " + (dir / "sweep.json").string() + md + " --contexts 4k", "'4k'");
  EXPECT_FALSE(fs::exists(dir / "out.md")) << "nothing is written when the input is bad";
  fs::remove_all(dir);
}

}  // namespace
}  // namespace fp4kv::test
