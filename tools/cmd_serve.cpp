// `fp4kv serve`: the OpenAI-compatible HTTP server (fp4kv/serve/server.h) over the GPU engine
// (--device auto with a visible device, or cuda) or the CPU engine.
// Binds to loopback unless --host says otherwise, before loading the model (until the engine
// is ready every request gets 503 "loading"); prints the address, then the KV capacity and a
// "listening on" line once it serves; SIGINT/SIGTERM shut it down gracefully (running requests cancelled, their streams ended,
// the worker stopped) and it exits 0.
#include <csignal>
#include <algorithm>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <unistd.h>
#include <thread>

#include "fp4kv/core/error.h"
#include "fp4kv/core/recipe.h"
#include "fp4kv/serve/cpu_engine.h"
#include "fp4kv/serve/serving.h"
#include "fp4kv/serve/server.h"
#include "tools/commands.h"
#include "tools/device_choice.h"
#include "tools/gemm_plans_arg.h"
#include "tools/tensor_parallel_arg.h"
#ifdef FP4KV_HAVE_CUDA
#include "fp4kv/serve/gpu_serving.h"
#endif

namespace fp4kv::cli {

namespace {

constexpr long long kMiB = 1LL << 20;

struct ServeArgs {
  std::string model_dir = "models/pk8l", kv = "nvfp4", calibration;
  int max_batch = 8;
  serve::ServerConfig server;
  std::string device = "auto";
  long long kv_memory_mib = 0;  // 0: the engine's default (CPU: 256 MiB; GPU: --gpu-memory-utilization)
  double gpu_memory_utilization = 0.9;
  int tensor_parallel = 1;
  int prefill_chunk = engine::kServingPrefillChunk;
  // The GPU decode step's GEMM plans: cuBLASLt's heuristic by default (the same bits on every
  // run; our GEMV, the fastest at one row, is 2x slower at 8).
  std::string gemm_plans = "heuristic";
  std::string chat_template;  // a Jinja template file for chat completions (else the checkpoint's)
  std::string generation_config = "auto";  // auto, vllm or a directory (the request defaults' source)
  int max_model_len = 0;  // tokens of one request (0: the model's max_position_embeddings)
};

// --generation-config: null for auto (the checkpoint's, read with the model), OpenAI's for
// vllm, else the directory's generation_config.json (read now: a bad one fails before the
// port is taken).
std::optional<serve::RequestDefaults> generation_defaults(const std::string& source) {
  if (source == "auto") return std::nullopt;
  if (source == "vllm") return serve::RequestDefaults{};
  require(std::filesystem::is_directory(source), "--generation-config: '" + source +
                                                     "' is neither auto, vllm nor a directory");
  const model::GenerationConfig g = model::read_generation_config(source);
  require(!g.path.empty(), "--generation-config: " + source + " has no generation_config.json");
  return serve::request_defaults(g);
}

// SIGINT and SIGTERM write one byte to a pipe (the only async-signal-safe work); a thread
// reading the pipe runs the shutdown as ordinary code. (Blocking the signals instead does not
// cover threads libraries start before main, e.g. OpenBLAS's pool.)
int g_signal_pipe[2] = {-1, -1};

extern "C" void on_shutdown_signal(int sig) {
  const unsigned char b = (unsigned char)sig;
  [[maybe_unused]] const ssize_t n = write(g_signal_pipe[1], &b, 1);
}

void install_shutdown_signals() {
  require(pipe(g_signal_pipe) == 0, "serve: cannot create the signal pipe");
  struct sigaction sa {};
  sa.sa_handler = on_shutdown_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
}

// What the HTTP server runs over, from either engine.
struct Served {
  engine::Engine* engine = nullptr;
  const engine::TextCodec* codec = nullptr;
  const serve::ModelLimits* limits = nullptr;
  std::string recipe, device;
  engine::CacheCapacity capacity;
  long long budget_bytes = 0;
};

// The loaded engines, whichever --device picked (the other stays empty); they outlive the
// server that serves them.
struct Loaded {
  std::optional<serve::CpuServing> cpu;
#ifdef FP4KV_HAVE_CUDA
  std::optional<serve::GpuServing> gpu;
#endif
};

Served load_engine(const ServeArgs& a, bool gpu, Loaded& loaded) {
#ifdef FP4KV_HAVE_CUDA
  if (gpu) {
    serve::GpuServeSetup setup{a.model_dir, a.kv, a.calibration, a.max_batch, a.kv_memory_mib * kMiB,
                               a.gpu_memory_utilization, a.prefill_chunk, a.tensor_parallel,
                               gemm_plans_of(a.gemm_plans), a.max_model_len};
    serve::GpuServing& s = loaded.gpu.emplace(serve::load_gpu_serving(setup));
    const std::string device =
        a.tensor_parallel > 1 ? "cuda (" + std::to_string(a.tensor_parallel) + " GPUs, tensor parallel; KV capacity per GPU)" : "cuda";
    return Served{s.engine.get(), &s.codec, &s.limits, s.recipe.name, device, s.capacity, s.kv_budget_bytes};
  }
#endif
  (void)gpu;
  const long long mib = a.kv_memory_mib > 0 ? a.kv_memory_mib : serve::kDefaultKvBudgetBytes / kMiB;
  serve::CpuServeSetup setup{a.model_dir, a.kv, a.calibration, a.max_batch, mib * kMiB, a.prefill_chunk,
                             a.max_model_len};
  serve::CpuServing& s = loaded.cpu.emplace(serve::load_cpu_serving(setup));
  return Served{s.engine.get(), &s.codec, &s.limits, s.recipe.name, "cpu", s.capacity, mib * kMiB};
}

// Loads the engine while the server already answers (503 "loading"), then hands it over and
// prints the ready line. A load error shuts the server down and is kept for the caller.
void load_and_attach(const ServeArgs& a, bool gpu, Loaded& loaded, serve::HttpServer& server, int port,
                     std::exception_ptr& error) {
  try {
    const Served s = load_engine(a, gpu, loaded);
    if (!server.attach(*s.engine, *s.codec, *s.limits)) return;  // shut down while loading
    std::string names;
    for (const std::string& n : a.server.served_model_names.empty() ? std::vector<std::string>{s.limits->model_name}
                                                                    : a.server.served_model_names)
      names += (names.empty() ? "'" : ", '") + n + "'";
    std::printf("fp4kv serve: model %s (context %d), kv %s, device %s, max batch %d\n", names.c_str(),
                s.limits->context, s.recipe.c_str(), s.device.c_str(), a.max_batch);
    std::printf("fp4kv serve: KV capacity %d blocks x %d tokens = %lld tokens (%lld MiB budget, %lld bytes per block)\n",
                s.capacity.blocks, engine::kBlockTokens, s.capacity.tokens(), s.budget_bytes / kMiB,
                s.capacity.block_bytes);
    const serve::RequestDefaults& defaults =
        a.server.request_defaults ? *a.server.request_defaults : s.limits->defaults;
    std::printf("fp4kv serve: requests without them get %s\n", defaults.describe().c_str());
    const model::ChatTemplate* chat =
        a.server.chat_template ? a.server.chat_template.get() : s.limits->chat_template.get();
    if (chat)
      std::printf("fp4kv serve: chat completions through the chat template of %s\n", chat->origin().c_str());
    else
      std::printf("fp4kv serve: no chat template (give one with --chat-template): /v1/chat/completions answers 400\n");
    std::printf("fp4kv serve: listening on http://%s:%d\n", a.server.host.c_str(), port);
    std::fflush(stdout);
  } catch (...) {
    error = std::current_exception();
    server.shutdown();
  }
}

int run_serve(ServeArgs& a) {
  const bool gpu = use_gpu(a.device);
  check_tensor_parallel(a.tensor_parallel, a.model_dir, gpu);
  require(a.max_batch >= 1, "--max-batch must be >= 1, got " + std::to_string(a.max_batch));
  require(a.kv_memory_mib >= 0, "--kv-memory-mib must be >= 0, got " + std::to_string(a.kv_memory_mib));
  require(a.prefill_chunk >= 1, "--prefill-chunk must be >= 1, got " + std::to_string(a.prefill_chunk));
  check_gemm_plans(a.gemm_plans);
  (void)parse_recipe(a.kv);  // a bad --kv fails before the port is taken
  require(a.server.tool_call_parser.empty() || a.server.tool_call_parser == serve::kHermesToolCalls,
          "--tool-call-parser: '" + a.server.tool_call_parser + "' is not a parser (hermes)");
  a.server.request_defaults = generation_defaults(a.generation_config);
  for (const std::string& name : a.server.served_model_names)
    require(!name.empty(), "--served-model-name: a name must not be empty");
  require(a.server.reasoning_parser.empty() || serve::reasoning_syntax(a.server.reasoning_parser),
          "--reasoning-parser: '" + a.server.reasoning_parser + "' is not a parser (" +
              serve::reasoning_syntax_names() + ")");
  if (!a.chat_template.empty())  // and a template that does not parse
    a.server.chat_template =
        std::make_shared<const model::ChatTemplate>(model::ChatTemplate::from_file(a.chat_template, a.model_dir));
  a.server.http_threads = std::max(a.server.http_threads, 2 * a.max_batch);  // streams hold a thread each
  install_shutdown_signals();
  Loaded loaded;  // declared before the server: destroyed after it
  serve::HttpServer server(a.server);
  const int port = server.bind();
  std::printf("fp4kv serve: bound to http://%s:%d, loading the model (requests get 503 until it is ready)\n",
              a.server.host.c_str(), port);
  std::fflush(stdout);
  std::exception_ptr load_error;
  std::thread loader(load_and_attach, std::cref(a), gpu, std::ref(loaded), std::ref(server), port,
                     std::ref(load_error));
  std::thread signal_thread([&server] {
    unsigned char sig = 0;
    if (read(g_signal_pipe[0], &sig, 1) == 1 && sig != 0)
      std::fprintf(stderr, "fp4kv serve: signal %d, shutting down\n", int(sig));
    server.shutdown();
  });
  server.run();
  // The listener ends through a signal, a load error or a listener error; in the last two the
  // reader still waits: a byte of our own lets it return and be joined.
  const unsigned char wake = 0;
  [[maybe_unused]] const ssize_t n = write(g_signal_pipe[1], &wake, 1);
  signal_thread.join();
  loader.join();
  if (load_error) std::rethrow_exception(load_error);
  std::printf("fp4kv serve: stopped\n");
  return 0;
}

}  // namespace

Action add_serve(CLI::App& app) {
  auto a = std::make_shared<ServeArgs>();
  CLI::App* sub =
      app.add_subcommand("serve", "OpenAI-compatible HTTP server (completions, chat completions) over the engine");
  sub->add_option("--model", a->model_dir, "Hugging Face Qwen3 checkpoint directory")->capture_default_str();
  sub->add_option("--kv", a->kv, "KV-cache recipe: PRESET[:switch,...]")->capture_default_str();
  sub->add_option("--calibration", a->calibration, "calibration file (default: beside the model)");
  sub->add_option("--host", a->server.host, "address to listen on (loopback by default)")->capture_default_str();
  sub->add_option("--port", a->server.port, "port (0: any free port)")->capture_default_str();
  sub->add_option("--device", a->device, "auto (the GPU engine when a device is visible), cpu or cuda")
      ->capture_default_str();
  sub->add_option("--max-batch", a->max_batch, "requests in the running batch at most")->capture_default_str();
  sub->add_option("--tensor-parallel", a->tensor_parallel, "GPUs to split the model over (NCCL)")->capture_default_str();
  sub->add_option("--kv-memory-mib", a->kv_memory_mib,
                  "KV cache memory the block pool is cut from (0: 256 MiB on the CPU, --gpu-memory-utilization on "
                  "the GPU)")
      ->capture_default_str();
  sub->add_option("--gpu-memory-utilization", a->gpu_memory_utilization,
                  "GPU: fraction of the device's memory for weights + KV cache (the cache gets what the weights and "
                  "a 1 GiB activation reserve leave)")
      ->capture_default_str();
  sub->add_option("--prefill-chunk", a->prefill_chunk,
                  "prompt tokens a request feeds per step at most, also the step's token budget (decodes included): "
                  "larger reads long prompts faster, smaller delays running decodes less")
      ->capture_default_str();
  sub->add_option("--gemm-plans", a->gemm_plans, kGemmPlansHelp)->capture_default_str();
  sub->add_option("--api-key", a->server.api_key, "require `Authorization: Bearer KEY` on /v1/*");
  sub->add_option("--tool-call-parser", a->server.tool_call_parser,
                  "hermes: <tool_call> blocks in chat replies become tool_calls (Qwen2.5, Qwen3, Hermes templates); "
                  "without it chat requests with tools need tool_choice \"none\"");
  sub->add_option("--reasoning-parser", a->server.reasoning_parser,
                  "qwen3 or deepseek_r1: the <think> block of chat replies becomes reasoning_content (qwen3: replies "
                  "that open one; deepseek_r1: replies start inside one, the template having opened it)");
  sub->add_option("--max-model-len", a->max_model_len,
                  "tokens of one request, prompt included (0: the model's max_position_embeddings); a smaller "
                  "context than the model's also shrinks the GPU engine's per-request tables")
      ->capture_default_str();
  sub->add_option("--served-model-name", a->server.served_model_names,
                  "the model's names in the API (responses carry the first; requests may name any); default: the "
                  "checkpoint directory's name");
  sub->add_option("--generation-config", a->generation_config,
                  "sampling defaults for requests that leave a field out: auto (the checkpoint's "
                  "generation_config.json: temperature, top_p, top_k, max_new_tokens), vllm (OpenAI's: temperature 1, "
                  "no top-p/top-k cut) or a directory holding a generation_config.json")
      ->capture_default_str();
  sub->add_option("--chat-template", a->chat_template,
                  "Jinja chat template file for /v1/chat/completions (default: the checkpoint's chat_template.jinja "
                  "or tokenizer_config.json chat_template)");
  return [a] { return run_serve(*a); };
}

}  // namespace fp4kv::cli
