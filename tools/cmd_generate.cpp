// `fp4kv generate`: a prompt through prefill into the recipe's KV cache, then tokens streamed
// to stdout as they are drawn; prompt tokens, prefill time, time per output token and
// tokens/s go to stderr, so the text can be piped. With --chat the prompt is a user message
// that the checkpoint's chat template turns into the model's text. The CPU engine (engine/cpu_generator.h)
// runs everywhere; the GPU engine (engine/gpu_generator.h) in CUDA builds, reading the prompt
// in --prefill-chunk chunks of the tensor-core prefill.
#include <cstdio>
#include <fstream>
#include <functional>
#include <memory>
#include <optional>
#include <sstream>

#include <nlohmann/json.hpp>

#include "fp4kv/core/error.h"
#include "fp4kv/core/recipe.h"
#include "fp4kv/engine/cpu_generator.h"
#include "fp4kv/engine/scheduler.h"
#include "fp4kv/eval/calibration.h"
#include "fp4kv/eval/limits.h"
#include "fp4kv/eval/model_attention.h"
#include "fp4kv/eval/recipe_setup.h"
#include "fp4kv/model/chat_template.h"
#include "fp4kv/model/qwen3.h"
#include "fp4kv/model/tokenizer.h"
#include "tools/commands.h"
#include "tools/device_choice.h"
#include "tools/gemm_plans_arg.h"
#include "tools/tensor_parallel_arg.h"
#ifdef FP4KV_HAVE_CUDA
#include "fp4kv/engine/gpu_generator.h"
#include "fp4kv/engine/gpu_weights.h"
#include "fp4kv/engine/tensor_parallel_model.h"
#endif

namespace fp4kv::cli {

namespace {

struct GenerateArgs {
  std::string model = "models/pk8l", kv = "nvfp4", prompt, prompt_file, calibration, device = "auto";
  // The GPU decode step's GEMM plans (engine::GemmPlans): our GEMV by default, since every
  // step of one request is batch 1, where it is the fastest plan and needs no timing.
  std::string gemm_plans = "gemv";
  int tensor_parallel = 1;
  int prefill_chunk = engine::kServingPrefillChunk;  // fp4kv serve's, so both read a prompt alike
  engine::GenerateOptions options;
  bool prompt_given = false;  // --prompt '' is an empty prompt, not a missing one
  bool chat = false;          // the prompt is a user message, rendered by the chat template
  std::string system;         // with --chat: a system message before it
  std::string chat_template;  // with --chat: a template file instead of the checkpoint's
};

std::string read_prompt(const GenerateArgs& a) {
  require(a.prompt_given != !a.prompt_file.empty(), "give the prompt as --prompt TEXT or --prompt-file FILE (one)");
  if (!a.prompt_file.empty()) {
    eval::require_regular_file(a.prompt_file, "--prompt-file");
    std::ifstream in(a.prompt_file, std::ios::binary);
    std::stringstream s;
    s << in.rdbuf();
    require(bool(in) || in.eof(), "--prompt-file: cannot read '" + a.prompt_file + "'");
    return s.str();
  }
  return a.prompt;
}

// The checkpoint's tokenizer; byte tokens for NAME:random, whose text is noise either way.
model::Tokenizer tokenizer_of(const std::string& model_spec) {
  if (model_spec.find(":random") != std::string::npos) return model::Tokenizer::bytes();
  return model::Tokenizer::for_model(model_spec, model::Qwen3Config::load_dir(model_spec));
}

// Each token's bytes as drawn: a character split over tokens is whole once its last byte is out.
std::function<void(int)> token_printer(const model::Tokenizer& tokenizer) {
  return [&tokenizer](int token) {
    const std::string piece = tokenizer.decode({token});
    std::fwrite(piece.data(), 1, piece.size(), stdout);
    std::fflush(stdout);
  };
}

// The text the model reads: the prompt itself, or with --chat the conversation (an optional
// system message and the prompt as the user's) as the chat template writes it, with the
// assistant's turn opened.
std::string model_text(const GenerateArgs& a, const std::string& prompt) {
  require(a.chat || (a.system.empty() && a.chat_template.empty()), "--system and --chat-template need --chat");
  if (!a.chat) return prompt;
  require(a.model.find(":random") == std::string::npos, "--chat needs a checkpoint directory, not " + a.model);
  std::optional<model::ChatTemplate> chat = a.chat_template.empty()
                                                ? model::ChatTemplate::for_model(a.model)
                                                : model::ChatTemplate::from_file(a.chat_template, a.model);
  require(chat.has_value(), "--chat: " + a.model + " has no chat template (no chat_template.jinja, none in "
                            "tokenizer_config.json); give one with --chat-template FILE");
  nlohmann::json messages = nlohmann::json::array();
  if (!a.system.empty()) messages.push_back({{"role", "system"}, {"content", a.system}});
  messages.push_back({{"role", "user"}, {"content", prompt}});
  model::ChatInput input;
  input.messages_json = messages.dump();
  try {
    return chat->render(input);
  } catch (const model::jinja::TemplateError& e) {
    throw Error(std::string("--chat: the chat template of ") + chat->origin() + " fails: " + e.what());
  }
}

void print_stats(const char* device, const Recipe& recipe, const engine::GenerateStats& s) {
  std::fprintf(stderr,
               "\n[fp4kv generate] device %s, kv %s: prompt %d tokens, prefill %.3f s, %d tokens generated%s, "
               "%.2f ms per output token, %.1f tokens/s\n",
               device, recipe.name.c_str(), s.prompt_tokens, s.prefill_seconds, s.generated,
               s.stopped_at_eos ? " (EOS)" : "", 1e3 * s.seconds_per_token(), s.tokens_per_second());
}

int generate_on_cpu(const GenerateArgs& a, Recipe recipe, const model::Tokenizer& tokenizer,
                    const std::vector<int>& prompt) {
  require(a.model.find(":random") == std::string::npos,
          "--model " + a.model + ": random-weight models run on the GPU only (--device cuda)");
  const model::Qwen3Model m = model::Qwen3Model::load(a.model);
  const std::unique_ptr<eval::Calibration> cal = eval::calibration_for_recipe(&recipe, a.model, a.calibration, m);
  const model::AttentionFn attend = eval::recipe_attention(m.config(), recipe, cal.get());
  const engine::GenerateStats s = eval::with_memory_guard(
      "generating", [&] { return engine::generate_on_cpu(m, attend, prompt, a.options, token_printer(tokenizer)); });
  print_stats("cpu", recipe, s);
  return 0;
}

#ifdef FP4KV_HAVE_CUDA
int generate_on_gpu(const GenerateArgs& a, Recipe recipe, const model::Tokenizer& tokenizer,
                    const std::vector<int>& prompt) {
  model::Qwen3Config config;
  require(model_config_of(a.model, &config), "--model: '" + a.model + "' is neither a checkpoint directory nor NAME:random");
  std::string shape;
  const bool random = engine::is_random_model_spec(a.model, &shape);
  std::unique_ptr<eval::Calibration> cal;
  if (random) {
    std::fprintf(stderr, "[fp4kv generate] %s: random weights (speed only: the text is noise), keys not smoothed\n",
                 a.model.c_str());
  } else {
    cal = eval::calibration_for_recipe(&recipe, a.model, a.calibration, config, {});
  }
  engine::check_generate_options(config, prompt, a.options);
  engine::TensorParallelSpec spec;
  spec.model = a.model;
  spec.recipe = recipe;
  if (cal) spec.mu_k = cal->mu_k;
  spec.options.max_batch = 1;
  spec.options.max_context = int(prompt.size()) + a.options.max_tokens;
  spec.options.prefill_chunk = engine::prefill_chunk_for(config, a.prefill_chunk);  // the tensor-core prefill
  spec.options.gemm_plans = gemm_plans_of(a.gemm_plans);
  const engine::LoadedStepModel gpu = engine::load_step_model(spec, a.tensor_parallel);
  const engine::GenerateStats s = engine::generate_on_gpu(*gpu.model, prompt, a.options, token_printer(tokenizer));
  const std::string device =
      a.tensor_parallel > 1 ? "cuda (" + std::to_string(a.tensor_parallel) + " GPUs, tensor parallel)" : "cuda";
  print_stats(device.c_str(), recipe, s);
  return 0;
}
#endif

int run_generate(const GenerateArgs& a) {
  require(a.prefill_chunk >= 1, "--prefill-chunk must be >= 1, got " + std::to_string(a.prefill_chunk));
  check_gemm_plans(a.gemm_plans);
  const bool gpu = use_gpu(a.device);
  check_tensor_parallel(a.tensor_parallel, a.model, gpu);
  const Recipe recipe = parse_recipe(a.kv);
  const std::string text = read_prompt(a);
  require(!text.empty(), "the prompt is empty");
  const model::Tokenizer tokenizer = tokenizer_of(a.model);
  const std::vector<int> prompt = tokenizer.encode(model_text(a, text));
#ifdef FP4KV_HAVE_CUDA
  if (gpu) return generate_on_gpu(a, recipe, tokenizer, prompt);
#endif
  (void)gpu;
  return generate_on_cpu(a, recipe, tokenizer, prompt);
}

}  // namespace

Action add_generate(CLI::App& app) {
  auto a = std::make_shared<GenerateArgs>();
  CLI::App* sub = app.add_subcommand("generate", "Generate text from a prompt over an FP4 (or other) KV cache");
  sub->add_option("--model", a->model,
                  "Hugging Face Qwen3 checkpoint directory (byte tokens, or its tokenizer.json), or NAME:random on "
                  "the GPU (speed only)")
      ->capture_default_str();
  sub->add_option("--kv", a->kv, "KV-cache recipe: PRESET[:switch,...]")->capture_default_str();
  CLI::Option* prompt = sub->add_option("--prompt", a->prompt, "prompt text");
  sub->add_option("--prompt-file", a->prompt_file, "file holding the prompt");
  sub->add_option("--max-tokens", a->options.max_tokens, "tokens to generate at most")->capture_default_str();
  sub->add_option("--temperature", a->options.sampling.temperature, "0: greedy")->capture_default_str();
  sub->add_option("--top-k", a->options.sampling.top_k, "keep the k most likely tokens (0: all)")->capture_default_str();
  sub->add_option("--top-p", a->options.sampling.top_p, "nucleus mass in (0, 1]")->capture_default_str();
  sub->add_option("--seed", a->options.sampling.seed, "seed of the sampling draws")->capture_default_str();
  sub->add_option("--device", a->device, "auto (the GPU when one is visible), cpu or cuda")->capture_default_str();
  sub->add_option("--calibration", a->calibration, "calibration file (default: beside the model)");
  sub->add_option("--tensor-parallel", a->tensor_parallel, "GPUs to split the model over (NCCL)")->capture_default_str();
  sub->add_option("--prefill-chunk", a->prefill_chunk, "prompt tokens per prefill chunk on the GPU (as fp4kv serve's)")
      ->capture_default_str();
  sub->add_option("--gemm-plans", a->gemm_plans, kGemmPlansHelp)->capture_default_str();
  sub->add_flag("--chat", a->chat,
                "the prompt is a user message: the checkpoint's chat template writes the model's text");
  sub->add_option("--system", a->system, "with --chat: a system message first");
  sub->add_option("--chat-template", a->chat_template,
                  "with --chat: a Jinja template file instead of the checkpoint's");
  return [a, prompt] {
    a->prompt_given = prompt->count() > 0;
    return run_generate(*a);
  };
}

}  // namespace fp4kv::cli
