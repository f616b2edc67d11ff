// The model runner's attention under a recipe: every query of the window is a decode step
// over the quantized cache the recipe describes (window_attention per KV head group).
#pragma once

#include "fp4kv/core/recipe.h"
#include "fp4kv/eval/calibration.h"
#include "fp4kv/model/qwen3.h"
#include "fp4kv/ref/attention.h"

namespace fp4kv::eval {

// mu_k comes from `calibration` (null: zero, i.e. no smoothing effect). P-block statistics
// are accumulated into *stats when given.
model::AttentionFn recipe_attention(const model::Qwen3Config& config, const Recipe& recipe,
                                    const Calibration* calibration, ref::PBlockStats* stats = nullptr);

}  // namespace fp4kv::eval
