// The plot of an end-to-end run (`fp4kv bench e2e --json`): TPOT against context (one line
// per preset and batch size; points that did not fit are left out) and output tokens/s
// against concurrent requests (one line per preset), side by side in one SVG. Rendered from
// the JSON alone, so `fp4kv bench e2e --svg` and `fp4kv bench-report --e2e` draw the same
// picture on any machine. CPU only.
//
// The JSON (as cmd_bench_e2e writes it): {"model", "device", "read_tbs", "tpot": [{"preset",
// "context", "batch", "tpot_us" | "note"}...], "throughput": [{"preset", "requests",
// "output_tokens_per_s", "preemptions", "completed"}...], ...}; both arrays are optional.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace fp4kv::bench {

struct E2eTpot {
  std::string preset;
  int context = 0, batch = 0;
  double tpot_us = 0;  // 0: did not fit
};
struct E2eThroughput {
  std::string preset;
  int requests = 0;
  double tokens_per_s = 0;
};
struct E2eRun {
  std::string model, device;
  std::vector<E2eTpot> tpot;
  std::vector<E2eThroughput> throughput;
};

// Parses the e2e JSON; throws Error naming `source` and the bad or missing field.
E2eRun parse_e2e(std::string_view json_text, const std::string& source);

// The SVG; throws Error when the run has neither TPOT nor throughput points.
std::string e2e_svg(const E2eRun& run);

}  // namespace fp4kv::bench
