// Continuous batching over a Backend, in the spirit of vLLM: requests wait in a FIFO queue,
// each step runs the running requests' decode tokens and prefill chunks under a token budget,
// admits waiting requests whose blocks fit, and retires finished ones.
//
// A step (step()):
//  1. cancelled requests are retired (blocks freed, state dropped);
//  2. decode: every running request with one token left to feed (oldest first) gets a block
//     for it; when none is free the NEWEST running request is preempted (blocks freed, state
//     dropped, back to the front of the queue) until the block fits or the request itself
//     was the newest;
//  3. prefill: running requests with more to feed get a chunk of min(left, prefill_chunk,
//     budget left) tokens (their blocks were reserved at admission);
//  4. admission: while the queue's front fits (blocks for its prompt and any tokens it
//     already produced), the batch has room and budget is left, it is admitted and gets its
//     first chunk; the queue is FIFO, a request never overtakes an older one;
//  5. the backend runs the decode batch and the chunks; every request whose chunk reached
//     its end draws its next token by the sampling rule with step = its index in the
//     generation, so a token depends on (logits, params, seed, request id, step) alone;
//  6. finished requests (EOS, max_tokens, a stop string) are retired.
// A preempted request is recomputed later from its prompt and the tokens it produced; those
// are not emitted again. Single-threaded: the Engine serializes calls.
//
// Invariants: a running request holds blocks for every token fed to its state; tokens are
// emitted once, in order; a stop string and any text after it are never emitted (tokens
// whose text could still begin a stop string are held back until it cannot).
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "fp4kv/core/sampling_rule.h"
#include "fp4kv/engine/backend.h"
#include "fp4kv/engine/block_allocator.h"

namespace fp4kv::engine {

// The prefill chunk `fp4kv generate` and `fp4kv serve` run with, also serve's per-step token
// budget (vLLM's budget for chunked prefill): a 32K-token prompt of the Qwen3-4B shape is
// prefilled in 1.5 s in 2048-token chunks on the H200, in 8.9 s in 128-token ones (each chunk
// re-reads the whole prefix; docs/PERF.md). A step that carries a full chunk delays the
// running decodes by that chunk's forward (76 ms per chunk over an 8K-token prompt there).
inline constexpr int kServingPrefillChunk = 2048;

struct SchedulerConfig {
  int max_batch = 8;              // running requests at most
  int max_step_tokens = 256;      // tokens fed per step (decode + prefill), >= max_batch
  int prefill_chunk = 128;        // prompt tokens one request feeds per step at most
  int total_blocks = 64;          // the block pool
};

struct RequestSpec {
  std::vector<int> prompt;
  SamplingRow sampling;           // step is set per token; request_id keys the draws
  int max_tokens = 64;
  std::vector<std::string> stop;  // generation ends before the first occurrence of any
  std::vector<int> stop_token_ids;  // generation ends at any of these tokens (emitted with its text)
  bool stop_at_eos = true;        // an EOS token ends generation (it is emitted, with no text)
  int logprobs = -1;              // -1: none; 0..kMaxTopLogprobs: each token's and that many alternatives
};

enum class FinishReason { none, eos, length, stop, cancelled };
const char* finish_reason_name(FinishReason r);

// Bytes at the end of `text` that could begin one of `needles` (the longest such run): text
// a stream holds back until it is known not to start one (stop strings here; the server's
// tool-call tag).
size_t partial_match_at_end(const std::string& text, const std::vector<std::string>& needles);

// What a step produced for one request: newly emitted tokens, and the end when it finished.
struct Emitted {
  uint64_t id = 0;
  std::vector<int> tokens;
  std::vector<TokenLogprobs> logprobs;  // one per token when the request asked for them
  FinishReason finished = FinishReason::none;
};

struct SchedulerCounters {
  int running = 0;
  int waiting = 0;
  long long prompt_tokens = 0;     // of admitted requests (each counted once)
  long long generated_tokens = 0;  // drawn (each counted once, recomputation not counted)
  long long fed_tokens = 0;        // fed to the backend (recomputation included)
  int blocks_used = 0;
  int blocks_free = 0;
  long long preemptions = 0;
  long long finished = 0;
  long long steps = 0;
};

// Token ids to text, for stop strings (model/byte_tokenizer.h's decode_bytes for pk8l).
using Detokenize = std::function<std::string(const std::vector<int>&)>;

class Scheduler {
 public:
  // `backend` must outlive the scheduler. Throws Error for a bad config.
  Scheduler(Backend& backend, const SchedulerConfig& config, Detokenize detokenize);
  ~Scheduler();

  // Throws Error naming the bad value: empty prompt, max_tokens < 1, bad sampling, a request
  // the pool or the model's context can never hold. Const and config-only: safe to call
  // from any thread.
  void validate(const RequestSpec& spec) const;
  // Queues a validated request under a fresh `id` (unique, never reused).
  void add(uint64_t id, RequestSpec spec);
  // Retires the request at the next step; false when it is unknown or already finished.
  bool cancel(uint64_t id);

  // One step (see the file comment); the tokens emitted and the requests that finished.
  std::vector<Emitted> step();
  bool idle() const;
  SchedulerCounters counters() const;
  const BlockAllocator& blocks() const { return blocks_; }
  const SchedulerConfig& config() const { return config_; }

 private:
  struct Sequence;
  struct Plan;

  void preempt_newest();
  void plan_decodes(Plan& plan);
  void plan_prefills(Plan& plan);
  void admit(Plan& plan);
  void execute(const Plan& plan, std::vector<Emitted>& out);
  // How to draw `s`'s next token (its step = the token's index in the generation).
  static DrawSpec next_draw(const Sequence& s);
  // Appends the drawn token to `s`, emitting and finishing as it says.
  void take(Sequence& s, const TokenDraw& drawn, std::vector<Emitted>& out);
  void retire(Sequence& s, FinishReason reason, std::vector<Emitted>& out);
  void emit_ready(Sequence& s, Emitted& e);

  Backend& backend_;
  SchedulerConfig config_;
  Detokenize detokenize_;
  BlockAllocator blocks_;
  std::deque<std::unique_ptr<Sequence>> waiting_;
  std::vector<std::unique_ptr<Sequence>> running_;  // admission order: oldest first
  std::vector<uint64_t> cancels_;
  SchedulerCounters counters_;
};

}  // namespace fp4kv::engine
