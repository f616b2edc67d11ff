// `fp4kv serve`: the OpenAI-compatible HTTP server (fp4kv/serve/server.h) over the CPU engine.
// Binds to loopback unless --host says otherwise; prints the address and the KV capacity;
// SIGINT/SIGTERM shut it down gracefully (running requests cancelled, their streams ended,
// the worker stopped) and it exits 0. The GPU engine is not in this build yet, so
// --device cuda is refused.
#include <csignal>
#include <algorithm>
#include <cstdio>
#include <memory>
#include <unistd.h>
#include <thread>

#include "fp4kv/core/error.h"
#include "fp4kv/serve/cpu_engine.h"
#include "fp4kv/serve/server.h"
#include "tools/commands.h"

namespace fp4kv::cli {

namespace {

constexpr long long kMiB = 1LL << 20;

struct ServeArgs {
  serve::CpuServeSetup setup;
  serve::ServerConfig server;
  std::string device = "cpu";
  long long kv_memory_mib = serve::kDefaultKvBudgetBytes / kMiB;
};

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

int run_serve(ServeArgs& a) {
  require(a.device == "cpu" || a.device == "cuda", "--device must be cpu or cuda, got '" + a.device + "'");
  require(a.device == "cpu", "--device cuda: the GPU engine is not part of this build yet; use --device cpu");
  require(a.kv_memory_mib >= 1, "--kv-memory-mib must be >= 1, got " + std::to_string(a.kv_memory_mib));
  a.setup.kv_budget_bytes = a.kv_memory_mib * kMiB;
  serve::CpuServing s = serve::load_cpu_serving(a.setup);
  a.server.http_threads = std::max(a.server.http_threads, 2 * a.setup.max_batch);  // streams hold a thread each
  install_shutdown_signals();
  serve::HttpServer server(*s.engine, s.codec, s.limits, a.server);
  const int port = server.bind();
  std::printf("fp4kv serve: model '%s' (context %d), kv %s, device cpu, max batch %d\n", s.limits.model_name.c_str(),
              s.limits.context, s.recipe.name.c_str(), a.setup.max_batch);
  std::printf("fp4kv serve: KV capacity %d blocks x %d tokens = %lld tokens (%lld MiB budget, %lld bytes per block)\n",
              s.capacity.blocks, engine::kBlockTokens, s.capacity.tokens(), a.kv_memory_mib, s.capacity.block_bytes);
  std::printf("fp4kv serve: listening on http://%s:%d\n", a.server.host.c_str(), port);
  std::fflush(stdout);
  std::thread signal_thread([&server] {
    unsigned char sig = 0;
    if (read(g_signal_pipe[0], &sig, 1) == 1) std::fprintf(stderr, "fp4kv serve: signal %d, shutting down\n", int(sig));
    server.shutdown();
  });
  server.run();
  // The listener ends through a signal or an error; after an error the reader still waits:
  // a byte of our own lets it return and be joined.
  const unsigned char wake = 0;
  [[maybe_unused]] const ssize_t n = write(g_signal_pipe[1], &wake, 1);
  signal_thread.join();
  std::printf("fp4kv serve: stopped\n");
  return 0;
}

}  // namespace

Action add_serve(CLI::App& app) {
  auto a = std::make_shared<ServeArgs>();
  CLI::App* sub = app.add_subcommand("serve", "OpenAI-compatible HTTP server (completions) over the engine");
  sub->add_option("--model", a->setup.model_dir, "Hugging Face Qwen3 checkpoint directory (byte tokenizer)")->capture_default_str();
  sub->add_option("--kv", a->setup.kv, "KV-cache recipe: PRESET[:switch,...]")->capture_default_str();
  sub->add_option("--calibration", a->setup.calibration, "calibration file (default: beside the model)");
  sub->add_option("--host", a->server.host, "address to listen on (loopback by default)")->capture_default_str();
  sub->add_option("--port", a->server.port, "port (0: any free port)")->capture_default_str();
  sub->add_option("--device", a->device, "cpu or cuda")->capture_default_str();
  sub->add_option("--max-batch", a->setup.max_batch, "requests in the running batch at most")->capture_default_str();
  sub->add_option("--kv-memory-mib", a->kv_memory_mib, "KV cache memory the block pool is cut from")->capture_default_str();
  sub->add_option("--api-key", a->server.api_key, "require `Authorization: Bearer KEY` on /v1/*");
  return [a] { return run_serve(*a); };
}

}  // namespace fp4kv::cli
