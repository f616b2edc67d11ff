// `fp4kv eval`: accuracy of KV-cache recipes on a real model (the README's main job).
#include <cstdio>
#include <iostream>

#include "fp4kv/core/error.h"
#include "fp4kv/core/output_file.h"
#include "fp4kv/eval/evaluate.h"
#include "fp4kv/eval/limits.h"
#include "tools/commands.h"
#include "tools/device_choice.h"
#ifdef FP4KV_HAVE_CUDA
#include <algorithm>
#include <filesystem>
#include <memory>

#include "fp4kv/engine/gpu_generator.h"
#include "fp4kv/engine/gpu_weights.h"
#include "fp4kv/model/qwen3_config.h"
#endif

namespace fp4kv::cli {

namespace {
struct EvalArgs {
  eval::EvalOptions opt;
  std::string configs = "bf16,fp8,nvfp4-vanilla-native,nvfp4,nvfp4-native,mxfp4-native";
  std::string json_out, device = "auto";
  bool quiet = false;
};

#ifdef FP4KV_HAVE_CUDA
// Rows of one GPU step in the evaluation: windows and questions run 64 at a time.
constexpr int kEvalMaxBatch = 64;

// The GPU engine's teacher-forced logits: the weights loaded at the first call (after
// evaluate() has checked its inputs) and kept, one engine (cache sized for the sequences)
// per recipe.
eval::ForcedLogitsFn gpu_forced_logits(const std::string& model_dir) {
  auto weights = std::make_shared<std::unique_ptr<engine::GpuWeights>>();
  return [weights, model_dir](const Recipe& recipe, const eval::Calibration* cal,
                              const std::vector<std::vector<int>>& seqs) {
    if (!*weights) *weights = std::make_unique<engine::GpuWeights>(engine::GpuWeights::load(model_dir));
    size_t longest = 0;
    for (const auto& s : seqs) longest = std::max(longest, s.size());
    engine::GpuModelOptions o;
    o.max_batch = std::min<int>(kEvalMaxBatch, int(seqs.size()));
    o.max_context = int(longest);
    engine::GpuModel model(**weights, recipe, cal ? cal->mu_k.data() : nullptr, o);
    return engine::forced_logits_on_gpu(model, seqs);
  };
}

// Before any work: every recipe the GPU evaluation would run must have a GPU kernel (the
// CPU-reference-only comparison variants do not). A missing model directory is left to
// evaluate()'s own message.
void check_gpu_recipes(const eval::EvalOptions& o) {
  if (!std::filesystem::is_directory(o.model_dir)) return;
  const model::Qwen3Config c = model::Qwen3Config::load_dir(o.model_dir);
  std::vector<Recipe> recipes = o.configs;
  recipes.push_back(parse_recipe(o.reference));
  recipes.push_back(parse_recipe(o.baseline));
  for (const Recipe& r : recipes) {
    try {
      engine::check_gpu_recipe(c, r);
    } catch (const Error& e) {
      throw Error(std::string("--device cuda: ") + e.what() + "; evaluate it with --device cpu");
    }
  }
}
#endif

int run_eval(EvalArgs& a) {
  a.opt.configs = parse_recipe_list(a.configs);
  a.opt.baseline = parse_recipe(a.opt.baseline).name;  // validate early
  a.opt.progress = !a.quiet;
  if (use_gpu(a.device)) {
#ifdef FP4KV_HAVE_CUDA
    check_gpu_recipes(a.opt);
    a.opt.forced_logits = gpu_forced_logits(a.opt.model_dir);
    a.opt.device = "cuda";
#endif
  }
  // Before the work: a result that cannot be written must not cost the evaluation.
  if (!a.json_out.empty()) check_output_writable(a.json_out, "--json");
  const eval::EvalReport rep =
      eval::with_memory_guard("evaluating (--context, --windows, --retrieval-context)",
                              [&] { return eval::evaluate(a.opt, std::cerr); });
  std::fputs(rep.table().c_str(), stdout);
  std::fflush(stdout);
  if (!a.json_out.empty()) {
    write_output_file(a.json_out, rep.json(), "--json");
    std::printf("wrote %s\n", a.json_out.c_str());
  }
  return 0;
}
}  // namespace

Action add_eval(CLI::App& app) {
  auto a = std::make_shared<EvalArgs>();
  a->opt.model_dir = "models/pk8l";
  CLI::App* sub = app.add_subcommand("eval", "Teacher-forced KL, top-1 mismatch and pass-key retrieval of KV-cache recipes");
  sub->add_option("--model", a->opt.model_dir, "Hugging Face Qwen3 checkpoint directory")->capture_default_str();
  sub->add_option("--text", a->opt.text_path, "held-out text for the windows")->capture_default_str();
  sub->add_option("--context", a->opt.context, "tokens per window")->capture_default_str();
  sub->add_option("--windows", a->opt.windows, "number of windows")->capture_default_str();
  sub->add_option("--configs", a->configs, "recipes: PRESET[:switch,...],...")->capture_default_str();
  sub->add_option("--baseline", a->opt.baseline, "recipe the paired t statistic compares against")->capture_default_str();
  sub->add_option("--retrieval-docs", a->opt.retrieval_docs, "pass-key documents per recipe (0: none)")->capture_default_str();
  sub->add_option("--retrieval-context", a->opt.retrieval_context, "tokens per pass-key document")->capture_default_str();
  sub->add_option("--calibration", a->opt.calibration_path, "calibration file (default: beside the model, else computed)");
  sub->add_option("--calibration-text", a->opt.calib_text_path, "text for computing a calibration")->capture_default_str();
  sub->add_option("--seed", a->opt.seed, "seed for windows and documents")->capture_default_str();
  sub->add_option("--json", a->json_out, "also write the results as JSON");
  sub->add_option("--device", a->device, "auto (the GPU engine when a device is visible), cpu (the float32 runner) or cuda")
      ->capture_default_str();
  sub->add_flag("--quiet", a->quiet, "no progress line on stderr");
  return [a] { return run_eval(*a); };
}

}  // namespace fp4kv::cli
