// `fp4kv bench e2e`: the end-to-end numbers of the GPU engine per KV preset, in one run
// (paper table 1 and figures 10 and 13):
//   tpot        time per output token at long contexts (cache filled through the real
//               quantization path with random K/V: speed only), against the BF16 physical
//               floor (weight bytes + BF16 KV bytes) / the read bandwidth of the same run;
//   throughput  N requests of a long prompt and `--output-tokens` tokens each, submitted at
//               once to the scheduler with the real block pool of --gpu-memory-utilization:
//               output tokens/s, peak running requests, preemptions, every request checked
//               complete (prompts enter the cache by the synthetic prefill of GpuBackend; its
//               fills' own time is reported beside the prompt steps', counted in the rate);
//   overhead    the cache's own work per step (control kernel, append, promotion) at 4K,
//               batch 1: the step graph with it minus the step graph without it;
//   capacity    the longest single context each preset's pool holds, and a 1M-token context
//               with nvfp4 (its TPOT; its last-token logits equal to a second fill of the same
//               cache in other chunks).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "bench/e2e_plot.h"
#include "fp4kv/core/error.h"
#include "fp4kv/core/output_file.h"
#include "fp4kv/core/recipe.h"
#include "fp4kv/engine/block_allocator.h"
#include "fp4kv/engine/engine.h"
#include "fp4kv/engine/gpu_backend.h"
#include "fp4kv/engine/gpu_model.h"
#include "fp4kv/engine/gpu_weights.h"
#include "fp4kv/engine/tensor_parallel_model.h"
#include "fp4kv/testing/bench_support.h"
#include "tools/bench_model.h"
#include "tools/bench_output.h"
#include "tools/commands.h"
#include "tools/csv_args.h"
#include "tools/step_timing.h"
#include "tools/tensor_parallel_arg.h"

namespace fp4kv::cli {

namespace {

constexpr int kMillion = 1000000;
constexpr int kOverheadContext = 4096;  // the paper's figure 13 point (with batch 1)
constexpr int kOverheadRounds = 5;      // alternations of the steps with and without the cache's work

double median_of(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}
constexpr int kFillChunk = 4096;        // prefill chunk of the 1M-token fill
constexpr int kRefillChunk = 65536;     // of the second fill, whose cache must be the same

struct E2eArgs {
  std::string model = "qwen3-4b:random", presets = "bf16,fp8,nvfp4,nvfp4-native,mxfp4";
  std::string parts = "tpot,throughput,overhead,capacity";
  std::string tpot_contexts = "32768,65536,131072,262144", tpot_batches = "1,8", concurrency = "1,8,16,32,64";
  int throughput_context = 65536, output_tokens = 256, runs = 20;
  double gpu_memory_utilization = 0.9;
  std::string json = "bench_e2e.json", markdown = "bench_e2e.md", svg = "bench_e2e.svg";
  int tensor_parallel = 1;
};

struct Run {
  const BenchModel& model;
  double read_tbs = 0;
  nlohmann::json j;
  std::string md;
};

engine::CacheShape shape_of(const model::Qwen3Config& c) {
  return {c.num_hidden_layers, c.num_key_value_heads, c.head_dim};
}

// ---- TPOT ----
void tpot_part(Run& run, const E2eArgs& A) {
  const model::Qwen3Config& c = run.model.gpu_shape();
  run.md += "\n### TPOT (graph step, median of " + std::to_string(A.runs) + "; random K/V, speed only)\n\n"
            "| preset | context | batch | TPOT ms | x bf16 | / BF16 floor | KV GB |\n|---|---|---|---|---|---|---|\n";
  for (int ctx : positive_ints(A.tpot_contexts, "--tpot-contexts"))
    for (int batch : positive_ints(A.tpot_batches, "--tpot-batches")) {
      const long long pages = (ctx + 2 * kPageTokens - 1) / kPageTokens;
      const double bf16_floor_us =
          (run.model.step_weight_bytes(batch) + cache_bytes(c, parse_recipe("bf16"), batch, ctx / kPageTokens)) / (run.read_tbs * 1e12) * 1e6;
      double bf16_us = 0;
      for (const std::string& preset : split_csv(A.presets)) {
        const Recipe r = parse_recipe(preset);
        const double kv = cache_bytes(c, r, batch, pages);
        nlohmann::json e = {{"preset", preset}, {"context", ctx}, {"batch", batch}, {"kv_gb", kv / 1e9},
                            {"bf16_floor_us", bf16_floor_us}};
        char line[256];
        if (!cache_fits_on_device(kv)) {
          e["note"] = "does not fit";
          std::snprintf(line, sizeof line, "| %s | %d | %d | does not fit | | | %.1f |\n", preset.c_str(), ctx, batch, kv / 1e9);
        } else {
          engine::GpuModelOptions o;
          o.gemm_plans = engine::GemmPlans::tuned;  // the benchmarks measure the fastest plans
          o.max_batch = batch;
          o.max_context = int(pages * kPageTokens);
          const engine::LoadedStepModel loaded = run.model.make(r, o);
          engine::StepModel& m = *loaded.model;
          const engine::StepRows rows = rows_at(m, batch, ctx);
          m.fill_random_context(rows, ctx, kFillSeed);
          warm_up_steps(m, rows);
          const double us = median_step_us(m, rows, A.runs);
          m.read_logits();  // the step's error flags
          if (preset == "bf16") bf16_us = us;
          e["tpot_us"] = us;
          e["x_bf16"] = bf16_us > 0 ? bf16_us / us : 0.0;
          e["x_bf16_floor"] = us / bf16_floor_us;
          std::snprintf(line, sizeof line, "| %s | %d | %d | %.2f | %s | %.2f | %.1f |\n", preset.c_str(), ctx, batch,
                        us / 1e3, bf16_us > 0 ? std::to_string(bf16_us / us).substr(0, 4).c_str() : "-",
                        us / bf16_floor_us, kv / 1e9);
        }
        std::printf("%s", line);
        std::fflush(stdout);
        run.md += line;
        run.j["tpot"].push_back(e);
      }
    }
}

// ---- throughput vs concurrency ----
struct ThroughputPoint {
  int requests = 0, peak_running = 0, completed = 0;
  long long preemptions = 0, output_tokens = 0;
  double seconds = 0;
  // Where the wall time went: steps that fed a prompt chunk (with the decodes beside it), and
  // decode-only steps with the rows they decoded.
  double prompt_step_seconds = 0, decode_step_seconds = 0;
  double fill_seconds = 0;  // of the prompt steps: the synthetic fills (a stand-in for prompt forward passes)
  long long decode_steps = 0, decode_rows = 0;
};

// One scheduler step, timed and classified by what it fed (fed tokens beyond one per running
// request are a prompt chunk). Returns Engine::step's "more work".
bool timed_step(engine::Engine& e, ThroughputPoint& pt) {
  const engine::SchedulerCounters before = e.counters();
  const auto t0 = std::chrono::steady_clock::now();
  const bool more = e.step();
  const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const engine::SchedulerCounters after = e.counters();
  const long long fed = after.fed_tokens - before.fed_tokens;
  if (fed > before.running) {
    pt.prompt_step_seconds += dt;
  } else {
    pt.decode_step_seconds += dt;
    pt.decode_steps += 1;
    pt.decode_rows += fed;
  }
  pt.peak_running = std::max(pt.peak_running, after.running);
  return more;
}

ThroughputPoint run_concurrency(engine::Engine& e, const engine::GpuBackend& backend, int n, int context, int output,
                                int vocab, uint64_t seed) {
  std::mt19937 rng{static_cast<uint32_t>(seed)};
  std::uniform_int_distribution<int> token(0, vocab - 1);
  const long long preempted_before = e.counters().preemptions;
  std::vector<uint64_t> ids;
  for (int i = 0; i < n; ++i) {
    std::vector<int> prompt(context);
    for (int& t : prompt) t = token(rng);
    engine::RequestParams p;
    p.max_tokens = output;
    p.stop_at_eos = false;
    ids.push_back(e.submit(std::move(prompt), p));
  }
  ThroughputPoint pt;
  pt.requests = n;
  const double fill_before = backend.synthetic_fill_seconds();
  const auto t0 = std::chrono::steady_clock::now();
  while (timed_step(e, pt)) {
  }
  pt.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  pt.fill_seconds = backend.synthetic_fill_seconds() - fill_before;
  pt.preemptions = e.counters().preemptions - preempted_before;
  for (uint64_t id : ids) {  // every request must have produced all its tokens
    long long got = 0;
    for (;;) {
      const engine::StreamChunk c = e.next(id, std::chrono::milliseconds(0));
      got += (long long)c.tokens.size();
      if (c.finished != engine::FinishReason::none || c.timed_out) break;
    }
    pt.output_tokens += got;
    pt.completed += got == output;
  }
  return pt;
}

void throughput_part(Run& run, const E2eArgs& A) {
  const model::Qwen3Config& c = run.model.config();
  const std::vector<int> levels = positive_ints(A.concurrency, "--concurrency");
  const int max_batch = *std::max_element(levels.begin(), levels.end());
  run.md += "\n### Throughput vs concurrency (" + std::to_string(A.throughput_context) + "-token prompts, " +
            std::to_string(A.output_tokens) + " output tokens each; block pool of --gpu-memory-utilization " +
            std::to_string(A.gpu_memory_utilization).substr(0, 4) + ")\n\n"
            "| preset | pool tokens | requests | output tok/s | x bf16 | peak running | preemptions | completed | "
            "prompt steps s (fill s) | decode steps s | decode step ms (mean rows) |\n"
            "|---|---|---|---|---|---|---|---|---|---|---|\n";
  std::vector<double> bf16_rate(levels.size(), 0.0);
  for (const std::string& preset : split_csv(A.presets)) {
    const Recipe r = parse_recipe(preset);
    const engine::CacheCapacity cap =
        engine::cache_capacity(r.kv, shape_of(run.model.gpu_shape()), run.model.kv_budget(A.gpu_memory_utilization), max_batch);
    engine::GpuModelOptions o;
    o.gemm_plans = engine::GemmPlans::tuned;  // the benchmarks measure the fastest plans
    o.max_batch = max_batch;
    o.max_context = A.throughput_context + A.output_tokens + kPageTokens;
    o.num_blocks = cap.blocks;
    const engine::LoadedStepModel loaded = run.model.make(r, o);
    engine::StepModel& m = *loaded.model;
    m.prepare_steps(max_batch);  // every batch size's plans and graph before the clock starts, as a server
    engine::SchedulerConfig sc;
    sc.max_batch = max_batch;
    sc.prefill_chunk = A.throughput_context;  // a prompt enters in one synthetic chunk
    sc.max_step_tokens = A.throughput_context + max_batch;
    sc.total_blocks = cap.blocks;
    auto backend = std::make_unique<engine::GpuBackend>(m, /*synthetic_prefill=*/true);
    const engine::GpuBackend& gpu_backend = *backend;
    engine::Engine e(std::move(backend), sc,
                     engine::TextCodec{[](std::string_view) { return std::vector<int>{}; },
                                       [](const std::vector<int>&) { return std::string(); }});
    for (size_t i = 0; i < levels.size(); ++i) {
      const ThroughputPoint pt =
          run_concurrency(e, gpu_backend, levels[i], A.throughput_context, A.output_tokens, c.vocab_size, 100 + i);
      const double rate = double(pt.output_tokens) / pt.seconds;
      if (preset == "bf16") bf16_rate[i] = rate;
      const double decode_ms = pt.decode_steps ? 1e3 * pt.decode_step_seconds / double(pt.decode_steps) : 0.0;
      const double decode_rows = pt.decode_steps ? double(pt.decode_rows) / double(pt.decode_steps) : 0.0;
      char line[320];
      std::snprintf(line, sizeof line,
                    "| %s | %lld | %d | %.0f | %s | %d | %lld | %d / %d | %.2f (%.2f) | %.2f | %.2f (%.1f) |\n",
                    preset.c_str(), cap.tokens(), pt.requests, rate,
                    bf16_rate[i] > 0 ? std::to_string(rate / bf16_rate[i]).substr(0, 4).c_str() : "-", pt.peak_running,
                    pt.preemptions, pt.completed, pt.requests, pt.prompt_step_seconds, pt.fill_seconds,
                    pt.decode_step_seconds, decode_ms, decode_rows);
      std::printf("%s", line);
      std::fflush(stdout);
      run.md += line;
      run.j["throughput"].push_back({{"preset", preset}, {"pool_tokens", cap.tokens()}, {"requests", pt.requests},
                                     {"output_tokens_per_s", rate}, {"per_gpu_tokens_per_s", rate / run.model.ranks()},
                                     {"peak_running", pt.peak_running},
                                     {"preemptions", pt.preemptions}, {"completed", pt.completed},
                                     {"seconds", pt.seconds}, {"prompt_step_seconds", pt.prompt_step_seconds},
                                     {"synthetic_fill_seconds", pt.fill_seconds},
                                     {"decode_step_seconds", pt.decode_step_seconds}, {"decode_steps", pt.decode_steps},
                                     {"decode_rows", pt.decode_rows}});
    }
  }
}

// ---- the cache's own work per step ----
void overhead_part(Run& run, const E2eArgs& A) {
  run.md += "\n### The cache's work per step (4K context, batch 1, graph steps)\n\n"
            "| preset | step us | step without cache work us | cache work us |\n|---|---|---|---|\n";
  for (const std::string& preset : split_csv(A.presets)) {
    engine::GpuModelOptions o;
    o.gemm_plans = engine::GemmPlans::tuned;  // the benchmarks measure the fastest plans
    o.max_batch = 1;
    o.max_context = kOverheadContext + kPageTokens;
    const engine::LoadedStepModel loaded = run.model.make(parse_recipe(preset), o);
    engine::StepModel& m = *loaded.model;
    const engine::StepRows rows = rows_at(m, 1, kOverheadContext);
    m.fill_random_context(rows, kOverheadContext, kFillSeed);
    // The two step graphs (same GEMM plans) alternate in rounds and each side keeps the median
    // of its round medians: a drift of the clocks during the measurement hits both sides alike.
    std::vector<double> with_rounds, without_rounds;
    for (int round = 0; round < kOverheadRounds; ++round) {
      for (const bool updates : {true, false}) {
        m.set_cache_updates(updates);
        warm_up_steps(m, rows);
        (updates ? with_rounds : without_rounds).push_back(median_step_us(m, rows, A.runs));
      }
    }
    m.set_cache_updates(true);
    const double with = median_of(with_rounds), without = median_of(without_rounds);
    char line[200];
    std::snprintf(line, sizeof line, "| %s | %.1f | %.1f | %.1f |\n", preset.c_str(), with, without, with - without);
    std::printf("%s", line);
    run.md += line;
    run.j["overhead"].push_back({{"preset", preset}, {"step_us", with}, {"without_cache_work_us", without}});
  }
}

// ---- capacity and the 1M-token context ----
void capacity_part(Run& run, const E2eArgs& A) {
  const model::Qwen3Config& c = run.model.gpu_shape();
  const long long budget = run.model.kv_budget(A.gpu_memory_utilization);
  run.md += "\n### Capacity (one request, KV budget " + std::to_string(budget / (1LL << 20)) + " MiB)\n\n"
            "| preset | longest context (tokens) |\n|---|---|\n";
  for (const std::string& preset : split_csv(A.presets)) {
    const engine::CacheCapacity cap = engine::cache_capacity(parse_recipe(preset).kv, shape_of(c), budget, 1);
    run.md += "| " + preset + " | " + std::to_string(cap.tokens()) + " |\n";
    run.j["capacity"].push_back({{"preset", preset}, {"tokens", cap.tokens()}});
    std::printf("capacity %s: %lld tokens\n", preset.c_str(), cap.tokens());
  }
  const Recipe r = parse_recipe("nvfp4");
  const long long pages = (kMillion + 2 * kPageTokens - 1) / kPageTokens;
  if (cache_bytes(c, r, 1, pages) > double(budget)) {
    run.md += "\n1M tokens with nvfp4: does not fit in the budget\n";
    return;
  }
  engine::GpuModelOptions o;
  o.gemm_plans = engine::GemmPlans::tuned;  // the benchmarks measure the fastest plans
  o.max_batch = 1;
  o.max_context = int(pages * kPageTokens);
  o.num_blocks = int(pages);
  const engine::LoadedStepModel loaded = run.model.make(r, o);
  engine::StepModel& m = *loaded.model;
  const engine::StepRows rows = rows_at(m, 1, kMillion);
  m.fill_random_tokens(rows, 0, kMillion, kFillSeed, kFillChunk);
  m.step(rows);
  const std::vector<float> first = m.read_logits();
  warm_up_steps(m, rows);
  const double us = median_step_us(m, rows, A.runs);
  m.release(rows.block_tables[0]);
  m.fill_random_tokens(rows, 0, kMillion, kFillSeed, kRefillChunk);  // the same cache, other chunks
  m.step(rows);
  const std::vector<float> second = m.read_logits();
  const bool same = first.size() == second.size() && std::memcmp(first.data(), second.data(), first.size() * 4) == 0;
  char line[300];
  std::snprintf(line, sizeof line,
                "\n1M-token context (%d tokens), nvfp4, batch 1: TPOT %.2f ms; last-token logits after a refill in "
                "%d-token chunks %s those after %d-token chunks\n",
                kMillion, us / 1e3, kRefillChunk, same ? "equal, bit for bit," : "DIFFER from", kFillChunk);
  std::printf("%s", line);
  run.md += line;
  run.j["million"] = {{"tokens", kMillion}, {"tpot_us", us}, {"refill_identical", same}};
}

int run_bench_e2e(const E2eArgs& A) {
  check_output_writable(A.json, "--json");
  check_output_writable(A.markdown, "--markdown");
  if (!A.svg.empty()) check_output_writable(A.svg, "--svg");
  const std::vector<std::string> parts = split_csv(A.parts);
  auto wants = [&](const char* p) { return std::find(parts.begin(), parts.end(), p) != parts.end(); };
  for (const std::string& p : parts)
    require(p == "tpot" || p == "throughput" || p == "overhead" || p == "capacity",
            "--parts: unknown part '" + p + "' (tpot, throughput, overhead, capacity)");
  for (const std::string& p : split_csv(A.presets)) parse_recipe(p);  // fail before the work
  const BenchModel model(A.model, A.tensor_parallel);
  Run run{model, 0.0, {}, {}};
  double copy_tbs = 0;
  testing::measure_bandwidth(run.read_tbs, copy_tbs);
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, 0);
  const int ranks = model.ranks();
  run.j = {{"model", A.model}, {"device", prop.name}, {"read_tbs", run.read_tbs}, {"weight_bytes", model.weight_bytes()},
           {"tensor_parallel", ranks}};
  run.md = "## fp4kv bench e2e: " + A.model + " on " + prop.name + " (read " + std::to_string(run.read_tbs).substr(0, 4) +
           " TB/s, weights " + std::to_string(model.weight_bytes() / 1e9).substr(0, 5) + " GB" +
           (ranks > 1 ? " per GPU; tensor parallel over " + std::to_string(ranks) +
                            " GPUs: KV sizes, floors and capacities per GPU, tokens/s of the group"
                      : "") +
           ")\n";
  std::printf("%s", run.md.c_str());
  if (wants("tpot")) tpot_part(run, A);
  if (wants("overhead")) overhead_part(run, A);
  if (wants("capacity")) capacity_part(run, A);
  if (wants("throughput")) throughput_part(run, A);
  write_json_and_markdown(A.json, run.j, A.markdown, run.md);
  if (!A.svg.empty() && (wants("tpot") || wants("throughput"))) {
    write_output_file(A.svg, bench::e2e_svg(bench::parse_e2e(run.j.dump(), A.json)), "--svg");
    std::printf("wrote %s\n", A.svg.c_str());
  }
  return 0;
}

}  // namespace

Action add_bench_e2e(CLI::App& bench) {
  auto* cmd = bench.add_subcommand("e2e", "end to end: TPOT, throughput vs concurrency, cache work, capacity, 1M tokens");
  auto a = std::make_shared<E2eArgs>();
  cmd->add_option("--model", a->model, "NAME:random (qwen3-0.6b ... qwen3-32b) or a checkpoint directory")
      ->capture_default_str();
  cmd->add_option("--presets", a->presets, "recipe presets, comma-separated")->capture_default_str();
  cmd->add_option("--tensor-parallel", a->tensor_parallel, "GPUs to split the model over (NCCL)")->capture_default_str();
  cmd->add_option("--parts", a->parts, "which measurements: tpot,throughput,overhead,capacity")->capture_default_str();
  cmd->add_option("--tpot-contexts", a->tpot_contexts, "TPOT contexts (tokens)")->capture_default_str();
  cmd->add_option("--tpot-batches", a->tpot_batches, "TPOT batch sizes")->capture_default_str();
  cmd->add_option("--concurrency", a->concurrency, "requests submitted at once, per throughput point")->capture_default_str();
  cmd->add_option("--throughput-context", a->throughput_context, "prompt tokens per throughput request")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 24));
  cmd->add_option("--output-tokens", a->output_tokens, "output tokens per throughput request")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--gpu-memory-utilization", a->gpu_memory_utilization, "fraction of GPU memory for weights + KV")
      ->capture_default_str()
      ->check(CLI::Range(0.05, 1.0));
  cmd->add_option("--runs", a->runs, "timed steps per TPOT point (median)")->capture_default_str()->check(CLI::Range(1, 10000));
  cmd->add_option("--json", a->json, "JSON output")->capture_default_str();
  cmd->add_option("--markdown", a->markdown, "markdown output")->capture_default_str();
  cmd->add_option("--svg", a->svg, "SVG plot of TPOT and throughput (empty: none)")->capture_default_str();
  return [a, cmd] { return cmd->parsed() ? run_bench_e2e(*a) : 1; };
}

}  // namespace fp4kv::cli
