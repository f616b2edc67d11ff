// `fp4kv generate`: a prompt through prefill into the recipe's KV cache, then tokens streamed
// to stdout as they are drawn; prompt tokens, prefill time, time per output token and
// tokens/s go to stderr, so the text can be piped. The CPU engine (engine/cpu_generator.h)
// runs everywhere; the GPU engine is not in this build yet, so --device cuda is refused.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>

#include "fp4kv/core/error.h"
#include "fp4kv/core/recipe.h"
#include "fp4kv/engine/cpu_generator.h"
#include "fp4kv/eval/calibration.h"
#include "fp4kv/eval/limits.h"
#include "fp4kv/eval/model_attention.h"
#include "fp4kv/model/byte_tokenizer.h"
#include "fp4kv/model/qwen3.h"
#include "tools/commands.h"

namespace fp4kv::cli {

namespace {

struct GenerateArgs {
  std::string model = "models/pk8l", kv = "nvfp4", prompt, prompt_file, calibration, device = "cpu";
  engine::GenerateOptions options;
  bool prompt_given = false;  // --prompt '' is an empty prompt, not a missing one
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

// The pk8l byte tokenizer is the one this build has (ids 0..255 bytes, 256 BOS, 257 EOS, a
// few unused ids after them): a checkpoint with a real subword vocabulary has no tokenizer
// here yet.
constexpr int kMaxByteVocabulary = 512;
void require_byte_tokenizer(const model::Qwen3Config& c, const std::string& dir) {
  require(c.bos_token_id == model::kByteBos && c.is_eos(model::kByteEos) && c.vocab_size <= kMaxByteVocabulary,
          "--model: '" + dir + "' does not use the byte tokenizer (bos " + std::to_string(c.bos_token_id) +
              ", vocabulary " + std::to_string(c.vocab_size) + "); only byte-level checkpoints like pk8l have a "
              "tokenizer in this build");
}

// The calibration the recipe needs (key smoothing, underflow-aware P): --calibration, else
// the file beside the model; null when the recipe needs none.
std::unique_ptr<eval::Calibration> calibration_for(const GenerateArgs& a, const Recipe& r, const model::Qwen3Model& m) {
  if (!r.smooth_keys && r.prob != ProbFormat::fp4_underflow) return nullptr;
  namespace fs = std::filesystem;
  const std::string path = a.calibration.empty() ? (fs::path(a.model) / eval::kCalibrationFile).string() : a.calibration;
  require(fs::exists(path), "--kv " + r.name + " needs a calibration (mu_k, tau): none at '" + path +
                                "'; run `fp4kv calibrate --model " + a.model + "` or give --calibration");
  eval::require_regular_file(path, "--calibration");
  return std::make_unique<eval::Calibration>(eval::Calibration::load(path, m.config(), m.key_norm_bounds()));
}

int run_generate(const GenerateArgs& a) {
  require(a.device == "cpu" || a.device == "cuda", "--device must be cpu or cuda, got '" + a.device + "'");
  require(a.device == "cpu", "--device cuda: the GPU engine is not part of this build yet; use --device cpu");
  Recipe recipe = parse_recipe(a.kv);
  const std::string text = read_prompt(a);
  require(!text.empty(), "the prompt is empty");
  const model::Qwen3Model m = model::Qwen3Model::load(a.model);
  require_byte_tokenizer(m.config(), a.model);
  const std::unique_ptr<eval::Calibration> cal = calibration_for(a, recipe, m);
  if (cal && recipe.prob == ProbFormat::fp4_underflow) recipe.tau = cal->tau;
  const std::vector<int> prompt = model::encode_bytes(text);
  const model::AttentionFn attend = eval::recipe_attention(m.config(), recipe, cal.get());
  const engine::GenerateStats s = eval::with_memory_guard("generating", [&] {
    return engine::generate_on_cpu(m, attend, prompt, a.options, [&](int token) {
      const std::string piece = model::decode_bytes({token});
      std::fwrite(piece.data(), 1, piece.size(), stdout);
      std::fflush(stdout);
    });
  });
  std::fprintf(stderr,
               "\n[fp4kv generate] device cpu, kv %s: prompt %d tokens, prefill %.3f s, %d tokens generated%s, "
               "%.1f ms per output token, %.2f tokens/s\n",
               recipe.name.c_str(), s.prompt_tokens, s.prefill_seconds, s.generated, s.stopped_at_eos ? " (EOS)" : "",
               1e3 * s.seconds_per_token(), s.tokens_per_second());
  return 0;
}

}  // namespace

Action add_generate(CLI::App& app) {
  auto a = std::make_shared<GenerateArgs>();
  CLI::App* sub = app.add_subcommand("generate", "Generate text from a prompt over an FP4 (or other) KV cache");
  sub->add_option("--model", a->model, "Hugging Face Qwen3 checkpoint directory (byte tokenizer)")->capture_default_str();
  sub->add_option("--kv", a->kv, "KV-cache recipe: PRESET[:switch,...]")->capture_default_str();
  CLI::Option* prompt = sub->add_option("--prompt", a->prompt, "prompt text");
  sub->add_option("--prompt-file", a->prompt_file, "file holding the prompt");
  sub->add_option("--max-tokens", a->options.max_tokens, "tokens to generate at most")->capture_default_str();
  sub->add_option("--temperature", a->options.sampling.temperature, "0: greedy")->capture_default_str();
  sub->add_option("--top-k", a->options.sampling.top_k, "keep the k most likely tokens (0: all)")->capture_default_str();
  sub->add_option("--top-p", a->options.sampling.top_p, "nucleus mass in (0, 1]")->capture_default_str();
  sub->add_option("--seed", a->options.sampling.seed, "seed of the sampling draws")->capture_default_str();
  sub->add_option("--device", a->device, "cpu or cuda")->capture_default_str();
  sub->add_option("--calibration", a->calibration, "calibration file (default: beside the model)");
  return [a, prompt] {
    a->prompt_given = prompt->count() > 0;
    return run_generate(*a);
  };
}

}  // namespace fp4kv::cli
