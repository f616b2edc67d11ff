// `fp4kv bench step`: the GPU engine's decode step (engine/gpu_model.h) of a model shape
// (random weights, `NAME:random`) over a cache filled to a context through the real prefill
// and quantization path (random K/V: speed only), per preset, context and batch: time per
// step as a replayed CUDA graph and eager, the eager step's breakdown (GEMMs, attention,
// cache, collectives, other), and the weight-read floor (weight bytes / the read bandwidth
// measured in the same run). Points whose cache does not fit in GPU memory are reported, not
// run. With --tensor-parallel N the model is split over N GPUs (bench_model.h): the floor,
// cache sizes and breakdown are rank 0's, and "collectives" is the all-reduces' share.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <numeric>
#include <string>
#include <vector>

#include "fp4kv/cache/cuda_check.h"
#include "fp4kv/cache/layout.h"
#include "fp4kv/core/error.h"
#include "fp4kv/core/output_file.h"
#include "fp4kv/core/recipe.h"
#include "fp4kv/engine/gpu_model.h"
#include "fp4kv/engine/gpu_weights.h"
#include "fp4kv/testing/bench_support.h"
#include "tools/bench_model.h"
#include "tools/bench_output.h"
#include "tools/commands.h"
#include "tools/csv_args.h"
#include "tools/step_timing.h"

namespace fp4kv::cli {

namespace {

struct StepBenchArgs {
  std::string model = "qwen3-4b:random", presets = "bf16,nvfp4", contexts = "4096,32768", batches = "1,64";
  int runs = 20, tensor_parallel = 1;
  std::string json = "bench_step.json", markdown = "bench_step.md";
};

struct StepPoint {
  std::string preset, note;
  int context = 0, batch = 0;
  double graph_us = 0, eager_us = 0, cache_gb = 0;
  engine::StepProfile parts;
  bool ran = false;
};

StepPoint run_point(const BenchModel& model, const std::string& preset, int context, int batch, int runs) {
  StepPoint pt;
  pt.preset = preset;
  pt.context = context;
  pt.batch = batch;
  const Recipe r = parse_recipe(preset);
  engine::GpuModelOptions o;
  o.gemm_plans = engine::GemmPlans::tuned;  // the benchmarks measure the fastest plans
  o.max_batch = batch;
  o.max_context = context + cache::kPage;
  const int pages = (o.max_context + cache::kPage - 1) / cache::kPage;
  pt.cache_gb = cache_bytes(model.gpu_shape(), r, batch, pages) / 1e9;
  if (!cache_fits_on_device(pt.cache_gb * 1e9)) {
    pt.note = "cache of " + std::to_string(pt.cache_gb) + " GB does not fit beside the weights";
    return pt;
  }
  const engine::LoadedStepModel loaded = model.make(r, o);
  engine::StepModel& m = *loaded.model;
  const engine::StepRows rows = rows_at(m, batch, context);
  m.fill_random_context(rows, context, kFillSeed);
  warm_up_steps(m, rows);
  pt.graph_us = median_step_us(m, rows, runs);
  m.set_cuda_graphs(false);
  m.step(rows);
  pt.eager_us = median_step_us(m, rows, runs);
  pt.parts = m.profile_step(rows);
  m.read_logits();  // checks the step's error flags
  pt.ran = true;
  return pt;
}

int run_bench_step(const StepBenchArgs& A) {
  check_output_writable(A.json, "--json");
  check_output_writable(A.markdown, "--markdown");
  const BenchModel model(A.model, A.tensor_parallel);
  double read_tbs = 0, copy_tbs = 0;
  testing::measure_bandwidth(read_tbs, copy_tbs);
  // The weight-read floor of a step of `batch` rows (a MoE model reads only the chosen experts).
  auto floor_of = [&](int batch) { return model.step_weight_bytes(batch) / (read_tbs * 1e12) * 1e6; };
  const double floor_us = floor_of(1);
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, 0);
  std::printf("%s on %s: weights %.2f GB%s, read %.2f TB/s -> weight-read floor %.0f us per step\n", A.model.c_str(),
              prop.name, model.weight_bytes() / 1e9, model.ranks() > 1 ? " per GPU" : "", read_tbs, floor_us);
  std::printf("%-14s %7s %5s %10s %10s %7s %9s %9s %9s %9s %9s %8s\n", "preset", "ctx", "batch", "graph_us", "eager_us",
              "x_floor", "gemm_us", "attn_us", "cache_us", "coll_us", "other_us", "KV_GB");
  nlohmann::json j;
  j["model"] = A.model;
  j["device"] = prop.name;
  j["read_tbs"] = read_tbs;
  j["weight_bytes"] = model.weight_bytes();
  j["tensor_parallel"] = model.ranks();
  j["weight_floor_us"] = floor_us;
  std::string md = "| preset | context | batch | step (graph) us | eager us | / weight floor | GEMM us | attention us | "
                   "cache us | collectives us | other us | KV GB |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n";
  for (int ctx : positive_ints(A.contexts, "--contexts"))
    for (int batch : positive_ints(A.batches, "--batches"))
      for (const std::string& preset : split_csv(A.presets)) {
        const StepPoint p = run_point(model, preset, ctx, batch, A.runs);
        nlohmann::json e = {{"preset", p.preset}, {"context", p.context}, {"batch", p.batch}, {"kv_gb", p.cache_gb}};
        char line[400];
        if (!p.ran) {
          e["note"] = p.note;
          std::printf("%-14s %7d %5d  %s\n", p.preset.c_str(), ctx, batch, p.note.c_str());
          std::snprintf(line, sizeof line, "| %s | %d | %d | %s | | | | | | | | %.1f |\n", p.preset.c_str(), ctx, batch,
                        p.note.c_str(), p.cache_gb);
        } else {
          e["graph_us"] = p.graph_us;
          e["eager_us"] = p.eager_us;
          e["x_floor"] = p.graph_us / floor_of(batch);
          for (int k = 0; k < engine::kStepParts; ++k)
            e[std::string(engine::step_part_name(engine::StepPart(k))) + "_us"] = p.parts.us[k];
          auto part = [&p](engine::StepPart k) { return p.parts.us[int(k)]; };
          using engine::StepPart;
          std::printf("%-14s %7d %5d %10.1f %10.1f %7.2f %9.1f %9.1f %9.1f %9.1f %9.1f %8.1f\n", p.preset.c_str(), ctx,
                      batch, p.graph_us, p.eager_us, p.graph_us / floor_of(batch), part(StepPart::gemm),
                      part(StepPart::attention), part(StepPart::cache), part(StepPart::collective),
                      part(StepPart::other), p.cache_gb);
          std::snprintf(line, sizeof line, "| %s | %d | %d | %.1f | %.1f | %.2f | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f |\n",
                        p.preset.c_str(), ctx, batch, p.graph_us, p.eager_us, p.graph_us / floor_of(batch),
                        part(StepPart::gemm), part(StepPart::attention), part(StepPart::cache),
                        part(StepPart::collective), part(StepPart::other), p.cache_gb);
        }
        std::fflush(stdout);
        md += line;
        j["points"].push_back(e);
      }
  write_json_and_markdown(A.json, j, A.markdown, md);
  return 0;
}

}  // namespace

Action add_bench_step(CLI::App& bench) {
  auto* cmd = bench.add_subcommand("step", "the GPU engine's decode step: graph vs eager, breakdown, weight floor");
  auto a = std::make_shared<StepBenchArgs>();
  cmd->add_option("--model", a->model, "NAME:random (qwen3-0.6b ... qwen3-32b) or a checkpoint directory")
      ->capture_default_str();
  cmd->add_option("--presets", a->presets, "recipe presets, comma-separated")->capture_default_str();
  cmd->add_option("--contexts", a->contexts, "context lengths (tokens), comma-separated")->capture_default_str();
  cmd->add_option("--batches", a->batches, "batch sizes, comma-separated")->capture_default_str();
  cmd->add_option("--runs", a->runs, "timed steps per point (median)")->capture_default_str()->check(CLI::Range(1, 10000));
  cmd->add_option("--json", a->json, "JSON output")->capture_default_str();
  cmd->add_option("--markdown", a->markdown, "markdown table output")->capture_default_str();
  cmd->add_option("--tensor-parallel", a->tensor_parallel, "GPUs to split the model over (NCCL)")->capture_default_str();
  return [a, cmd] { return cmd->parsed() ? run_bench_step(*a) : 1; };
}

}  // namespace fp4kv::cli
