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
  return [=](int layer, const float* q, const float* k, const float* v, int nq, int n, float* out) {
    for (int g = 0; g < kv; ++g) {
      const float* mu = calibration ? calibration->mu(layer, g) : nullptr;
      window_attention(q + size_t(g) * G * nq * d, G, nq, k + size_t(g) * n * d, v + size_t(g) * n * d, n, d, recipe,
                       mu, out + size_t(g) * G * nq * d, stats);
    }
  };
}

}  // namespace fp4kv::eval
