// `fp4kv bench gemm`: the decode step's weight GEMMs of a model shape (QKV, O, gate_up, down
// or a MoE layer's router, per layer; the LM head), per batch size: cuBLASLt's heuristic algorithm, our GEMV (ops/gemv.h,
// batch <= 8) and the tuned plan (ops::Gemm::tune, which of them it kept), each timed as a
// pass over every layer's matrix in order (as a decode step reads them: together far larger
// than the L2 cache), median of CUDA-event-timed passes. Reports microseconds per matrix, the
// weight-read rate and its fraction of the read bandwidth measured in the same run, and the
// step's total GEMM time per variant against the weight-read floor.
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "fp4kv/core/output_file.h"
#include "fp4kv/engine/gpu_model.h"
#include "fp4kv/engine/gpu_weights.h"
#include "fp4kv/ops/gemm.h"
#include "fp4kv/ops/gemv.h"
#include "fp4kv/testing/bench_support.h"
#include "fp4kv/testing/cuda_testing.h"
#include "tools/bench_output.h"
#include "tools/commands.h"
#include "tools/csv_args.h"

namespace fp4kv::cli {

namespace {

using testing::DeviceBuffer;

struct GemmBenchArgs {
  std::string model = "qwen3-4b:random", batches = "1,2,4,8,16,64";
  int runs = 20;
  std::string json = "bench_gemm.json", markdown = "bench_gemm.md";
};

using engine::StepGemm;

// Median microseconds of one matrix: passes over every weight, divided by their number.
template <class Run>
double per_matrix_us(const StepGemm& g, int runs, Run&& run) {
  for (const auto* w : g.weights) run(w);  // warm-up pass
  const double pass_us = testing::median_event_us(runs, [&](int) {
    for (const auto* w : g.weights) run(w);
  });
  return pass_us / double(g.weights.size());
}

struct GemmTimes {
  double heuristic_us = 0, gemv_us = 0, tuned_us = 0;  // gemv_us 0: not supported at this batch
  int tuned_choice = 0;                                 // Gemm::tune's result
};

GemmTimes time_gemm(const StepGemm& g, int runs) {
  const ops::GemmShape& s = g.shape;
  DeviceBuffer<uint16_t> x(size_t(s.m) * s.k);
  testing::fill_random_bf16(x.get(), x.size(), 7);
  DeviceBuffer<float> y(size_t(s.m) * s.n);  // large enough for either output type
  const auto* xb = reinterpret_cast<const __nv_bfloat16*>(x.get());
  const bool f32 = s.output == ops::GemmOutput::f32;
  auto run_plan = [&](const ops::Gemm& plan) {
    return [&](const __nv_bfloat16* w) {
      if (f32)
        plan.run(xb, w, y.get(), nullptr);
      else
        plan.run(xb, w, reinterpret_cast<__nv_bfloat16*>(y.get()), nullptr);
    };
  };
  GemmTimes t;
  const ops::Gemm heuristic(s);
  t.heuristic_us = per_matrix_us(g, runs, run_plan(heuristic));
  if (ops::gemv_supports(s.m, s.k)) {
    t.gemv_us = per_matrix_us(g, runs, [&](const __nv_bfloat16* w) { ops::gemv(xb, w, y.get(), f32, s.m, s.n, s.k, nullptr); });
  }
  ops::Gemm tuned(s);
  t.tuned_choice = tuned.tune(xb, g.weights, y.get(), nullptr);
  t.tuned_us = per_matrix_us(g, runs, run_plan(tuned));
  return t;
}

std::string choice_name(int choice) {
  return choice == ops::Gemm::kTunedGemv ? "gemv" : "cublasLt #" + std::to_string(choice);
}

int run_bench_gemm(const GemmBenchArgs& A) {
  check_output_writable(A.json, "--json");
  check_output_writable(A.markdown, "--markdown");
  const engine::GpuWeights w = engine::GpuWeights::from_spec(A.model);
  double read_tbs = 0, copy_tbs = 0;
  testing::measure_bandwidth(read_tbs, copy_tbs);
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, 0);
  auto floor_of = [&](int batch) { return double(w.step_read_bytes(batch)) / (read_tbs * 1e12) * 1e6; };
  const double floor_us = floor_of(1);
  std::printf("%s on %s: weights %.2f GB, read %.2f TB/s -> weight-read floor %.0f us per step\n", A.model.c_str(),
              prop.name, w.bytes() / 1e9, read_tbs, floor_us);
  nlohmann::json j = {{"model", A.model}, {"device", prop.name}, {"read_tbs", read_tbs}, {"weight_floor_us", floor_us}};
  std::string md = "| batch | GEMM | MB per matrix | cuBLASLt heuristic us | GEMV us | tuned us | tuned choice | tuned TB/s | "
                   "of read BW |\n|---|---|---|---|---|---|---|---|---|\n";
  for (int m : positive_ints(A.batches, "--batches")) {
    double step_heuristic = 0, step_gemv = 0, step_tuned = 0;
    bool gemv_everywhere = true;
    for (const StepGemm& g : engine::step_gemms(w, m)) {
      const GemmTimes t = time_gemm(g, A.runs);
      const double mb = double(g.shape.n) * g.shape.k * 2 / 1e6;
      const double tbs = mb * 1e6 / (t.tuned_us * 1e-6) / 1e12;
      const double count = double(g.weights.size());  // matrices of this GEMM per step
      step_heuristic += t.heuristic_us * count;
      step_tuned += t.tuned_us * count;
      step_gemv += (t.gemv_us > 0 ? t.gemv_us : t.heuristic_us) * count;
      gemv_everywhere = gemv_everywhere && t.gemv_us > 0;
      std::printf("batch %3d %-8s %7.1f MB: heuristic %8.2f us, gemv %8.2f us, tuned %8.2f us (%s), %.2f TB/s = %.0f%%\n",
                  m, g.name, mb, t.heuristic_us, t.gemv_us, t.tuned_us, choice_name(t.tuned_choice).c_str(), tbs,
                  100 * tbs / read_tbs);
      char gemv[32] = "-", line[300];
      if (t.gemv_us > 0) std::snprintf(gemv, sizeof gemv, "%.2f", t.gemv_us);
      std::snprintf(line, sizeof line, "| %d | %s | %.1f | %.2f | %s | %.2f | %s | %.2f | %.0f %% |\n", m, g.name,
                    mb, t.heuristic_us, gemv, t.tuned_us, choice_name(t.tuned_choice).c_str(), tbs, 100 * tbs / read_tbs);
      md += line;
      j["points"].push_back({{"batch", m}, {"gemm", g.name}, {"n", g.shape.n}, {"k", g.shape.k},
                             {"heuristic_us", t.heuristic_us}, {"gemv_us", t.gemv_us}, {"tuned_us", t.tuned_us},
                             {"tuned_choice", choice_name(t.tuned_choice)}, {"tuned_tbs", tbs}});
    }
    std::printf("batch %3d step GEMMs: heuristic %.0f us, %s%.0f us, tuned %.0f us (%.2fx the weight floor)\n", m,
                step_heuristic, gemv_everywhere ? "gemv " : "gemv where it runs ", step_gemv, step_tuned,
                step_tuned / floor_of(m));
    j["steps"].push_back({{"batch", m}, {"heuristic_us", step_heuristic}, {"gemv_us", step_gemv},
                          {"tuned_us", step_tuned}, {"x_floor", step_tuned / floor_of(m)}});
    std::fflush(stdout);
  }
  write_json_and_markdown(A.json, j, A.markdown, md);
  return 0;
}

}  // namespace

Action add_bench_gemm(CLI::App& bench) {
  auto* cmd = bench.add_subcommand("gemm", "the decode step's weight GEMMs: cuBLASLt, GEMV, tuned; rate vs read bandwidth");
  auto a = std::make_shared<GemmBenchArgs>();
  cmd->add_option("--model", a->model, "NAME:random (qwen3-0.6b ... qwen3-32b) or a checkpoint directory")
      ->capture_default_str();
  cmd->add_option("--batches", a->batches, "batch sizes (GEMM rows), comma-separated")->capture_default_str();
  cmd->add_option("--runs", a->runs, "timed passes per point (median)")->capture_default_str()->check(CLI::Range(1, 10000));
  cmd->add_option("--json", a->json, "JSON output")->capture_default_str();
  cmd->add_option("--markdown", a->markdown, "markdown table output")->capture_default_str();
  return [a, cmd] { return cmd->parsed() ? run_bench_gemm(*a) : 1; };
}

}  // namespace fp4kv::cli
