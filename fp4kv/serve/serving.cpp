#include "fp4kv/serve/serving.h"

#include <algorithm>
#include <climits>
#include <filesystem>

#include "fp4kv/model/byte_tokenizer.h"

namespace fp4kv::serve {

engine::TextCodec byte_codec() {
  return engine::TextCodec{[](std::string_view t) { return model::encode_bytes(t); }, model::decode_bytes};
}

ModelLimits model_limits(const std::string& model_dir, const model::Qwen3Config& c) {
  ModelLimits limits;
  limits.model_name = std::filesystem::path(model_dir).lexically_normal().filename().string();
  if (limits.model_name.empty())
    limits.model_name = std::filesystem::path(model_dir).parent_path().filename().string();
  limits.vocab_size = c.vocab_size;
  limits.context = c.max_position_embeddings > 0 ? c.max_position_embeddings : INT_MAX;  // 0: not bounded
  return limits;
}

engine::SchedulerConfig scheduler_config(int max_batch, int total_blocks) {
  engine::SchedulerConfig config;
  config.max_batch = max_batch;
  config.max_step_tokens = std::max(kStepTokens, max_batch);
  config.prefill_chunk = kPrefillChunk;
  config.total_blocks = total_blocks;
  return config;
}

}  // namespace fp4kv::serve
