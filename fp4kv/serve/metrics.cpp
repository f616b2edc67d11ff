#include "fp4kv/serve/metrics.h"

#include <cstdio>
#include <sstream>

namespace fp4kv::serve {

namespace {

std::string number(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.9g", v);
  return buf;
}

void metric(std::ostringstream& o, const char* name, const char* type, const char* help, double value) {
  o << "# HELP " << name << ' ' << help << "\n# TYPE " << name << ' ' << type << '\n' << name << ' ' << number(value)
    << '\n';
}

}  // namespace

void Histogram::observe(double seconds) {
  for (size_t i = 0; i < kBoundsSeconds.size(); ++i)
    if (seconds <= kBoundsSeconds[i]) {
      ++buckets_[i];
      break;
    }
  ++count_;
  sum_ += seconds;
}

std::string Histogram::render(const std::string& name, const std::string& help) const {
  std::ostringstream o;
  o << "# HELP " << name << ' ' << help << "\n# TYPE " << name << " histogram\n";
  long long cumulative = 0;
  for (size_t i = 0; i < kBoundsSeconds.size(); ++i) {
    cumulative += buckets_[i];
    o << name << "_bucket{le=\"" << number(kBoundsSeconds[i]) << "\"} " << cumulative << '\n';
  }
  o << name << "_bucket{le=\"+Inf\"} " << count_ << '\n';
  o << name << "_sum " << number(sum_) << '\n' << name << "_count " << count_ << '\n';
  return o.str();
}

void ServerMetrics::request_finished(bool ok) {
  std::lock_guard<std::mutex> lock(mutex_);
  ++(ok ? ok_ : failed_);
}

void ServerMetrics::client_disconnected() {
  std::lock_guard<std::mutex> lock(mutex_);
  ++disconnects_;
}

void ServerMetrics::observe_ttft(double seconds) {
  std::lock_guard<std::mutex> lock(mutex_);
  ttft_.observe(seconds);
}

void ServerMetrics::observe_tpot(double seconds) {
  std::lock_guard<std::mutex> lock(mutex_);
  tpot_.observe(seconds);
}

long long ServerMetrics::disconnects() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return disconnects_;
}

std::string ServerMetrics::render(const engine::SchedulerCounters& k) const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::ostringstream o;
  metric(o, "fp4kv_requests_running", "gauge", "Requests in the running batch.", k.running);
  metric(o, "fp4kv_requests_waiting", "gauge", "Requests queued for admission.", k.waiting);
  metric(o, "fp4kv_prompt_tokens_total", "counter", "Prompt tokens of admitted requests.", double(k.prompt_tokens));
  metric(o, "fp4kv_generation_tokens_total", "counter", "Tokens generated.", double(k.generated_tokens));
  metric(o, "fp4kv_kv_blocks_used", "gauge", "KV cache blocks held by requests.", k.blocks_used);
  metric(o, "fp4kv_kv_blocks_free", "gauge", "KV cache blocks free.", k.blocks_free);
  metric(o, "fp4kv_preemptions_total", "counter", "Requests preempted (recomputed later).", double(k.preemptions));
  metric(o, "fp4kv_engine_finished_total", "counter", "Requests the engine retired.", double(k.finished));
  metric(o, "fp4kv_engine_steps_total", "counter", "Scheduler steps.", double(k.steps));
  metric(o, "fp4kv_http_completions_ok_total", "counter", "Completion requests answered.", double(ok_));
  metric(o, "fp4kv_http_completions_failed_total", "counter", "Completion requests refused or failed.",
         double(failed_));
  metric(o, "fp4kv_client_disconnects_total", "counter", "Streams whose client left (request cancelled).",
         double(disconnects_));
  o << ttft_.render("fp4kv_time_to_first_token_seconds", "Time from submission to the first token.");
  o << tpot_.render("fp4kv_time_per_output_token_seconds", "Mean time per token after the first, per request.");
  return o.str();
}

}  // namespace fp4kv::serve
