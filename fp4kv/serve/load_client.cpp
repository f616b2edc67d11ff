#include "fp4kv/serve/load_client.h"

#include <httplib.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "fp4kv/core/error.h"

namespace fp4kv::serve {

namespace {

using Clock = std::chrono::steady_clock;
constexpr size_t kKeptFailures = 5;

double seconds_between(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

double percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t i = std::min(v.size() - 1, size_t(q * double(v.size() - 1) + 0.5));
  return v[i];
}

// What one streamed request saw.
struct StreamResult {
  bool completed = false, cancelled = false;
  std::string failure;
  int tokens = 0;
  double ttft = -1, tpot = -1;
};

// Parses the SSE events that have arrived in `buffer` (complete "data: ...\n\n" events),
// noting the time of the first text and the usage.
struct SseReader {
  std::string buffer;
  bool done = false, usage_seen = false, first_text = false;
  int completion_tokens = 0;
  Clock::time_point first, last;

  void feed(const char* data, size_t n, Clock::time_point now) {
    buffer.append(data, n);
    size_t end;
    while ((end = buffer.find("\n\n")) != std::string::npos) {
      const std::string event = buffer.substr(0, end);
      buffer.erase(0, end + 2);
      if (event.rfind("data: ", 0) != 0) continue;
      const std::string payload = event.substr(6);
      if (payload == "[DONE]") {
        done = true;
        continue;
      }
      const auto j = nlohmann::json::parse(payload, nullptr, false);
      if (j.is_discarded()) continue;
      if (j.contains("usage") && j["usage"].is_object()) {
        usage_seen = true;
        completion_tokens = j["usage"].value("completion_tokens", 0);
      }
      if (j.contains("choices") && !j["choices"].empty() && !j["choices"][0].value("text", std::string()).empty()) {
        if (!first_text) first = now;
        first_text = true;
        last = now;
      }
    }
  }
};

StreamResult stream_one(httplib::Client& c, const LoadOptions& o, const std::string& prompt, uint64_t seed, bool leave) {
  nlohmann::json body = {{"prompt", prompt},           {"max_tokens", o.max_tokens}, {"temperature", o.temperature},
                         {"seed", seed},               {"stream", true},
                         {"stream_options", {{"include_usage", true}}}};
  httplib::Request req;
  req.method = "POST";
  req.path = "/v1/completions";
  req.body = body.dump();
  req.set_header("Content-Type", "application/json");
  if (!o.api_key.empty()) req.set_header("Authorization", "Bearer " + o.api_key);
  SseReader sse;
  int reads = 0;
  const Clock::time_point t0 = Clock::now();
  req.content_receiver = [&](const char* d, size_t n, uint64_t, uint64_t) {
    sse.feed(d, n, Clock::now());
    ++reads;
    return !(leave && reads >= 1);  // a leaving client closes the connection after its first read
  };
  httplib::Response res;
  httplib::Error err = httplib::Error::Success;
  const bool ok = c.send(req, res, err);
  StreamResult r;
  if (leave) {
    r.cancelled = true;
    return r;
  }
  if (!ok || res.status != 200 || !sse.done || !sse.usage_seen) {
    r.failure = "status " + std::to_string(res.status) + ", " + httplib::to_string(err) +
                (sse.done ? "" : ", no [DONE]") + (sse.usage_seen ? "" : ", no usage");
    return r;
  }
  r.completed = true;
  r.tokens = sse.completion_tokens;
  if (sse.first_text) {
    r.ttft = seconds_between(t0, sse.first);
    if (r.tokens > 1) r.tpot = seconds_between(sse.first, sse.last) / (r.tokens - 1);
  }
  return r;
}

}  // namespace

double server_metric(const std::string& host, int port, const std::string& name) {
  httplib::Client c(host, port);
  auto r = c.Get("/metrics");
  if (!r || r->status != 200) return -1;
  const size_t at = r->body.find("\n" + name + " ");
  if (at == std::string::npos) return -1;
  return std::stod(r->body.substr(at + name.size() + 2));
}

LoadReport run_load(const LoadOptions& o) {
  require(o.clients >= 1 && o.requests_per_client >= 1, "load: --clients and --requests must be >= 1");
  require(o.cancel_fraction >= 0 && o.cancel_fraction <= 1, "load: --cancel-fraction must be in [0, 1]");
  require(!o.prompts.empty(), "load: no prompts");
  require(o.max_tokens >= 1, "load: --max-tokens must be >= 1");
  std::mutex mutex;
  LoadReport rep;
  std::vector<double> ttft, tpot;
  const Clock::time_point t0 = Clock::now();
  std::vector<std::thread> threads;
  for (int k = 0; k < o.clients; ++k) {
    threads.emplace_back([&, k] {
      httplib::Client c(o.host, o.port);
      c.set_read_timeout(o.read_timeout_seconds, 0);
      std::mt19937_64 rng(o.seed * 1000003 + uint64_t(k));
      std::uniform_real_distribution<double> u(0.0, 1.0);
      for (int i = 0; i < o.requests_per_client; ++i) {
        const size_t n = size_t(k) * o.requests_per_client + i;
        const StreamResult r =
            stream_one(c, o, o.prompts[n % o.prompts.size()], o.seed + n, u(rng) < o.cancel_fraction);
        std::lock_guard<std::mutex> lock(mutex);
        ++rep.sent;
        rep.completed += r.completed;
        rep.cancelled += r.cancelled;
        if (!r.failure.empty()) {
          ++rep.failed;
          if (rep.failures.size() < kKeptFailures) rep.failures.push_back(r.failure);
        }
        rep.output_tokens += r.tokens;
        if (r.ttft >= 0) ttft.push_back(r.ttft);
        if (r.tpot >= 0) tpot.push_back(r.tpot);
      }
    });
  }
  for (std::thread& t : threads) t.join();
  rep.seconds = seconds_between(t0, Clock::now());
  rep.ttft_p50 = percentile(ttft, 0.5);
  rep.ttft_p99 = percentile(ttft, 0.99);
  rep.tpot_p50 = percentile(tpot, 0.5);
  rep.tpot_p99 = percentile(tpot, 0.99);
  // Abandoned streams are cancelled at the server's next step boundary: wait for it to settle.
  const Clock::time_point settle_until = Clock::now() + std::chrono::seconds(o.settle_seconds);
  do {
    rep.running_after = server_metric(o.host, o.port, "fp4kv_requests_running");
    rep.waiting_after = server_metric(o.host, o.port, "fp4kv_requests_waiting");
    rep.blocks_used_after = server_metric(o.host, o.port, "fp4kv_kv_blocks_used");
    if (rep.running_after == 0 && rep.waiting_after == 0 && rep.blocks_used_after == 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  } while (Clock::now() < settle_until);
  return rep;
}

std::string LoadReport::table() const {
  char s[1024];
  std::snprintf(s, sizeof s,
                "requests: %d sent, %d completed, %d left by their client, %d failed in %.2f s\n"
                "throughput: %.2f requests/s, %.1f output tokens/s\n"
                "TTFT p50 %.1f ms, p99 %.1f ms; TPOT p50 %.2f ms, p99 %.2f ms\n"
                "after the run: %g running, %g waiting, %g KV blocks in use\n",
                sent, completed, cancelled, failed, seconds, requests_per_second(), tokens_per_second(), 1e3 * ttft_p50,
                1e3 * ttft_p99, 1e3 * tpot_p50, 1e3 * tpot_p99, running_after, waiting_after, blocks_used_after);
  std::string out = s;
  for (const std::string& f : failures) out += "  failure: " + f + "\n";
  return out;
}

std::string LoadReport::json() const {
  nlohmann::json j = {{"sent", sent},
                      {"completed", completed},
                      {"cancelled", cancelled},
                      {"failed", failed},
                      {"output_tokens", output_tokens},
                      {"seconds", seconds},
                      {"requests_per_s", requests_per_second()},
                      {"tokens_per_s", tokens_per_second()},
                      {"ttft_p50_s", ttft_p50},
                      {"ttft_p99_s", ttft_p99},
                      {"tpot_p50_s", tpot_p50},
                      {"tpot_p99_s", tpot_p99},
                      {"running_after", running_after},
                      {"waiting_after", waiting_after},
                      {"blocks_used_after", blocks_used_after},
                      {"failures", failures}};
  return j.dump(1) + "\n";
}

}  // namespace fp4kv::serve
