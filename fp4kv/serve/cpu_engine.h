// What `fp4kv serve --device cpu` serves: a byte-level Qwen3 checkpoint, the recipe's KV
// cache (its calibration when the recipe needs one), the block pool a memory budget buys for
// the recipe's format (cache_capacity), and an Engine over the CPU backend. The GPU engine
// will be a second loader returning the same parts.
//
// Invariants: the engine refers to the model and calibration held here, so a CpuServing is
// moved whole or not at all (members in construction order, destroyed engine first).
#pragma once

#include <memory>
#include <string>

#include "fp4kv/core/recipe.h"
#include "fp4kv/engine/block_allocator.h"
#include "fp4kv/engine/engine.h"
#include "fp4kv/eval/calibration.h"
#include "fp4kv/model/qwen3.h"
#include "fp4kv/serve/openai_api.h"

namespace fp4kv::serve {

// The KV memory the pool is cut from when the operator names none.
inline constexpr long long kDefaultKvBudgetBytes = 256LL << 20;

struct CpuServeSetup {
  std::string model_dir = "models/pk8l";
  std::string kv = "nvfp4";
  std::string calibration;  // empty: the file beside the model (when the recipe needs one)
  int max_batch = 8;
  long long kv_budget_bytes = kDefaultKvBudgetBytes;
  int prefill_chunk = engine::kServingPrefillChunk;  // and the step's token budget
  int max_model_len = 0;  // tokens of one request, prompt included (0: the model's positions)
};

struct CpuServing {
  std::unique_ptr<model::Qwen3Model> model;
  std::unique_ptr<eval::Calibration> calibration;
  Recipe recipe;
  engine::CacheCapacity capacity;
  engine::TextCodec codec;
  ModelLimits limits;
  std::unique_ptr<engine::Engine> engine;
};

// Throws Error naming the bad option: unknown recipe, fp32 (not a cache format), a model
// without the byte tokenizer, a missing calibration, a budget that buys no block.
CpuServing load_cpu_serving(const CpuServeSetup& setup);

}  // namespace fp4kv::serve
