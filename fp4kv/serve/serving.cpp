#include "fp4kv/serve/serving.h"

#include <algorithm>
#include <climits>
#include <filesystem>

#include "fp4kv/core/error.h"

namespace fp4kv::serve {

engine::TextCodec text_codec(const model::Tokenizer& tokenizer) {
  return engine::TextCodec{[tokenizer](std::string_view t) { return tokenizer.encode(t); },
                           [tokenizer](const std::vector<int>& ids) { return tokenizer.decode(ids); },
                           [tokenizer](std::string_view t) { return tokenizer.encode(t, false); }};
}

ModelLimits model_limits(const std::string& model_dir, const model::Qwen3Config& c) {
  ModelLimits limits;
  limits.model_name = std::filesystem::path(model_dir).lexically_normal().filename().string();
  if (limits.model_name.empty())
    limits.model_name = std::filesystem::path(model_dir).parent_path().filename().string();
  limits.vocab_size = c.vocab_size;
  limits.context = c.max_position_embeddings > 0 ? c.max_position_embeddings : INT_MAX;  // 0: not bounded
  if (auto chat = model::ChatTemplate::for_model(model_dir))
    limits.chat_template = std::make_shared<const model::ChatTemplate>(std::move(*chat));
  limits.defaults = request_defaults(model::read_generation_config(model_dir));
  return limits;
}

RequestDefaults request_defaults(const model::GenerationConfig& g) {
  RequestDefaults d;
  d.temperature = g.temperature.value_or(d.temperature);
  d.top_p = g.top_p.value_or(d.top_p);
  d.top_k = std::max(g.top_k.value_or(d.top_k), 0);
  d.max_tokens = g.max_new_tokens;
  if (g.temperature || g.top_p || g.top_k || g.max_new_tokens) d.origin = g.path;
  if (g.repetition_penalty && *g.repetition_penalty != 1.0f)
    d.not_applied.emplace_back("repetition_penalty", *g.repetition_penalty);
  if (g.min_p && *g.min_p != 0.0f) d.not_applied.emplace_back("min_p", *g.min_p);
  return d;
}

int serving_context(const model::Qwen3Config& c, int max_model_len) {
  require(max_model_len >= 0, "--max-model-len must be >= 0 (0: the model's), got " + std::to_string(max_model_len));
  const int positions = c.max_position_embeddings > 0 ? c.max_position_embeddings : INT_MAX;
  require(max_model_len <= positions, "--max-model-len " + std::to_string(max_model_len) +
                                          " exceeds the model's max_position_embeddings " + std::to_string(positions));
  return max_model_len > 0 ? max_model_len : positions;
}

engine::SchedulerConfig scheduler_config(int max_batch, int total_blocks, int prefill_chunk) {
  engine::SchedulerConfig config;
  config.max_batch = max_batch;
  config.max_step_tokens = std::max(prefill_chunk, max_batch);
  config.prefill_chunk = prefill_chunk;
  config.total_blocks = total_blocks;
  return config;
}

Recipe check_serving_setup(const std::string& kv, int max_batch, int prefill_chunk) {
  require(max_batch >= 1, "--max-batch must be >= 1, got " + std::to_string(max_batch));
  require(prefill_chunk >= 1, "--prefill-chunk must be >= 1, got " + std::to_string(prefill_chunk));
  Recipe r = parse_recipe(kv);
  require(r.kv != KvFormat::fp32, "--kv fp32 is the exact reference, not a cache format; serve bf16, fp8 or an FP4 preset");
  return r;
}

engine::CacheCapacity serving_capacity(const Recipe& recipe, const model::Qwen3Config& c, long long budget_bytes,
                                       int max_batch) {
  const engine::CacheCapacity cap = engine::cache_capacity(
      recipe.kv, {c.num_hidden_layers, c.num_key_value_heads, c.head_dim}, budget_bytes, max_batch);
  require(cap.blocks >= 1,
          "the KV budget of " + std::to_string(budget_bytes) + " bytes buys no cache block; give a larger budget");
  return cap;
}

}  // namespace fp4kv::serve
