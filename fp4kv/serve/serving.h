// The parts every serving setup shares, whichever engine runs the model: the text codec of
// the checkpoint's tokenizer, the limits the API checks requests against, and the scheduler
// configuration for a batch size and a block pool.
#pragma once

#include <string>

#include "fp4kv/core/recipe.h"
#include "fp4kv/engine/block_allocator.h"
#include "fp4kv/engine/engine.h"
#include "fp4kv/model/generation_config.h"
#include "fp4kv/model/qwen3_config.h"
#include "fp4kv/model/tokenizer.h"
#include "fp4kv/serve/openai_api.h"

namespace fp4kv::serve {

// The tokenizer's encode and decode (model/tokenizer.h: bytes for pk8l, else tokenizer.json).
engine::TextCodec text_codec(const model::Tokenizer& tokenizer);
// The model id is the directory's name; the context is max_position_embeddings (unbounded
// when the config has none); the chat template is the checkpoint's (model/chat_template.h),
// if it has one (a template that does not parse throws Error); the request defaults are its
// generation_config.json's (request_defaults).
ModelLimits model_limits(const std::string& model_dir, const model::Qwen3Config& config);
// The request defaults a generation config recommends: its temperature, top_p, top_k and
// max_new_tokens over OpenAI's; a repetition_penalty other than 1 or a min_p other than 0 is
// listed as not applied (fp4kv samples without them). top_k <= 0 is no cut.
RequestDefaults request_defaults(const model::GenerationConfig& g);
// The context a server takes (prompt + generated tokens): the model's max_position_embeddings
// (unbounded: INT_MAX), or max_model_len when positive. Throws Error for a negative
// max_model_len or one beyond the model's positions.
int serving_context(const model::Qwen3Config& config, int max_model_len);
// prefill_chunk: prompt tokens one request feeds per step at most, also the step's token
// budget (decode tokens included; at least max_batch).
engine::SchedulerConfig scheduler_config(int max_batch, int total_blocks, int prefill_chunk);

// The setup's own values, checked before anything loads: max_batch >= 1, prefill_chunk >= 1
// and a recipe the cache stores (fp32, the exact reference, is refused). Returns the parsed
// recipe.
Recipe check_serving_setup(const std::string& kv, int max_batch, int prefill_chunk);
// The block pool `budget_bytes` buys for the recipe on the model's shape, with BF16 slots for
// max_batch requests; throws fp4kv::Error when it buys no block.
engine::CacheCapacity serving_capacity(const Recipe& recipe, const model::Qwen3Config& config, long long budget_bytes,
                                       int max_batch);

}  // namespace fp4kv::serve
