// The engine API: submit prompts (token ids or text), read each request's tokens as a stream,
// cancel, step the scheduler (by hand, until idle, or on a background worker), read counters.
//
// Thread model: submit, cancel, next and counters may be called from any thread. Steps run
// one at a time (a step mutex); a step takes the new submissions and cancels from an inbox
// at its start (the step boundary), runs the scheduler without holding the inbox lock, then
// appends what it emitted to the per-request streams and wakes their readers. An HTTP server
// with server-sent events runs one reader per connection: it loops on next(id, timeout),
// writing each chunk as an event until the chunk says finished.
//
// Invariants: request ids are unique and never reused; a stream delivers every emitted token
// once, in order, then one finished chunk, after which the stream is forgotten.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "fp4kv/engine/scheduler.h"

namespace fp4kv::engine {

struct RequestParams {
  SamplingRow sampling;           // request_id keys the draws; 0 takes the engine's request id
  int max_tokens = 64;
  std::vector<std::string> stop;
  std::vector<int> stop_token_ids;
  bool stop_at_eos = true;
  int logprobs = -1;              // -1: none; 0..kMaxTopLogprobs (backend.h): per token, with alternatives
};

// Text to token ids and back (model/byte_tokenizer.h's encode_bytes/decode_bytes for pk8l):
// `encode` as prompts are fed (special tokens such as a BOS added), `encode_text` the text's
// tokens alone (empty: encode adds none).
struct TextCodec {
  std::function<std::vector<int>(std::string_view)> encode;
  Detokenize decode;
  std::function<std::vector<int>(std::string_view)> encode_text = {};
};

// A stream read: tokens emitted since the last read; finished != none ends the stream.
struct StreamChunk {
  std::vector<int> tokens;
  std::vector<TokenLogprobs> logprobs;  // one per token when the request asked for them
  FinishReason finished = FinishReason::none;
  bool timed_out = false;  // nothing arrived within the timeout
};

class Engine {
 public:
  // The engine owns the backend. Throws Error for a bad config.
  Engine(std::unique_ptr<Backend> backend, const SchedulerConfig& config, TextCodec codec);
  ~Engine();  // stops the worker

  // Validates (throws Error naming the bad value) and queues; returns the request id.
  uint64_t submit(std::vector<int> prompt, RequestParams params);
  uint64_t submit(std::string_view text, RequestParams params);
  // Cancels a queued or running request: its blocks are freed at the next step boundary and
  // its stream ends with FinishReason::cancelled. False when unknown or already finished.
  bool cancel(uint64_t id);
  // Waits up to `timeout` for tokens or the end of request `id`'s stream. Throws Error for
  // an unknown id (never submitted, or its end already read).
  StreamChunk next(uint64_t id, std::chrono::milliseconds timeout);

  // One scheduler step; returns whether work is left.
  bool step();
  void run_until_idle();
  // A background worker stepping while there is work (sleeping on a condition otherwise).
  void start();
  void stop();

  SchedulerCounters counters() const;
  // Throws Error unless the block pool's bookkeeping is consistent (tests).
  void check_blocks() const;

 private:
  struct Stream {
    std::vector<int> tokens;
    std::vector<TokenLogprobs> logprobs;
    FinishReason finished = FinishReason::none;
  };
  bool take_inbox();
  void publish(const std::vector<Emitted>& emitted);
  void worker_loop();

  std::unique_ptr<Backend> backend_;
  TextCodec codec_;
  std::unique_ptr<Scheduler> scheduler_;

  mutable std::mutex step_mutex_;  // one step at a time; guards scheduler_
  mutable std::mutex mutex_;  // guards everything below
  std::condition_variable stream_cv_;
  std::condition_variable work_cv_;
  uint64_t next_id_ = 1;
  std::vector<std::pair<uint64_t, RequestSpec>> inbox_;
  std::vector<uint64_t> cancel_inbox_;
  std::map<uint64_t, Stream> streams_;
  SchedulerCounters counters_;
  bool scheduler_idle_ = true;
  bool stopping_ = false;
  std::thread worker_;
};

}  // namespace fp4kv::engine
