#include "fp4kv/serve/gpu_serving.h"

#include <algorithm>

#include "fp4kv/engine/gpu_backend.h"
#include "fp4kv/eval/recipe_setup.h"
#include "fp4kv/model/byte_tokenizer.h"
#include "fp4kv/serve/serving.h"

namespace fp4kv::serve {

GpuServing load_gpu_serving(const GpuServeSetup& setup) {
  GpuServing s;
  s.recipe = check_serving_setup(setup.kv, setup.max_batch, setup.prefill_chunk);
  const model::Qwen3Config c = model::Qwen3Config::load_dir(setup.model_dir);
  model::require_byte_tokenizer(c, setup.model_dir);
  engine::check_gpu_recipe(c, s.recipe);
  s.calibration = eval::calibration_for_recipe(&s.recipe, setup.model_dir, setup.calibration, c, {});
  s.weights = std::make_unique<engine::GpuWeights>(engine::GpuWeights::load(setup.model_dir));
  s.kv_budget_bytes =
      setup.kv_budget_bytes > 0 ? setup.kv_budget_bytes : engine::gpu_kv_budget(setup.gpu_memory_utilization);
  s.capacity = serving_capacity(s.recipe, c, s.kv_budget_bytes, setup.max_batch);
  s.codec = byte_codec();
  s.limits = model_limits(setup.model_dir, c);
  engine::GpuModelOptions o;  // max_context: the model's; slots: one per running request
  o.max_batch = setup.max_batch;
  o.num_blocks = s.capacity.blocks;
  o.prefill_chunk = engine::prefill_chunk_for(c, setup.prefill_chunk);  // the scheduler's chunks, tensor-core prefill
  s.model = std::make_unique<engine::GpuModel>(*s.weights, s.recipe, s.calibration ? s.calibration->mu_k.data() : nullptr,
                                               o);
  s.model->prepare_steps(setup.max_batch);  // no step graph captured while serving
  s.limits.context = std::min(s.limits.context, s.model->options().max_context);
  s.engine = std::make_unique<engine::Engine>(std::make_unique<engine::GpuBackend>(*s.model),
                                              scheduler_config(setup.max_batch, s.capacity.blocks, setup.prefill_chunk),
                                              s.codec);
  return s;
}

}  // namespace fp4kv::serve
