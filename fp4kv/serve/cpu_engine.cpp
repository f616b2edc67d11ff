#include "fp4kv/serve/cpu_engine.h"

#include "fp4kv/core/error.h"
#include "fp4kv/engine/cpu_backend.h"
#include "fp4kv/eval/limits.h"
#include "fp4kv/eval/model_attention.h"
#include "fp4kv/eval/recipe_setup.h"
#include "fp4kv/serve/serving.h"

namespace fp4kv::serve {

CpuServing load_cpu_serving(const CpuServeSetup& setup) {
  CpuServing s;
  s.recipe = check_serving_setup(setup.kv, setup.max_batch, setup.prefill_chunk);
  s.model = std::make_unique<model::Qwen3Model>(model::Qwen3Model::load(setup.model_dir));
  const model::Qwen3Config& c = s.model->config();
  s.calibration = eval::calibration_for_recipe(&s.recipe, setup.model_dir, setup.calibration, *s.model);
  s.capacity = serving_capacity(s.recipe, c, setup.kv_budget_bytes, setup.max_batch);
  s.codec = text_codec(model::Tokenizer::for_model(setup.model_dir, c));
  s.limits = model_limits(setup.model_dir, c);
  s.limits.context = serving_context(c, setup.max_model_len);
  s.engine = std::make_unique<engine::Engine>(
      std::make_unique<engine::CpuBackend>(*s.model, eval::recipe_attention(c, s.recipe, s.calibration.get())),
      scheduler_config(setup.max_batch, s.capacity.blocks, setup.prefill_chunk), s.codec);
  return s;
}

}  // namespace fp4kv::serve
