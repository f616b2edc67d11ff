// Text generation on the CPU: the float32 Qwen3 runner over the recipe's quantized cache
// (eval::recipe_attention: every new token is a decode step over the quantized pages and
// BF16 sink/recent rows the recipe keeps, exactly as the GPU cache holds them), tokens drawn
// by the sampling rule of core/sampling_rule.h (ref/sampling.h). Slow but exact: the CPU twin of the GPU engine's
// prefill and decode steps, so `fp4kv generate` works on every machine.
//
// Invariants: the prompt is prefilled once; each generated token is one step that extends
// the kept K/V by one position; generation stops at max_tokens or at an EOS token (which is
// reported, not printed as text).
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "fp4kv/model/qwen3.h"
#include "fp4kv/ref/sampling.h"

namespace fp4kv::engine {

struct GenerateOptions {
  int max_tokens = 64;            // tokens to generate at most (>= 1)
  // Temperature, top-k, top-p, seed and the request id of the draws (greedy by default);
  // the step is the token's index in the generation.
  SamplingRow sampling;
  bool stop_at_eos = true;
};

struct GenerateStats {
  int prompt_tokens = 0;
  int generated = 0;             // tokens drawn (the EOS included when it stopped there)
  bool stopped_at_eos = false;
  double prefill_seconds = 0.0;  // the prompt's forward pass and the first token's draw
  double decode_seconds = 0.0;   // every later step
  // Time per output token after the first, and the decode rate.
  double seconds_per_token() const { return generated > 1 ? decode_seconds / (generated - 1) : 0.0; }
  double tokens_per_second() const { return decode_seconds > 0 ? (generated - 1) / decode_seconds : 0.0; }
};

// Throws fp4kv::Error for an empty prompt, bad options, or a sequence beyond the model's
// max_position_embeddings (shared by the CPU and GPU generators).
void check_generate_options(const model::Qwen3Config& config, const std::vector<int>& prompt,
                            const GenerateOptions& options);

// Prefills `prompt` and generates; calls on_token(token) as each token is drawn (before the
// next step), so the caller can stream it. Throws fp4kv::Error for an empty prompt, bad
// options, or a sequence beyond the model's max_position_embeddings.
GenerateStats generate_on_cpu(const model::Qwen3Model& model, const model::AttentionFn& attend,
                              const std::vector<int>& prompt, const GenerateOptions& options,
                              const std::function<void(int token)>& on_token);

}  // namespace fp4kv::engine
