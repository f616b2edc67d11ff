// What `fp4kv serve --device cuda` serves: a byte-level Qwen3 checkpoint's weights on the
// GPU (or split over GPUs 0 .. N-1 with tensor_parallel N), the recipe's calibration when it
// needs one, a block pool cut from GPU memory (a fraction of the device's memory after the
// weights, or an explicit budget; per GPU under tensor parallelism, where a block holds that
// GPU's KV heads), the GPU engine's model over a cache of exactly those blocks, and an Engine
// over the GPU backend.
//
// Invariants: the engine refers to the model, which refers to the weights held here, so a
// GpuServing is moved whole or not at all (members in construction order, destroyed engine
// first).
#pragma once

#include <memory>
#include <string>

#include "fp4kv/core/recipe.h"
#include "fp4kv/engine/block_allocator.h"
#include "fp4kv/engine/engine.h"
#include "fp4kv/engine/gpu_model.h"
#include "fp4kv/engine/gpu_weights.h"
#include "fp4kv/engine/tensor_parallel_model.h"
#include "fp4kv/eval/calibration.h"
#include "fp4kv/serve/openai_api.h"

namespace fp4kv::serve {

struct GpuServeSetup {
  std::string model_dir = "models/pk8l";
  std::string kv = "nvfp4";
  std::string calibration;              // empty: the file beside the model (when needed)
  int max_batch = 8;
  long long kv_budget_bytes = 0;        // 0: gpu_memory_utilization of the device's memory
  double gpu_memory_utilization = 0.9;  // of the device's total memory, weights included
  int prefill_chunk = engine::kServingPrefillChunk;  // and the step's token budget
  int tensor_parallel = 1;              // GPUs the model is split over
  engine::GemmPlans gemm_plans = engine::GemmPlans::heuristic;  // the decode step's GEMMs
  int max_model_len = 0;                // tokens of one request, prompt included (0: the model's positions)
};

struct GpuServing {
  std::unique_ptr<eval::Calibration> calibration;
  Recipe recipe;
  engine::CacheCapacity capacity;
  long long kv_budget_bytes = 0;
  engine::TextCodec codec;
  ModelLimits limits;
  engine::LoadedStepModel model;
  std::unique_ptr<engine::Engine> engine;
};

// Throws Error naming the bad option: unknown recipe, fp32, a recipe without a GPU kernel, a
// model without the byte tokenizer, a missing calibration, a utilization outside (0, 1], a
// budget that buys no block.
GpuServing load_gpu_serving(const GpuServeSetup& setup);

}  // namespace fp4kv::serve
