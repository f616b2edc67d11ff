// The plot of an e2e run (bench/e2e_plot.h) on a small hand-written run: which series it
// draws, which points it leaves out (a cache that did not fit), where a known point lands, and
// the errors for bad JSON.
#include <gtest/gtest.h>

#include <string>

#include "bench/e2e_plot.h"
#include "fp4kv/core/error.h"

namespace fp4kv::bench {
namespace {

constexpr const char* kRun = R"({
 "model": "qwen3-4b:random", "device": "Test GPU <1>", "read_tbs": 4.6,
 "tpot": [
  {"preset": "bf16", "context": 32768, "batch": 1, "tpot_us": 5000.0},
  {"preset": "nvfp4", "context": 32768, "batch": 1, "tpot_us": 4000.0},
  {"preset": "bf16", "context": 262144, "batch": 1, "tpot_us": 12000.0},
  {"preset": "nvfp4", "context": 262144, "batch": 1, "tpot_us": 7000.0},
  {"preset": "bf16", "context": 262144, "batch": 8, "note": "does not fit"},
  {"preset": "nvfp4", "context": 262144, "batch": 8, "tpot_us": 38000.0}
 ],
 "throughput": [
  {"preset": "bf16", "requests": 1, "output_tokens_per_s": 100.0},
  {"preset": "bf16", "requests": 64, "output_tokens_per_s": 300.0},
  {"preset": "nvfp4", "requests": 1, "output_tokens_per_s": 150.0},
  {"preset": "nvfp4", "requests": 64, "output_tokens_per_s": 660.0}
 ]
})";

int count(const std::string& s, const std::string& what) {
  int n = 0;
  for (size_t p = s.find(what); p != std::string::npos; p = s.find(what, p + 1)) ++n;
  return n;
}

TEST(E2ePlot, DrawsEachPresetAndBatchAndLeavesOutWhatDidNotFit) {
  const E2eRun run = parse_e2e(kRun, "run.json");
  ASSERT_EQ(run.tpot.size(), 6u);
  EXPECT_EQ(run.tpot[4].tpot_us, 0.0);  // "does not fit"
  const std::string svg = e2e_svg(run);
  // TPOT: bf16 and nvfp4 at batch 1, nvfp4 at batch 8 (bf16 at batch 8 has no point);
  // throughput: bf16 and nvfp4.
  EXPECT_EQ(count(svg, "<path "), 5);
  EXPECT_EQ(count(svg, "stroke-dasharray"), 2);  // the batch-8 line and its legend entry
  EXPECT_EQ(count(svg, "<circle "), 5 + 4);       // every drawn point
  EXPECT_NE(svg.find("nvfp4, batch 8"), std::string::npos);
  EXPECT_EQ(svg.find("bf16, batch 8"), std::string::npos);
  EXPECT_NE(svg.find("Test GPU &lt;1&gt;"), std::string::npos);  // escaped
  EXPECT_NE(svg.find(">256K<"), std::string::npos);
  EXPECT_NE(svg.find(">64<"), std::string::npos);
  // TPOT axis: 38 ms rounds up to 50; the x axis spans 32K..256K. nvfp4 at 256K, batch 1
  // (7 ms): x = 60 + 320 = 380, y = 50 + 220 - 7 / 50 * 220 = 239.2.
  EXPECT_NE(svg.find("cx=\"380.0\" cy=\"239.2\""), std::string::npos);
  EXPECT_EQ(svg.find("nan"), std::string::npos);
  EXPECT_EQ(svg.find("inf"), std::string::npos);
}

TEST(E2ePlot, ThroughputOnlyAndTpotOnlyRuns) {
  std::string only_tpot = kRun;
  only_tpot.erase(only_tpot.find(",\n \"throughput\""), only_tpot.rfind(']') + 1 - only_tpot.find(",\n \"throughput\""));
  EXPECT_EQ(count(e2e_svg(parse_e2e(only_tpot, "tpot.json")), "<path "), 3);
  const E2eRun none = parse_e2e(R"({"model": "m", "device": "d"})", "none.json");
  EXPECT_THROW(e2e_svg(none), Error);
}

void expect_rejected(const std::string& json, const std::string& says) {
  try {
    parse_e2e(json, "bad.json");
    ADD_FAILURE() << "accepted: " << json;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << e.what();
  }
}

TEST(E2ePlot, BadJsonIsRejectedNamingTheField) {
  expect_rejected("{\"model\": ", "bad.json: not valid JSON");
  expect_rejected("[1]", "must be a JSON object");
  expect_rejected(R"({"device": "d"})", "missing field \"model\"");
  expect_rejected(R"({"model": "m", "device": "d", "tpot": [{"preset": "x", "context": 1, "batch": 1}]})",
                  "tpot[0]: missing field \"tpot_us\"");
  expect_rejected(R"({"model": "m", "device": "d", "throughput": [{"preset": "x", "requests": "1",
                  "output_tokens_per_s": 1}]})",
                  "throughput[0]: field \"requests\" must be an integer");
  expect_rejected(R"({"model": "m", "device": "d", "tpot": {}})", "\"tpot\" must be an array");
}

}  // namespace
}  // namespace fp4kv::bench
