#include "fp4kv/serve/gpu_serving.h"

#include <cuda_runtime_api.h>

#include <algorithm>

#include "fp4kv/cache/cuda_check.h"
#include "fp4kv/core/error.h"
#include "fp4kv/engine/gpu_backend.h"
#include "fp4kv/eval/recipe_setup.h"
#include "fp4kv/model/byte_tokenizer.h"
#include "fp4kv/serve/serving.h"

namespace fp4kv::serve {

namespace {

// The KV budget: the explicit one, else what `utilization` of the device's memory leaves
// after what is in use now (the weights) and the activation reserve.
long long kv_budget(const GpuServeSetup& setup) {
  if (setup.kv_budget_bytes > 0) return setup.kv_budget_bytes;
  require(setup.gpu_memory_utilization > 0 && setup.gpu_memory_utilization <= 1,
          "--gpu-memory-utilization must be in (0, 1], got " + std::to_string(setup.gpu_memory_utilization));
  size_t free_bytes = 0, total = 0;
  cache::cuda_check(cudaMemGetInfo(&free_bytes, &total), "serve: GPU memory");
  const double allowed = setup.gpu_memory_utilization * double(total) - double(total - free_bytes);
  return std::max(0LL, (long long)allowed - kGpuActivationReserveBytes);
}

}  // namespace

GpuServing load_gpu_serving(const GpuServeSetup& setup) {
  require(setup.max_batch >= 1, "--max-batch must be >= 1, got " + std::to_string(setup.max_batch));
  GpuServing s;
  s.recipe = parse_recipe(setup.kv);
  require(s.recipe.kv != KvFormat::fp32, "--kv fp32 is the exact reference, not a cache format; serve bf16, fp8 or an "
                                         "FP4 preset");
  const model::Qwen3Config c = model::Qwen3Config::load_dir(setup.model_dir);
  model::require_byte_tokenizer(c, setup.model_dir);
  attention::DecodeAttention::check_supported({c.num_attention_heads, c.num_key_value_heads, c.head_dim}, s.recipe,
                                              attention::DecodeCapacity{setup.max_batch, 1, 1});
  s.calibration = eval::calibration_for_recipe(&s.recipe, setup.model_dir, setup.calibration, c, {});
  s.weights = std::make_unique<engine::GpuWeights>(engine::GpuWeights::load(setup.model_dir));
  s.kv_budget_bytes = kv_budget(setup);
  s.capacity = engine::cache_capacity(s.recipe.kv, {c.num_hidden_layers, c.num_key_value_heads, c.head_dim},
                                      s.kv_budget_bytes, setup.max_batch);
  require(s.capacity.blocks >= 1, "the KV budget of " + std::to_string(s.kv_budget_bytes) +
                                      " bytes buys no cache block; give a larger budget");
  s.codec = byte_codec();
  s.limits = model_limits(setup.model_dir, c);
  engine::GpuModelOptions o;
  o.max_batch = setup.max_batch;
  o.max_context = c.max_position_embeddings > 0 ? c.max_position_embeddings : 0;
  o.num_blocks = s.capacity.blocks;
  o.max_slots = setup.max_batch;
  s.model = std::make_unique<engine::GpuModel>(*s.weights, s.recipe, s.calibration ? s.calibration->mu_k.data() : nullptr,
                                               o);
  s.limits.context = std::min(s.limits.context, s.model->options().max_context);
  s.engine = std::make_unique<engine::Engine>(std::make_unique<engine::GpuBackend>(*s.model),
                                              scheduler_config(setup.max_batch, s.capacity.blocks), s.codec);
  return s;
}

}  // namespace fp4kv::serve
