// The server's Prometheus metrics: the engine's scheduler counters (requests running and
// waiting, tokens in and out, KV blocks used and free, preemptions) read at scrape time, and
// what only the HTTP layer sees (requests by outcome, client disconnects, time to first token
// and time per output token as histograms).
//
// Invariants: counters only grow; histogram buckets are cumulative (Prometheus `le`), the
// +Inf bucket equals _count. Thread-safe: handlers record from many threads.
#pragma once

#include <array>
#include <mutex>
#include <string>

#include "fp4kv/engine/scheduler.h"

namespace fp4kv::serve {

// Latency histogram with fixed upper bounds in seconds (CPU decode is slow, GPU fast: the
// bounds span both).
class Histogram {
 public:
  static constexpr std::array<double, 12> kBoundsSeconds = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
                                                            0.1,   0.25,   0.5,   1.0,  2.5,   10.0};
  void observe(double seconds);
  // The `name_bucket`, `name_sum`, `name_count` lines.
  std::string render(const std::string& name, const std::string& help) const;

 private:
  std::array<long long, kBoundsSeconds.size()> buckets_{};  // per bound, not cumulative
  long long count_ = 0;
  double sum_ = 0;
};

class ServerMetrics {
 public:
  void request_finished(bool ok);   // a completion request answered (ok) or refused/failed
  void client_disconnected();       // a stream's client left; its request was cancelled
  void observe_ttft(double seconds);
  void observe_tpot(double seconds);
  long long disconnects() const;
  // Prometheus text exposition (format 0.0.4) of these metrics and the engine's counters.
  std::string render(const engine::SchedulerCounters& engine) const;

 private:
  mutable std::mutex mutex_;
  long long ok_ = 0, failed_ = 0, disconnects_ = 0;
  Histogram ttft_, tpot_;
};

}  // namespace fp4kv::serve
