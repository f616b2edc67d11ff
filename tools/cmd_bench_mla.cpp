// `fp4kv bench mla`: MLA decode over the BF16 latent cache (attention/mla_decode.h), the
// baseline of the FP4 latent kernels: per (heads, context, batch), the median time of a
// decode step of one layer (CUDA events, cache copies rotated past L2), the latent bytes it
// must read (tokens x (512 + 64) x 2 per row, once: the head tiles' re-reads are the
// kernel's cost, not the data's) and that rate as a fraction of the read bandwidth measured
// in the same run. Splits: enough CTAs for two per SM when the rows and head tiles alone are
// fewer.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "fp4kv/attention/mla_decode.h"
#include "fp4kv/cache/cuda_check.h"
#include "fp4kv/testing/bench_support.h"
#include "fp4kv/testing/cuda_testing.h"
#include "tools/bench_output.h"
#include "tools/commands.h"
#include "tools/csv_args.h"

namespace fp4kv::cli {

namespace {

using testing::DeviceBuffer;

struct MlaBenchArgs {
  std::string heads = "16,128", contexts = "4096,32768,131072", batches = "1,8,64";
  int runs = 20;
  double rotate_gb = 1.0;
  std::string json = "bench_mla.json", markdown = "bench_mla.md";
};

struct MlaPoint {
  int splits = 0, copies = 0;
  double us = 0, bytes = 0, tbs = 0;
  bool skipped = false;
};

constexpr int kTargetCtasPerSm = 2;  // two waves of the one-CTA-per-SM kernel: a short tail

MlaPoint measure(const MlaBenchArgs& A, int heads, int context, int batch, int sms) {
  MlaPoint pt;
  const attention::MlaGeometry geometry{heads};
  const cache::LatentPageLayout L = cache::LatentPageLayout::make(KvFormat::bf16, geometry.latent_dim, geometry.rope_dim);
  const int pages = (context + cache::kPage - 1) / cache::kPage;
  const double copy_bytes = double(batch) * pages * L.bytes;
  pt.bytes = double(batch) * context * (geometry.latent_dim + geometry.rope_dim) * 2.0;
  size_t free_b = 0, total_b = 0;
  cache::cuda_check(cudaMemGetInfo(&free_b, &total_b), "bench mla: cudaMemGetInfo");
  const double budget = double(free_b) - 2.0e9;
  if (copy_bytes > budget) {
    pt.skipped = true;
    return pt;
  }
  pt.copies = int(std::clamp(std::ceil(A.rotate_gb * 1e9 / copy_bytes), 1.0, std::floor(budget / copy_bytes)));
  const int tiles = (context + attention::kMlaTileTokens - 1) / attention::kMlaTileTokens;
  const int head_tiles = heads / attention::kMlaHeadsPerCta;
  pt.splits = std::clamp((kTargetCtasPerSm * sms + batch * head_tiles - 1) / (batch * head_tiles), 1, tiles);
  const long long blocks = (long long)batch * pages * pt.copies;
  DeviceBuffer<uint8_t> pool(size_t(blocks) * L.bytes);
  testing::fill_random_bf16(reinterpret_cast<uint16_t*>(pool.get()), pool.bytes() / 2, 0x5eed + context + batch);
  std::vector<int32_t> tables(static_cast<size_t>(blocks));
  for (size_t i = 0; i < tables.size(); ++i) tables[i] = int32_t(i);
  const DeviceBuffer<int32_t> dtab(tables), dlen(std::vector<int32_t>(batch, context));
  DeviceBuffer<uint16_t> qc(size_t(batch) * heads * geometry.latent_dim), qr(size_t(batch) * heads * geometry.rope_dim);
  testing::fill_random_bf16(qc.get(), qc.size(), 1);
  testing::fill_random_bf16(qr.get(), qr.size(), 2);
  DeviceBuffer<__nv_bfloat16> out(size_t(batch) * heads * geometry.latent_dim);
  DeviceBuffer<float> lse(size_t(batch) * heads);
  attention::MlaDecodeAttention attn(geometry, KvFormat::bf16, attention::MlaCapacity{batch, pages, pt.splits});
  auto run = [&](int i) {
    attention::MlaStep step;
    step.pool = pool.get();
    step.block_stride = L.bytes;
    step.block_tables = dtab.get() + size_t(i % pt.copies) * batch * pages;
    step.seq_lens = dlen.get();
    step.batch = batch;
    step.splits = pt.splits;
    attn.run(step, reinterpret_cast<const __nv_bfloat16*>(qc.get()), reinterpret_cast<const __nv_bfloat16*>(qr.get()),
             out.get(), lse.get());
  };
  for (int i = 0; i < 3; ++i) run(i);
  cache::cuda_check(cudaDeviceSynchronize(), "bench mla: warm-up");
  pt.us = testing::median_event_us(A.runs, [&](int i) { run(i + 1); });
  pt.tbs = pt.bytes / (pt.us * 1e-6) / 1e12;
  return pt;
}

int run_bench_mla(const MlaBenchArgs& A) {
  const std::vector<int> heads = positive_ints(A.heads, "--heads");
  for (int h : heads) attention::MlaDecodeAttention::check_supported(attention::MlaGeometry{h}, KvFormat::bf16, {1, 1, 1});
  const std::vector<int> contexts = positive_ints(A.contexts, "--contexts");
  const std::vector<int> batches = positive_ints(A.batches, "--batches");
  check_output_writable(A.json, "--json");
  check_output_writable(A.markdown, "--markdown");
  cudaDeviceProp prop{};
  cache::cuda_check(cudaGetDeviceProperties(&prop, 0), "bench mla: no CUDA device");
  double read_tbs = 0, copy_tbs = 0;
  testing::measure_bandwidth(read_tbs, copy_tbs);
  std::printf("MLA decode, BF16 latent cache (d_c 512, d_r 64) on %s: streaming read %.2f TB/s\n", prop.name, read_tbs);
  nlohmann::json j = {{"device", prop.name}, {"read_tbs", read_tbs}, {"format", "bf16"}};
  std::string md = "| heads | context | batch | splits | us | latent MB | TB/s | of read BW |\n|---|---|---|---|---|---|---|---|\n";
  for (int h : heads)
    for (int ctx : contexts)
      for (int b : batches) {
        const MlaPoint p = measure(A, h, ctx, b, prop.multiProcessorCount);
        if (p.skipped) {
          std::printf("heads %3d context %7d batch %3d: skipped (the cache does not fit)\n", h, ctx, b);
          continue;
        }
        const double frac = p.tbs / read_tbs;
        std::printf("heads %3d context %7d batch %3d splits %4d: %9.1f us, %8.1f MB, %5.2f TB/s (%4.1f %% of read)\n", h,
                    ctx, b, p.splits, p.us, p.bytes / 1e6, p.tbs, 100 * frac);
        char line[192];
        std::snprintf(line, sizeof line, "| %d | %d | %d | %d | %.1f | %.1f | %.2f | %.1f %% |\n", h, ctx, b, p.splits,
                      p.us, p.bytes / 1e6, p.tbs, 100 * frac);
        md += line;
        j["points"].push_back({{"heads", h}, {"context", ctx}, {"batch", b}, {"splits", p.splits}, {"us", p.us},
                               {"bytes", p.bytes}, {"tbs", p.tbs}, {"frac_read", frac}});
        std::fflush(stdout);
      }
  write_json_and_markdown(A.json, j, A.markdown, md);
  return 0;
}

}  // namespace

Action add_bench_mla(CLI::App& bench) {
  auto* cmd = bench.add_subcommand("mla", "MLA decode over the BF16 latent cache: time, bytes, fraction of read bandwidth");
  auto a = std::make_shared<MlaBenchArgs>();
  cmd->add_option("--heads", a->heads, "query heads per latent (multiples of 16), comma-separated")->capture_default_str();
  cmd->add_option("--contexts", a->contexts, "tokens per row, comma-separated")->capture_default_str();
  cmd->add_option("--batches", a->batches, "rows, comma-separated")->capture_default_str();
  cmd->add_option("--runs", a->runs, "timed runs per point (median)")->capture_default_str()->check(CLI::Range(1, 10000));
  cmd->add_option("--rotate-gb", a->rotate_gb, "cache copies rotated so each point reads at least this many GB")
      ->capture_default_str();
  cmd->add_option("--json", a->json, "JSON output")->capture_default_str();
  cmd->add_option("--markdown", a->markdown, "markdown table output")->capture_default_str();
  return [a, cmd] { return cmd->parsed() ? run_bench_mla(*a) : 1; };
}

}  // namespace fp4kv::cli
