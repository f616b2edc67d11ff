// What the scheduler drives: a model that keeps per-request K/V state, extends it by a run of
// tokens (prefill chunk) or by one token each for a batch (decode), and forgets it (drop).
// The CPU backend (cpu_backend.h) is the float32 runner over the recipe's quantized cache;
// the GPU engine is a second implementation.
//
// Invariants: a request's state holds the K/V of the tokens fed to it so far, in order; the
// first prefill of a request (or the first after drop) starts at position 0; logits are
// [vocab] per row, for the last token fed.
#pragma once

#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "fp4kv/core/sampling_rule.h"

namespace fp4kv::engine {

// Most alternatives a request may ask log-probabilities for (OpenAI's completions limit).
inline constexpr int kMaxTopLogprobs = 5;

// Log-probabilities of one drawn token: the log-softmax of the step's raw logits (the model's
// distribution: temperature 1, no top-k/top-p), the drawn token's and the `top` most likely
// tokens' (descending, ties by lower id).
struct TokenLogprobs {
  float logprob = 0.0f;
  std::vector<std::pair<int, float>> top;
};

// How to draw one token: the sampling row (its step set), and -1 for no log-probabilities or
// 0..kMaxTopLogprobs for the drawn token's and that many top alternatives.
struct DrawSpec {
  SamplingRow sampling;
  int logprobs = -1;
};
struct TokenDraw {
  int token = 0;
  std::optional<TokenLogprobs> logprobs;
};

// The log-probabilities of `token` and the top `top` tokens of one row of logits.
TokenLogprobs token_logprobs(const float* logits, int vocab, int token, int top);

class Backend {
 public:
  virtual ~Backend() = default;

  virtual int vocab_size() const = 0;
  virtual bool is_eos(int token) const = 0;
  // Longest sequence (prompt + generated) the model takes; 0 when unbounded.
  virtual int max_positions() const = 0;

  // Feeds `tokens` (non-empty) to `request`'s state, creating it when absent; returns the
  // logits [vocab] of the last of them.
  virtual std::vector<float> prefill(uint64_t request, const std::vector<int>& tokens) = 0;
  // Feeds tokens[i] to requests[i]'s (existing) state; returns logits [n][vocab].
  virtual std::vector<float> decode(const std::vector<uint64_t>& requests, const std::vector<int>& tokens) = 0;
  // Forgets `request`'s state (no-op when it has none).
  virtual void drop(uint64_t request) = 0;

  // decode() then one token per request drawn by the sampling rule with draws[i] (and its
  // log-probabilities when asked). The default draws on the host from decode()'s logits; a
  // backend whose logits live on a device draws there and copies only the tokens (and the
  // logits only of steps that ask for log-probabilities).
  virtual std::vector<TokenDraw> decode_and_draw(const std::vector<uint64_t>& requests, const std::vector<int>& tokens,
                                                 const std::vector<DrawSpec>& draws);
  // prefill() then the token drawn from the last position's logits with `draw`.
  virtual TokenDraw prefill_and_draw(uint64_t request, const std::vector<int>& tokens, const DrawSpec& draw);
};

}  // namespace fp4kv::engine
