// What running a recipe on a model needs besides the recipe: its calibration (key smoothing's
// mu_k, underflow-aware P's tau), found the one way every command finds it.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "fp4kv/core/recipe.h"
#include "fp4kv/eval/calibration.h"
#include "fp4kv/model/qwen3.h"

namespace fp4kv::eval {

// Whether the recipe reads a calibration (it smooths keys or scales P by tau).
inline bool recipe_needs_calibration(const Recipe& r) { return r.smooth_keys || r.prob == ProbFormat::fp4_underflow; }

// The calibration for `recipe`: `path` when given, else the file beside the model; null when
// the recipe needs none. A missing file is an Error telling to run `fp4kv calibrate` (no
// command calibrates behind the user's back); the file's values are checked on load. When
// the recipe scales P by tau, recipe->tau becomes the calibrated one.
std::unique_ptr<Calibration> calibration_for_recipe(Recipe* recipe, const std::string& model_dir,
                                                    const std::string& path, const model::Qwen3Model& m);
// The same for a model known by its config alone (the GPU engine's weights live on the
// device); key_norm_bounds (Qwen3Model::key_norm_bounds) may be empty: no length check.
std::unique_ptr<Calibration> calibration_for_recipe(Recipe* recipe, const std::string& model_dir,
                                                    const std::string& path, const model::Qwen3Config& config,
                                                    const std::vector<float>& key_norm_bounds);

}  // namespace fp4kv::eval
