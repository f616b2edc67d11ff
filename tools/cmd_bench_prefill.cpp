// `fp4kv bench prefill`: the chunked-prefill attention kernel (attention/prefill.h) of one
// layer. Two measurements per point, median of CUDA-event-timed runs:
//   from scratch: a prompt of `context` tokens as one chunk (causal BF16 attention, the
//     case PyTorch SDPA's causal kernel runs; bench/sdpa_prefill_baseline.py times that in
//     the same device call), FLOPs 2 T^2 d H_q (the causal half of 4 T^2 d H_q);
//   after a prefix: the last `--chunk` tokens of `context`, attending to the cached prefix in
//     the preset's format (expanded window by window) and to themselves, FLOPs
//     4 T P d H_q + 2 T^2 d H_q.
// Reports milliseconds and TFLOP/s.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "fp4kv/attention/prefill.h"
#include "fp4kv/cache/kv_cache.h"
#include "fp4kv/core/error.h"
#include "fp4kv/core/output_file.h"
#include "fp4kv/core/recipe.h"
#include "fp4kv/testing/bench_support.h"
#include "fp4kv/testing/cuda_testing.h"
#include "tools/bench_output.h"
#include "tools/commands.h"
#include "tools/csv_args.h"

namespace fp4kv::cli {

namespace {

using testing::DeviceBuffer;

struct PrefillBenchArgs {
  std::string presets = "bf16,nvfp4", contexts = "4096,32768", cta_rows = "64,128", mma = "sync,warpgroup";
  int q_heads = 32, kv_heads = 8, head_dim = 128, chunk = 2048, runs = 10;
  int prefix_window = 16384;
  std::string json = "bench_prefill.json", markdown = "bench_prefill.md";
};

struct PrefillPoint {
  double scratch_ms = 0, scratch_tflops = 0;  // the whole context as one chunk
  double chunk_ms = 0, chunk_tflops = 0;      // the last chunk after the cached prefix
};

// Writes tokens [0, n) of random K/V into layer 0 of the cache for the request `row`.
void fill_prefix(cache::KvCache& cache, const int32_t* row, int n) {
  const cache::KvCacheConfig& c = cache.config();
  constexpr int kFillChunk = 4096;
  DeviceBuffer<float> k(size_t(kFillChunk) * c.kv_heads * c.head_dim), v(k.size());
  for (int first = 0; first < n; first += kFillChunk) {
    const int count = std::min(kFillChunk, n - first);
    testing::fill_random_float(k.get(), k.size(), 2.0f, 100 + first);
    testing::fill_random_float(v.get(), v.size(), 1.0f, 200 + first);
    cache.prefill(0, row, first, count, k.get(), v.get(), nullptr);
  }
}

// One kernel variant: the instruction and, for mma.sync, the CTA height.
struct PrefillVariant {
  attention::PrefillMma mma = attention::PrefillMma::sync;
  int cta_rows = 64;
  std::string name() const {
    return mma == attention::PrefillMma::warpgroup ? "wgmma" : "mma.sync " + std::to_string(cta_rows);
  }
};

std::vector<PrefillVariant> variants_of(const PrefillBenchArgs& A) {
  std::vector<PrefillVariant> v;
  for (const std::string& m : split_csv(A.mma)) {
    if (m == "warpgroup") {
      if (A.head_dim == attention::PrefillAttention::kWarpgroupHeadDim)
        v.push_back({attention::PrefillMma::warpgroup, attention::PrefillAttention::kWideCtaRows});
      else  // the wgmma kernel would fall back to mma.sync: no row under its name
        std::printf("--mma warpgroup: head_dim %d runs mma.sync (wgmma needs %d); not measured\n", A.head_dim,
                    attention::PrefillAttention::kWarpgroupHeadDim);
    } else {
      require(m == "sync", "--mma: unknown instruction '" + m + "' (sync, warpgroup)");
      for (int rows : positive_ints(A.cta_rows, "--cta-rows")) v.push_back({attention::PrefillMma::sync, rows});
    }
  }
  return v;
}

PrefillPoint measure(const PrefillBenchArgs& A, const Recipe& recipe, int context, const PrefillVariant& variant) {
  const int chunk = std::min(A.chunk, context);
  cache::KvCacheConfig cfg;
  cfg.layers = 1;
  cfg.kv_heads = A.kv_heads;
  cfg.head_dim = A.head_dim;
  cfg.max_pages = (context + kPageTokens - 1) / kPageTokens;
  cfg.num_blocks = cfg.max_pages;
  cfg.max_slots = 1;
  cfg.max_batch = 1;
  cache::KvCache cache(cfg, recipe);
  std::vector<int32_t> blocks(size_t(cfg.max_pages));
  for (int p = 0; p < cfg.max_pages; ++p) blocks[size_t(p)] = p;
  DeviceBuffer<int32_t> row(blocks);
  attention::PrefillConfig pc;
  pc.q_heads = A.q_heads;
  pc.max_chunk_tokens = context;
  pc.prefix_window = A.prefix_window;
  pc.cta_rows = variant.cta_rows;
  pc.mma = variant.mma;
  const attention::PrefillAttention attn(cache, pc);
  const size_t qn = size_t(context) * A.q_heads * A.head_dim, kvn = size_t(context) * A.kv_heads * A.head_dim;
  DeviceBuffer<uint16_t> q(qn), k(kvn), v(kvn), out(qn);
  testing::fill_random_bf16(q.get(), qn, 1);
  testing::fill_random_bf16(k.get(), kvn, 2);
  testing::fill_random_bf16(v.get(), kvn, 3);
  const double d = A.head_dim, hq = A.q_heads;
  PrefillPoint p;

  cache.begin_prefill(row.get(), 0, context, nullptr);
  auto scratch = [&](int) { attn.run(0, row.get(), 0, context, q.get(), k.get(), v.get(), out.get(), nullptr, nullptr); };
  testing::warm_up(scratch);
  p.scratch_ms = testing::median_event_us(A.runs, scratch) / 1e3;
  p.scratch_tflops = 2.0 * double(context) * context * d * hq / (p.scratch_ms * 1e-3) / 1e12;

  const int start = context - chunk;
  fill_prefix(cache, row.get(), start);
  cache.begin_prefill(row.get(), start, chunk, nullptr);
  auto after_prefix = [&](int) {
    attn.run(0, row.get(), start, chunk, q.get(), k.get(), v.get(), out.get(), nullptr, nullptr);
  };
  testing::warm_up(after_prefix);
  p.chunk_ms = testing::median_event_us(A.runs, after_prefix) / 1e3;
  const double flops = 4.0 * chunk * double(start) * d * hq + 2.0 * double(chunk) * chunk * d * hq;
  p.chunk_tflops = flops / (p.chunk_ms * 1e-3) / 1e12;
  FP4KV_CUDA_OK(cudaDeviceSynchronize());
  return p;
}

int run_bench_prefill(const PrefillBenchArgs& A) {
  check_output_writable(A.json, "--json");
  check_output_writable(A.markdown, "--markdown");
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, 0);
  const double sm_mhz = testing::settle_sm_clock();
  std::printf("prefill attention on %s (SM clock %.0f MHz): %d query heads, %d KV heads, head_dim %d, chunk %d after a "
              "prefix\n", prop.name, sm_mhz, A.q_heads, A.kv_heads, A.head_dim, A.chunk);
  nlohmann::json j = {{"device", prop.name}, {"q_heads", A.q_heads}, {"kv_heads", A.kv_heads},
                      {"head_dim", A.head_dim}, {"chunk", A.chunk}};
  std::string md = "| preset | kernel | context | from scratch ms | TFLOP/s | last chunk after the prefix ms | TFLOP/s |\n"
                   "|---|---|---|---|---|---|---|\n";
  for (const std::string& preset : split_csv(A.presets)) {
    const Recipe recipe = parse_recipe(preset);
    for (const PrefillVariant& variant : variants_of(A))
      for (int context : positive_ints(A.contexts, "--contexts")) {
        const PrefillPoint p = measure(A, recipe, context, variant);
        const std::string kernel = variant.name();
        std::printf("%-14s %-12s %7d tokens: from scratch %8.3f ms (%6.1f TFLOP/s); last %d after the prefix "
                    "%8.3f ms (%6.1f TFLOP/s)\n",
                    preset.c_str(), kernel.c_str(), context, p.scratch_ms, p.scratch_tflops, std::min(A.chunk, context),
                    p.chunk_ms, p.chunk_tflops);
        char line[256];
        std::snprintf(line, sizeof line, "| %s | %s | %d | %.3f | %.1f | %.3f | %.1f |\n", preset.c_str(),
                      kernel.c_str(), context, p.scratch_ms, p.scratch_tflops, p.chunk_ms, p.chunk_tflops);
        md += line;
        j["points"].push_back({{"preset", preset}, {"kernel", kernel}, {"cta_rows", variant.cta_rows}, {"context", context},
                               {"scratch_ms", p.scratch_ms}, {"scratch_tflops", p.scratch_tflops},
                               {"chunk_ms", p.chunk_ms}, {"chunk_tflops", p.chunk_tflops}});
        std::fflush(stdout);
      }
  }
  write_json_and_markdown(A.json, j, A.markdown, md);
  return 0;
}

}  // namespace

Action add_bench_prefill(CLI::App& bench) {
  auto* cmd = bench.add_subcommand("prefill", "chunked-prefill attention: causal BF16 and after a cached prefix, TFLOP/s");
  auto a = std::make_shared<PrefillBenchArgs>();
  cmd->add_option("--presets", a->presets, "cache presets of the prefix, comma-separated")->capture_default_str();
  cmd->add_option("--contexts", a->contexts, "prompt lengths (tokens), comma-separated")->capture_default_str();
  cmd->add_option("--q-heads", a->q_heads, "query heads")->capture_default_str()->check(CLI::Range(1, 1024));
  cmd->add_option("--kv-heads", a->kv_heads, "KV heads")->capture_default_str()->check(CLI::Range(1, 1024));
  cmd->add_option("--head-dim", a->head_dim, "head dimension (64 or 128)")->capture_default_str();
  cmd->add_option("--cta-rows", a->cta_rows, "query rows per CTA of the mma.sync kernel (64, 128), comma-separated")
      ->capture_default_str();
  cmd->add_option("--mma", a->mma, "tensor-core instruction: sync (mma.sync), warpgroup (wgmma, head_dim 128), comma-separated")
      ->capture_default_str();
  cmd->add_option("--chunk", a->chunk, "the chunk timed after a prefix (tokens)")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--prefix-window", a->prefix_window, "prefix tokens expanded per pass (multiple of 128)")
      ->capture_default_str();
  cmd->add_option("--runs", a->runs, "timed runs per point (median)")->capture_default_str()->check(CLI::Range(1, 10000));
  cmd->add_option("--json", a->json, "JSON output")->capture_default_str();
  cmd->add_option("--markdown", a->markdown, "markdown table output")->capture_default_str();
  return [a, cmd] { return cmd->parsed() ? run_bench_prefill(*a) : 1; };
}

}  // namespace fp4kv::cli
