// The parts every serving setup shares, whichever engine runs the model: the byte-level text
// codec, the limits the API checks requests against, and the scheduler configuration for a
// batch size and a block pool.
#pragma once

#include <string>

#include "fp4kv/engine/engine.h"
#include "fp4kv/model/qwen3_config.h"
#include "fp4kv/serve/openai_api.h"

namespace fp4kv::serve {

// Per-step token budget and prefill chunk of the scheduler (the engine's defaults).
inline constexpr int kStepTokens = 256;
inline constexpr int kPrefillChunk = 128;

// model/byte_tokenizer.h's encode_bytes/decode_bytes.
engine::TextCodec byte_codec();
// The model id is the directory's name; the context is max_position_embeddings (unbounded
// when the config has none).
ModelLimits model_limits(const std::string& model_dir, const model::Qwen3Config& config);
engine::SchedulerConfig scheduler_config(int max_batch, int total_blocks);

}  // namespace fp4kv::serve
