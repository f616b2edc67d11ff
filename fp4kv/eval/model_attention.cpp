#include "fp4kv/eval/model_attention.h"

#include "fp4kv/core/error.h"
#include "fp4kv/eval/window_attention.h"

namespace fp4kv::eval {

model::AttentionFn recipe_attention(const model::Qwen3Config& config, const Recipe& recipe,
                                    const Calibration* calibration, ref::PBlockStats* stats) {
  const int heads = config.num_attention_heads, kv = config.num_key_value_heads, d = config.head_dim;
  const int G = heads / kv;
  if (calibration)
    require(calibration->layers == config.num_hidden_layers && calibration->kv_heads == kv &&
                calibration->head_dim == d,
            "calibration does not match the model's shape");
  return [=](int layer, const float* q, const float* k, const float* v, int L, float* out) {
    for (int g = 0; g < kv; ++g) {
      const float* mu = calibration ? calibration->mu(layer, g) : nullptr;
      window_attention(q + size_t(g) * G * L * d, G, L, k + size_t(g) * L * d, v + size_t(g) * L * d, L, d, recipe,
                       mu, out + size_t(g) * G * L * d, stats);
    }
  };
}

}  // namespace fp4kv::eval
