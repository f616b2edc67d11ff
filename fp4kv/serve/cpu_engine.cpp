#include "fp4kv/serve/cpu_engine.h"

#include "fp4kv/core/error.h"
#include "fp4kv/engine/cpu_backend.h"
#include "fp4kv/eval/limits.h"
#include "fp4kv/eval/model_attention.h"
#include "fp4kv/eval/recipe_setup.h"
#include "fp4kv/model/byte_tokenizer.h"
#include "fp4kv/serve/serving.h"

namespace fp4kv::serve {

CpuServing load_cpu_serving(const CpuServeSetup& setup) {
  require(setup.max_batch >= 1, "--max-batch must be >= 1, got " + std::to_string(setup.max_batch));
  CpuServing s;
  s.recipe = parse_recipe(setup.kv);
  require(s.recipe.kv != KvFormat::fp32, "--kv fp32 is the exact reference, not a cache format; serve bf16, fp8 or an "
                                         "FP4 preset");
  s.model = std::make_unique<model::Qwen3Model>(model::Qwen3Model::load(setup.model_dir));
  const model::Qwen3Config& c = s.model->config();
  model::require_byte_tokenizer(c, setup.model_dir);
  s.calibration = eval::calibration_for_recipe(&s.recipe, setup.model_dir, setup.calibration, *s.model);
  s.capacity = engine::cache_capacity(s.recipe.kv, {c.num_hidden_layers, c.num_key_value_heads, c.head_dim},
                                      setup.kv_budget_bytes, setup.max_batch);
  require(s.capacity.blocks >= 1, "the KV budget of " + std::to_string(setup.kv_budget_bytes) +
                                      " bytes buys no cache block; give a larger budget");
  s.codec = byte_codec();
  s.limits = model_limits(setup.model_dir, c);
  s.engine = std::make_unique<engine::Engine>(
      std::make_unique<engine::CpuBackend>(*s.model, eval::recipe_attention(c, s.recipe, s.calibration.get())),
      scheduler_config(setup.max_batch, s.capacity.blocks), s.codec);
  return s;
}

}  // namespace fp4kv::serve
