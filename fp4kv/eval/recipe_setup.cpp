#include "fp4kv/eval/recipe_setup.h"

#include <filesystem>

#include "fp4kv/core/error.h"
#include "fp4kv/eval/limits.h"

namespace fp4kv::eval {

std::unique_ptr<Calibration> calibration_for_recipe(Recipe* recipe, const std::string& model_dir,
                                                    const std::string& path, const model::Qwen3Model& m) {
  return calibration_for_recipe(recipe, model_dir, path, m.config(), m.key_norm_bounds());
}

std::unique_ptr<Calibration> calibration_for_recipe(Recipe* recipe, const std::string& model_dir,
                                                    const std::string& path, const model::Qwen3Config& config,
                                                    const std::vector<float>& key_norm_bounds) {
  if (!recipe_needs_calibration(*recipe)) return nullptr;
  namespace fs = std::filesystem;
  const std::string file = path.empty() ? (fs::path(model_dir) / kCalibrationFile).string() : path;
  require(fs::exists(file), "--kv " + recipe->name + " needs a calibration (mu_k, tau): none at '" + file +
                                "'; run `fp4kv calibrate --model " + model_dir + "` or give --calibration");
  require_regular_file(file, "--calibration");
  auto cal = std::make_unique<Calibration>(Calibration::load(file, config, key_norm_bounds));
  if (recipe->prob == ProbFormat::fp4_underflow) recipe->tau = cal->tau;
  return cal;
}

}  // namespace fp4kv::eval
