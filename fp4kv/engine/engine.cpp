#include "fp4kv/engine/engine.h"

#include <algorithm>
#include <utility>

#include "fp4kv/core/error.h"

namespace fp4kv::engine {

Engine::Engine(std::unique_ptr<Backend> backend, const SchedulerConfig& config, TextCodec codec)
    : backend_(std::move(backend)), codec_(std::move(codec)) {
  require(backend_ != nullptr, "Engine: no backend");
  require(bool(codec_.encode) && bool(codec_.decode), "Engine: the text codec lacks encode or decode");
  scheduler_ = std::make_unique<Scheduler>(*backend_, config, codec_.decode);
  counters_ = scheduler_->counters();
}

Engine::~Engine() { stop(); }

uint64_t Engine::submit(std::vector<int> prompt, RequestParams params) {
  RequestSpec spec;
  spec.prompt = std::move(prompt);
  spec.sampling = params.sampling;
  spec.max_tokens = params.max_tokens;
  spec.stop = std::move(params.stop);
  spec.stop_token_ids = std::move(params.stop_token_ids);
  spec.stop_at_eos = params.stop_at_eos;
  spec.logprobs = params.logprobs;
  std::lock_guard<std::mutex> lock(mutex_);
  const uint64_t id = next_id_;
  if (spec.sampling.request_id == 0) spec.sampling.request_id = id;
  scheduler_->validate(spec);  // const and config-only: safe beside a running step
  ++next_id_;
  inbox_.emplace_back(id, std::move(spec));
  streams_[id] = Stream{};
  ++counters_.waiting;
  work_cv_.notify_all();
  return id;
}

uint64_t Engine::submit(std::string_view text, RequestParams params) {
  return submit(codec_.encode(text), std::move(params));
}

bool Engine::cancel(uint64_t id) {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto stream = streams_.find(id);
  if (stream == streams_.end() || stream->second.finished != FinishReason::none) return false;
  const auto queued = std::find_if(inbox_.begin(), inbox_.end(), [id](const auto& e) { return e.first == id; });
  if (queued != inbox_.end()) {  // never reached the scheduler: ends here
    inbox_.erase(queued);
    stream->second.finished = FinishReason::cancelled;
    stream_cv_.notify_all();
    return true;
  }
  if (std::find(cancel_inbox_.begin(), cancel_inbox_.end(), id) == cancel_inbox_.end()) cancel_inbox_.push_back(id);
  work_cv_.notify_all();
  return true;
}

StreamChunk Engine::next(uint64_t id, std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mutex_);
  auto it = streams_.find(id);
  require(it != streams_.end(), "Engine::next: unknown request id " + std::to_string(id));
  const auto ready = [&] { return !it->second.tokens.empty() || it->second.finished != FinishReason::none; };
  StreamChunk chunk;
  if (!stream_cv_.wait_for(lock, timeout, ready)) {
    chunk.timed_out = true;
    return chunk;
  }
  chunk.tokens = std::move(it->second.tokens);
  it->second.tokens.clear();
  chunk.logprobs = std::move(it->second.logprobs);
  it->second.logprobs.clear();
  chunk.finished = it->second.finished;
  if (chunk.finished != FinishReason::none) streams_.erase(it);
  return chunk;
}

// Moves submissions and cancels into the scheduler (called under step_mutex_). Returns
// whether the scheduler has work.
bool Engine::take_inbox() {
  std::vector<std::pair<uint64_t, RequestSpec>> inbox;
  std::vector<uint64_t> cancels;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    inbox.swap(inbox_);
    cancels.swap(cancel_inbox_);
  }
  for (auto& [id, spec] : inbox) scheduler_->add(id, std::move(spec));
  for (uint64_t id : cancels) scheduler_->cancel(id);
  return !scheduler_->idle();
}

void Engine::publish(const std::vector<Emitted>& emitted) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (const Emitted& e : emitted) {
    const auto it = streams_.find(e.id);
    if (it == streams_.end()) continue;
    it->second.tokens.insert(it->second.tokens.end(), e.tokens.begin(), e.tokens.end());
    it->second.logprobs.insert(it->second.logprobs.end(), e.logprobs.begin(), e.logprobs.end());
    if (e.finished != FinishReason::none) it->second.finished = e.finished;
  }
  counters_ = scheduler_->counters();
  counters_.waiting += int(inbox_.size());
  scheduler_idle_ = scheduler_->idle();
  stream_cv_.notify_all();
}

bool Engine::step() {
  std::lock_guard<std::mutex> step_lock(step_mutex_);
  std::vector<Emitted> emitted;
  if (take_inbox()) emitted = scheduler_->step();
  publish(emitted);
  std::lock_guard<std::mutex> lock(mutex_);
  return !scheduler_idle_ || !inbox_.empty() || !cancel_inbox_.empty();
}

void Engine::run_until_idle() {
  while (step()) {
  }
}

void Engine::worker_loop() {
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mutex_);
      work_cv_.wait(lock, [this] { return stopping_ || !inbox_.empty() || !cancel_inbox_.empty() || !scheduler_idle_; });
      if (stopping_) return;
    }
    step();
  }
}

void Engine::start() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (worker_.joinable()) return;
  stopping_ = false;
  worker_ = std::thread(&Engine::worker_loop, this);
}

void Engine::stop() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
    work_cv_.notify_all();
  }
  if (worker_.joinable()) worker_.join();
}

SchedulerCounters Engine::counters() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return counters_;
}

void Engine::check_blocks() const {
  std::lock_guard<std::mutex> step_lock(step_mutex_);
  scheduler_->blocks().check();
}

}  // namespace fp4kv::engine
