#include "fp4kv/engine/cpu_generator.h"

#include <chrono>
#include <string>

#include "fp4kv/core/error.h"

namespace fp4kv::engine {

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

void check_generate_options(const model::Qwen3Config& c, const std::vector<int>& prompt, const GenerateOptions& o) {
  require(!prompt.empty(), "generate: the prompt is empty");
  require(o.max_tokens >= 1, "generate: --max-tokens must be >= 1, got " + std::to_string(o.max_tokens));
  ref::check_sampling(o.sampling);
  if (c.max_position_embeddings > 0) {
    require(int(prompt.size()) < c.max_position_embeddings,
            "generate: the prompt has " + std::to_string(prompt.size()) + " tokens; the model's context is " +
                std::to_string(c.max_position_embeddings) + " (max_position_embeddings)");
    require(int(prompt.size()) + o.max_tokens <= c.max_position_embeddings,
            "generate: --max-tokens " + std::to_string(o.max_tokens) + " after a " + std::to_string(prompt.size()) +
                "-token prompt goes beyond the model's context of " + std::to_string(c.max_position_embeddings) +
                " tokens (at most " + std::to_string(c.max_position_embeddings - int(prompt.size())) + ")");
  }
}

GenerateStats generate_on_cpu(const model::Qwen3Model& model, const model::AttentionFn& attend,
                              const std::vector<int>& prompt, const GenerateOptions& o,
                              const std::function<void(int token)>& on_token) {
  const model::Qwen3Config& c = model.config();
  check_generate_options(c, prompt, o);
  GenerateStats stats;
  stats.prompt_tokens = int(prompt.size());

  auto t0 = std::chrono::steady_clock::now();
  model::KvState state;
  std::vector<float> logits = model.last_logits(nullptr, prompt, attend, &state);
  for (int step = 0; step < o.max_tokens; ++step) {
    SamplingRow draw = o.sampling;
    draw.step = uint64_t(step);
    const int token = ref::sample_token(logits.data(), c.vocab_size, draw);
    ++stats.generated;
    if (step == 0) {
      stats.prefill_seconds = seconds_since(t0);
      t0 = std::chrono::steady_clock::now();
    }
    on_token(token);
    if (o.stop_at_eos && c.is_eos(token)) {
      stats.stopped_at_eos = true;
      break;
    }
    if (step + 1 < o.max_tokens) logits = model.last_logits(&state, {token}, attend, &state);
  }
  stats.decode_seconds = seconds_since(t0);
  return stats;
}

}  // namespace fp4kv::engine
