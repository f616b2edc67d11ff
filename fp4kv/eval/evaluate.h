// `fp4kv eval`: accuracy of KV-cache recipes on a real model, measured as the paper does
// (teacher-forced KL against the bf16 reference, top-1 mismatch, paired t) plus pass-key
// retrieval accuracy.
#pragma once

#include <functional>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "fp4kv/core/recipe.h"
#include "fp4kv/eval/calibration.h"
#include "fp4kv/model/qwen3_config.h"

namespace fp4kv::eval {

// Teacher-forced logits of token sequences under a recipe: out[s] = [sequences[s].size()][vocab],
// row t the distribution after tokens 0..t, every position attending as a decode step.
// `fp4kv eval --device cuda` passes the GPU engine's (engine/gpu_generator.h).
using ForcedLogitsFn = std::function<std::vector<std::vector<float>>(
    const Recipe& recipe, const Calibration* calibration, const std::vector<std::vector<int>>& sequences)>;

struct EvalOptions {
  std::string model_dir;
  std::string text_path = "data/eval.txt";         // held-out text for the KL windows and retrieval filler
  std::string calib_text_path = "data/calib.txt";  // used only when calibration must be computed
  std::string calibration_path;                    // explicit calibration file (else beside the model, else computed)
  int context = 1024;
  int windows = 4;
  std::vector<Recipe> configs;
  std::string reference = "bf16";
  std::string baseline = "nvfp4-native";
  int retrieval_docs = 2;  // 0: no retrieval; every needle of a document is asked about
  int retrieval_context = 1024;
  unsigned seed = 1;
  bool progress = true;  // a progress line on stderr
  // Empty: the CPU float32 runner (the oracle). Else every window and question runs through
  // it, all windows (and all questions) of a recipe at once.
  ForcedLogitsFn forced_logits;
  std::string device = "cpu";  // where the logits come from (the report names it)
};

struct ConfigResult {
  std::string name;
  double kl_1e3 = 0.0;
  double top1_mismatch_pct = 0.0;
  double t_vs_baseline = 0.0;
  std::optional<double> retrieval_acc;  // fraction of questions answered exactly
  int retrieval_questions = 0;
  std::vector<double> window_kl;  // nats, one per window
};

struct EvalReport {
  std::string model;
  int context = 0, windows = 0, retrieval_docs = 0, retrieval_context = 0;
  std::string reference, baseline, text, calibration;  // calibration: where mu_k/tau came from
  std::string device = "cpu";
  std::vector<ConfigResult> configs;
  double seconds = 0.0;

  std::string table() const;  // the stdout table
  std::string json() const;   // {"model":..., "context":N, "windows":W, "configs": {NAME: {...}}}
};

EvalReport evaluate(const EvalOptions& options, std::ostream& log);

// Reads a text file; clear error naming `option` when it is missing, a directory, empty,
// or larger than the memory available.
std::string read_text_file(const std::string& path, const std::string& option = "text file");

// Throws Error naming the option when `options` ask for more than the model's positions or
// the available memory allow. evaluate() calls it (after reading config.json, before the
// weights); callers may call it earlier.
void check_eval_limits(const EvalOptions& options, const model::Qwen3Config& config);

}  // namespace fp4kv::eval
