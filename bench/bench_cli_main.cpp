// `fp4kv_bench`: the `fp4kv bench` and `fp4kv bench-report` subcommands (tools/cmd_bench.cpp,
// tools/cmd_bench_report.cpp) alone, without the CPU evaluation code (and its BLAS), so they
// can be carried to a GPU machine as one small binary: `fp4kv_bench bench decode ...` runs
// exactly `fp4kv bench decode ...`, and likewise `fp4kv_bench bench-report ...`.
#include <cstdio>
#include <exception>

#include "fp4kv/core/error.h"
#include "tools/commands.h"

int main(int argc, char** argv) {
  CLI::App app{"fp4kv bench (standalone build of the fp4kv CLI's bench subcommand)"};
  app.require_subcommand(1);
  const fp4kv::cli::Action bench = fp4kv::cli::add_bench(app);
  const fp4kv::cli::Action report = fp4kv::cli::add_bench_report(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    return app.got_subcommand("bench-report") ? report() : bench();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fp4kv bench: error: %s\n", e.what());
    return 2;
  }
}
