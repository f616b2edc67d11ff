// `fp4kv calibrate`: mu_k and tau for a model (SPEC section 7).
#include <cmath>
#include <cstdio>
#include <filesystem>

#include "fp4kv/core/error.h"
#include "fp4kv/core/output_file.h"
#include "fp4kv/eval/calibration.h"
#include "fp4kv/eval/evaluate.h"
#include "fp4kv/eval/limits.h"
#include "fp4kv/model/qwen3.h"
#include "tools/commands.h"

namespace fp4kv::cli {

namespace {
struct CalibrateArgs {
  std::string model = "models/pk8l", text = "data/calib.txt", out;
  eval::CalibrationOptions opt;
};

int run_calibrate(CalibrateArgs& a) {
  namespace fs = std::filesystem;
  require(fs::exists(a.model), "--model: model directory '" + a.model + "' does not exist");
  require(fs::is_directory(a.model), "--model: '" + a.model + "' is not a directory");
  // Every check that can fail does so before the weights load and the prefill runs.
  const model::Qwen3Config config = model::Qwen3Config::load_dir(a.model);
  eval::check_calibration_limits(config, a.opt);
  a.opt.tokenizer = model::Tokenizer::for_model(a.model, config);  // the prompts are text
  const std::string out = a.out.empty() ? (fs::path(a.model) / eval::kCalibrationFile).string() : a.out;
  check_output_writable(out, "--out");
  a.opt.calib_text = eval::read_text_file(a.text, "--text");
  const eval::Calibration c = eval::with_memory_guard("calibrating (--context, --continuation)", [&] {
    const model::Qwen3Model m = model::Qwen3Model::load(a.model);
    return eval::calibrate(m, fs::path(a.model).filename().string(), a.opt);
  });
  c.save(out, "--out");
  double norm_sum = 0;
  for (int l = 0; l < c.layers; ++l)
    for (int h = 0; h < c.kv_heads; ++h) {
      double n2 = 0;
      for (int i = 0; i < c.head_dim; ++i) n2 += double(c.mu(l, h)[i]) * c.mu(l, h)[i];
      norm_sum += std::sqrt(n2);
    }
  std::printf("calibrated %s on %d tokens (%d prompts x %d bytes + %d greedy tokens, tiled)\n", a.model.c_str(),
              c.context, a.opt.prompts, a.opt.prompt_bytes, a.opt.continuation);
  std::printf("mu_k: %d layers x %d KV heads x %d, mean |mu_k| %.3f\n", c.layers, c.kv_heads, c.head_dim,
              norm_sum / (c.layers * c.kv_heads));
  std::printf("tau: E4M3 code %d, tau = %.6g (= %.2f/1024; the paper's default is code 10, 21/1024)\n", c.tau_code,
              double(c.tau), double(c.tau) * 1024);
  std::printf("took %.1f s; wrote %s\n", c.seconds, out.c_str());
  return 0;
}
}  // namespace

Action add_calibrate(CLI::App& app) {
  auto a = std::make_shared<CalibrateArgs>();
  CLI::App* sub = app.add_subcommand("calibrate", "Compute mu_k (key smoothing) and tau (P scaling) for a model");
  sub->add_option("--model", a->model, "Hugging Face Qwen3 checkpoint directory")->capture_default_str();
  sub->add_option("--text", a->text, "text the seed prompts come from")->capture_default_str();
  sub->add_option("--context", a->opt.context, "tokens of the tiled calibration prefill")->capture_default_str();
  sub->add_option("--continuation", a->opt.continuation, "greedy tokens generated after each seed prompt")
      ->capture_default_str();
  sub->add_option("--out", a->out, "output file (default: <model>/fp4kv_calibration.json)");
  return [a] { return run_calibrate(*a); };
}

}  // namespace fp4kv::cli
