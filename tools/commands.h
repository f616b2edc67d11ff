// Subcommands of the fp4kv CLI: each file registers its options and its action.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>

namespace fp4kv::cli {

// Adds the subcommand to `app`; the returned action runs it and gives the exit code.
using Action = std::function<int()>;
Action add_quantize(CLI::App& app);
Action add_eval(CLI::App& app);
Action add_calibrate(CLI::App& app);
Action add_check_model(CLI::App& app);
Action add_generate(CLI::App& app);  // `fp4kv generate`: prompt -> streamed tokens
Action add_bench_report(CLI::App& app);  // `fp4kv bench-report`: render a decode sweep's JSON
#ifdef FP4KV_HAVE_HTTPLIB
Action add_serve(CLI::App& app);  // `fp4kv serve`: OpenAI-compatible HTTP server (with cpp-httplib)
Action add_load_test(CLI::App& app);  // `fp4kv load-test`: load run / soak against a server
#endif
#ifdef FP4KV_HAVE_CUDA
Action add_bench(CLI::App& app);  // `fp4kv bench decode|step|e2e|gemm|prefill|mla` (CUDA builds only)
Action add_bench_step(CLI::App& bench);  // `fp4kv bench step`: the GPU engine's decode step
Action add_bench_e2e(CLI::App& bench);   // `fp4kv bench e2e`: TPOT, throughput, capacity
Action add_bench_gemm(CLI::App& bench);  // `fp4kv bench gemm`: the step's weight GEMMs
Action add_bench_prefill(CLI::App& bench);  // `fp4kv bench prefill`: the chunked-prefill attention kernel
Action add_bench_mla(CLI::App& bench);  // `fp4kv bench mla`: MLA decode over BF16 and FP4 latent caches
#endif

}  // namespace fp4kv::cli
