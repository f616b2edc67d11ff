// `fp4kv check-model`: does a checkpoint reproduce its reference activations on the CPU
// forward pass? Catches what no header check can (a dtype that does not match the bytes).
#include <cstdio>
#include <filesystem>

#include "fp4kv/core/error.h"
#include "fp4kv/eval/check_model.h"
#include "fp4kv/eval/limits.h"
#include "fp4kv/model/qwen3.h"
#include "tools/commands.h"

namespace fp4kv::cli {

namespace {

constexpr int kExitMismatch = 1;  // 2 stays for bad input, as in every command

struct CheckModelArgs {
  std::string model = "models/pk8l", reference;
};

int run_check_model(const CheckModelArgs& a) {
  namespace fs = std::filesystem;
  require(fs::exists(a.model), "--model: model directory '" + a.model + "' does not exist");
  require(fs::is_directory(a.model), "--model: '" + a.model + "' is not a directory");
  const std::string ref = a.reference.empty() ? (fs::path(a.model) / eval::kReferenceActivationsFile).string() : a.reference;
  eval::require_regular_file(ref, "--reference");
  const eval::ModelCheck check = eval::with_memory_guard("checking the model", [&] {
    const model::Qwen3Model m = model::Qwen3Model::load(a.model);
    return eval::check_model(m, ref, "--reference");
  });
  std::printf("fp4kv check-model: %s\n%s", a.model.c_str(), check.report().c_str());
  return check.ok() ? 0 : kExitMismatch;
}

}  // namespace

Action add_check_model(CLI::App& app) {
  auto a = std::make_shared<CheckModelArgs>();
  CLI::App* sub = app.add_subcommand(
      "check-model", "Run the CPU forward pass on a checkpoint's reference activations and compare (exit 1 on mismatch)");
  sub->add_option("--model", a->model, "Hugging Face Qwen3 checkpoint directory")->capture_default_str();
  sub->add_option("--reference", a->reference, "reference activations (default: <model>/" +
                                                   std::string(eval::kReferenceActivationsFile) + ")");
  return [a] { return run_check_model(*a); };
}

}  // namespace fp4kv::cli
