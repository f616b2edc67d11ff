// fp4kv: FP4 (NVFP4 / MXFP4) KV-cache tools. See README.md.
#include <cstdio>
#include <exception>
#include <new>
#include <vector>

#include "fp4kv/core/error.h"
#include "tools/commands.h"

int main(int argc, char** argv) {
  CLI::App app{"fp4kv: store an LLM's KV cache in 4-bit microscaling formats and decode from it"};
  app.require_subcommand(1);
  std::vector<std::pair<CLI::App*, fp4kv::cli::Action>> commands;
  auto add = [&](auto adder) {
    const size_t before = app.get_subcommands({}).size();
    fp4kv::cli::Action action = adder(app);
    commands.emplace_back(app.get_subcommands({})[before], std::move(action));
  };
  add(fp4kv::cli::add_eval);
  add(fp4kv::cli::add_calibrate);
  add(fp4kv::cli::add_quantize);
  add(fp4kv::cli::add_check_model);
  add(fp4kv::cli::add_generate);
  add(fp4kv::cli::add_bench_report);
#ifdef FP4KV_HAVE_HTTPLIB
  add(fp4kv::cli::add_serve);
  add(fp4kv::cli::add_load_test);
#endif
#ifdef FP4KV_HAVE_CUDA
  add(fp4kv::cli::add_bench);
#endif
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    for (auto& [sub, action] : commands)
      if (sub->parsed()) return action();
  } catch (const fp4kv::Error& e) {
    std::fprintf(stderr, "fp4kv: error: %s\n", e.what());
    return 2;
  } catch (const std::bad_alloc&) {
    // Commands turn this into an Error naming their work; this is the last resort.
    std::fprintf(stderr, "fp4kv: error: out of memory\n");
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fp4kv: internal error: %s\n", e.what());
    return 3;
  }
  return 1;
}
