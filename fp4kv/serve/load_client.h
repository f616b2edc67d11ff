// A bounded load generator and soak for a running `fp4kv serve` (or any OpenAI-compatible
// completions server): N client threads each send M streaming completions over real HTTP,
// some abandoning their stream after its first event (a client that leaves), and the report
// gives requests/s, output tokens/s, p50/p99 time to first token and time per output token,
// and what the server's /metrics say once it has settled (running requests, KV blocks in use:
// a soak must end with none).
//
// Invariants: the run stops by itself (every request is bounded by max_tokens and a read
// timeout); a stream counts as completed only when it ends with `data: [DONE]` after a usage
// chunk; nothing but loopback is needed.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace fp4kv::serve {

struct LoadOptions {
  std::string host = "127.0.0.1";
  int port = 8000;
  std::string api_key;
  int clients = 16;
  int requests_per_client = 8;
  std::vector<std::string> prompts = {"The cat sat on the", "Once upon a time", "To be or not to be",
                                      "In the beginning"};  // cycled over the requests
  int max_tokens = 32;
  float temperature = 0.0f;
  double cancel_fraction = 0.0;  // requests whose client leaves after the first event
  uint64_t seed = 1;
  int read_timeout_seconds = 300;
  int settle_seconds = 60;       // how long to wait for /metrics to show no running request
};

struct LoadReport {
  int sent = 0, completed = 0, cancelled = 0, failed = 0;
  long long output_tokens = 0;  // of completed requests (usage.completion_tokens)
  double seconds = 0;
  double ttft_p50 = 0, ttft_p99 = 0, tpot_p50 = 0, tpot_p99 = 0;  // seconds
  double running_after = -1, waiting_after = -1, blocks_used_after = -1;  // from /metrics (-1: unread)
  std::vector<std::string> failures;  // the first few failure messages

  double requests_per_second() const { return seconds > 0 ? completed / seconds : 0; }
  double tokens_per_second() const { return seconds > 0 ? output_tokens / seconds : 0; }
  std::string table() const;
  std::string json() const;
};

// The value of a sample of the server's /metrics (Prometheus text), or -1 when the server
// does not answer or has no such sample.
double server_metric(const std::string& host, int port, const std::string& name);

// Runs the load; throws fp4kv::Error for bad options (non-positive counts, a fraction outside
// [0, 1], no prompts).
LoadReport run_load(const LoadOptions& options);

}  // namespace fp4kv::serve
