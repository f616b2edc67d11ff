#include "fp4kv/serve/gpu_serving.h"

#include <algorithm>

#include "fp4kv/engine/gpu_backend.h"
#include "fp4kv/eval/recipe_setup.h"
#include "fp4kv/model/tensor_parallel.h"
#include "fp4kv/serve/serving.h"

namespace fp4kv::serve {

GpuServing load_gpu_serving(const GpuServeSetup& setup) {
  GpuServing s;
  s.recipe = check_serving_setup(setup.kv, setup.max_batch, setup.prefill_chunk);
  const model::Qwen3Config c = model::Qwen3Config::load_dir(setup.model_dir);
  const int ranks = setup.tensor_parallel;
  const model::Qwen3Config rank_shape = model::rank_attention_config(c, ranks);  // one GPU's heads and cache
  engine::check_gpu_recipe(rank_shape, s.recipe);
  const int context = serving_context(c, setup.max_model_len);
  s.calibration = eval::calibration_for_recipe(&s.recipe, setup.model_dir, setup.calibration, c, {});
  // The budget of GPU 0 (every rank's is alike) once its weights are in, before they load.
  const long long weights_bytes = (long long)engine::GpuWeights::bytes_for(c, 0, ranks);
  s.kv_budget_bytes = setup.kv_budget_bytes > 0
                          ? setup.kv_budget_bytes
                          : std::max(0LL, engine::gpu_kv_budget(setup.gpu_memory_utilization) - weights_bytes);
  s.capacity = serving_capacity(s.recipe, rank_shape, s.kv_budget_bytes, setup.max_batch);
  s.codec = text_codec(model::Tokenizer::for_model(setup.model_dir, c));
  s.limits = model_limits(setup.model_dir, c);
  engine::TensorParallelSpec spec;
  spec.model = setup.model_dir;
  spec.recipe = s.recipe;
  if (s.calibration) spec.mu_k = s.calibration->mu_k;
  spec.options.max_batch = setup.max_batch;  // slots: one per running request
  spec.options.max_context = setup.max_model_len;  // 0: the model's
  spec.options.num_blocks = s.capacity.blocks;
  spec.options.prefill_chunk = engine::prefill_chunk_for(c, setup.prefill_chunk);  // the scheduler's chunks
  spec.options.gemm_plans = setup.gemm_plans;
  s.model = engine::load_step_model(spec, ranks);
  s.model.model->prepare_steps(setup.max_batch);  // no step graph captured while serving
  s.limits.context = std::min(context, s.model.model->options().max_context);
  s.engine = std::make_unique<engine::Engine>(std::make_unique<engine::GpuBackend>(*s.model.model),
                                              scheduler_config(setup.max_batch, s.capacity.blocks, setup.prefill_chunk),
                                              s.codec);
  return s;
}

}  // namespace fp4kv::serve
