// `fp4kv bench mla`: MLA decode (attention/mla_decode.h) over the BF16 latent cache and the
// FP4 latent caches side by side: per (heads, context, batch, preset), the median time of a
// decode step of one layer (CUDA events, cache copies rotated past L2), the latent bytes it
// must read once per row (BF16: tokens x (512 + 64) x 2; FP4: its pages' codes, scales, r rows
// and page scale, plus the BF16 sink and recent rows: the head tiles' re-reads are the
// kernel's cost, not the data's), that rate as a fraction of the read bandwidth measured in
// the same run, and the speedup over the BF16 cache's time from the same run. Splits: enough
// CTAs for two per SM when the rows and head tiles alone are fewer. FP4 pools hold one page
// quantized from random latents, replicated (speed only).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "fp4kv/attention/mla_decode.h"
#include "fp4kv/cache/cuda_check.h"
#include "fp4kv/cache/host_page.h"
#include "fp4kv/core/decode_layout.h"
#include "fp4kv/ref/quant_page.h"
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
  std::string presets = "bf16,nvfp4,mxfp4";
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

// Fills `blocks` latent pages with one page quantized from random latents (block 0, then
// doubling copies).
void fill_fp4_pages(uint8_t* pool, const cache::LatentPageLayout& L, const Recipe& r, long long blocks) {
  std::mt19937 rng(12345);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> c(size_t(cache::kPage) * L.latent_dim), zeros(c.size(), 0.0f), rope(size_t(cache::kPage) * L.rope_dim);
  for (float& v : c) v = normal(rng);
  for (float& v : rope) v = normal(rng);
  const ref::QuantPage page = ref::quantize_page(c.data(), zeros.data(), cache::kPage, L.latent_dim, r);
  std::vector<uint8_t> bytes(L.bytes);
  cache::pack_latent_page(page, rope.data(), cache::kPage, L, bytes.data());
  cache::cuda_check(cudaMemcpy(pool, bytes.data(), bytes.size(), cudaMemcpyHostToDevice), "bench mla: page upload");
  for (long long have = 1; have < blocks; have *= 2) {
    const long long n = std::min(have, blocks - have);
    cache::cuda_check(cudaMemcpy(pool + size_t(have) * L.bytes, pool, size_t(n) * L.bytes, cudaMemcpyDeviceToDevice),
                      "bench mla: page replication");
  }
}

// Latent bytes one row of `context` tokens reads once: BF16 rows [c | r]; FP4 pages' codes,
// block scales, r rows and the one 16-byte copy of the page scales.
double row_bytes(const cache::LatentPageLayout& L, const Recipe& r, int context) {
  constexpr double kPageScaleCopyBytes = 16.0;
  const double bf16_row = (L.latent_dim + L.rope_dim) * 2.0;
  if (r.kv == KvFormat::bf16) return context * bf16_row;
  const DecodeLayout l = decode_layout(context, true, r.bf16_sink, r.bf16_recent);
  const double page =
      cache::kPage * (L.latent_dim / 2.0 + L.latent_dim / L.block + L.rope_dim * 2.0) + kPageScaleCopyBytes;
  return l.quant_pages * page + l.bf16_tokens() * bf16_row;
}

MlaPoint measure(const MlaBenchArgs& A, const Recipe& recipe, int heads, int context, int batch, int sms) {
  MlaPoint pt;
  const attention::MlaGeometry geometry{heads};
  const cache::LatentPageLayout L = cache::LatentPageLayout::make(recipe.kv, geometry.latent_dim, geometry.rope_dim);
  const int pages = (context + cache::kPage - 1) / cache::kPage;
  const double copy_bytes = double(batch) * pages * L.bytes;
  pt.bytes = batch * row_bytes(L, recipe, context);
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
  if (recipe.kv == KvFormat::bf16) {
    testing::fill_random_bf16(reinterpret_cast<uint16_t*>(pool.get()), pool.bytes() / 2, 0x5eed + context + batch);
  } else {
    fill_fp4_pages(pool.get(), L, recipe, blocks);
  }
  std::vector<int32_t> tables(static_cast<size_t>(blocks)), slots(batch);
  for (size_t i = 0; i < tables.size(); ++i) tables[i] = int32_t(i);
  for (int b = 0; b < batch; ++b) slots[b] = b;
  const DeviceBuffer<int32_t> dtab(tables), dlen(std::vector<int32_t>(batch, context)), dslot(slots);
  DeviceBuffer<uint16_t> slot_rows(size_t(batch) * cache::kSlotRows * (geometry.latent_dim + geometry.rope_dim));
  testing::fill_random_bf16(slot_rows.get(), slot_rows.size(), 3);
  DeviceBuffer<float> mu(geometry.latent_dim);
  cache::cuda_check(cudaMemset(mu.get(), 0, mu.bytes()), "bench mla: mu_c");
  DeviceBuffer<uint16_t> qc(size_t(batch) * heads * geometry.latent_dim), qr(size_t(batch) * heads * geometry.rope_dim);
  testing::fill_random_bf16(qc.get(), qc.size(), 1);
  testing::fill_random_bf16(qr.get(), qr.size(), 2);
  DeviceBuffer<__nv_bfloat16> out(size_t(batch) * heads * geometry.latent_dim);
  DeviceBuffer<float> lse(size_t(batch) * heads);
  attention::MlaDecodeAttention attn(geometry, recipe, attention::MlaCapacity{batch, pages, pt.splits});
  attention::MlaStep step;
  step.pool = pool.get();
  step.block_stride = L.bytes;
  step.seq_lens = dlen.get();
  step.batch = batch;
  step.splits = pt.splits;
  step.slot_rows = slot_rows.get();
  step.row_slot = dslot.get();
  step.mu_c = mu.get();
  const auto* q_c = reinterpret_cast<const __nv_bfloat16*>(qc.get());
  const auto* q_r = reinterpret_cast<const __nv_bfloat16*>(qr.get());
  auto run = [&](int i) {
    step.block_tables = dtab.get() + size_t(i % pt.copies) * batch * pages;
    attn.run(step, q_c, q_r, out.get(), lse.get());
  };
  const int first_timed = testing::warm_up(run);
  pt.us = testing::median_event_us(A.runs, [&](int i) { run(first_timed + i); });
  pt.tbs = pt.bytes / (pt.us * 1e-6) / 1e12;
  return pt;
}

int run_bench_mla(const MlaBenchArgs& A) {
  const std::vector<int> heads = positive_ints(A.heads, "--heads");
  const std::vector<Recipe> presets = parse_recipe_list(A.presets);
  for (const Recipe& r : presets)
    for (int h : heads) attention::MlaDecodeAttention::check_supported(attention::MlaGeometry{h}, r, {1, 1, 1});
  const std::vector<int> contexts = positive_ints(A.contexts, "--contexts");
  const std::vector<int> batches = positive_ints(A.batches, "--batches");
  check_output_writable(A.json, "--json");
  check_output_writable(A.markdown, "--markdown");
  cudaDeviceProp prop{};
  cache::cuda_check(cudaGetDeviceProperties(&prop, 0), "bench mla: no CUDA device");
  double read_tbs = 0, copy_tbs = 0;
  testing::measure_bandwidth(read_tbs, copy_tbs);
  std::printf("MLA decode (d_c 512, d_r 64) on %s: streaming read %.2f TB/s\n", prop.name, read_tbs);
  nlohmann::json j = {{"device", prop.name}, {"read_tbs", read_tbs}};
  std::string md =
      "| heads | context | batch | preset | splits | us | latent MB | TB/s | of read BW | x bf16 |\n"
      "|---|---|---|---|---|---|---|---|---|---|\n";
  for (int h : heads)
    for (int ctx : contexts)
      for (int b : batches) {
        double bf16_us = 0;
        for (const Recipe& r : presets) {
          const MlaPoint p = measure(A, r, h, ctx, b, prop.multiProcessorCount);
          if (p.skipped) {
            std::printf("heads %3d context %7d batch %3d %-8s: skipped (the cache does not fit)\n", h, ctx, b, r.name.c_str());
            continue;
          }
          if (r.kv == KvFormat::bf16) bf16_us = p.us;
          const double frac = p.tbs / read_tbs, speedup = bf16_us > 0 ? bf16_us / p.us : 0.0;
          std::printf("heads %3d context %7d batch %3d %-8s splits %4d: %9.1f us, %8.1f MB, %5.2f TB/s (%4.1f %% of read)"
                      ", %.2fx bf16\n", h, ctx, b, r.name.c_str(), p.splits, p.us, p.bytes / 1e6, p.tbs, 100 * frac, speedup);
          char line[224];
          std::snprintf(line, sizeof line, "| %d | %d | %d | %s | %d | %.1f | %.1f | %.2f | %.1f %% | %.2f |\n", h, ctx, b,
                        r.name.c_str(), p.splits, p.us, p.bytes / 1e6, p.tbs, 100 * frac, speedup);
          md += line;
          j["points"].push_back({{"heads", h}, {"context", ctx}, {"batch", b}, {"preset", r.name}, {"splits", p.splits},
                                 {"us", p.us}, {"bytes", p.bytes}, {"tbs", p.tbs}, {"frac_read", frac},
                                 {"speedup_vs_bf16", speedup}});
          std::fflush(stdout);
        }
      }
  write_json_and_markdown(A.json, j, A.markdown, md);
  return 0;
}

}  // namespace

Action add_bench_mla(CLI::App& bench) {
  auto* cmd = bench.add_subcommand("mla", "MLA decode over BF16 and FP4 latent caches: time, bytes, fraction of read "
                                          "bandwidth, speedup over BF16");
  auto a = std::make_shared<MlaBenchArgs>();
  cmd->add_option("--heads", a->heads, "query heads per latent (multiples of 16), comma-separated")->capture_default_str();
  cmd->add_option("--contexts", a->contexts, "tokens per row, comma-separated")->capture_default_str();
  cmd->add_option("--batches", a->batches, "rows, comma-separated")->capture_default_str();
  cmd->add_option("--presets", a->presets, "latent cache recipes (bf16 and the mixed-mode FP4 ones), comma-separated")
      ->capture_default_str();
  cmd->add_option("--runs", a->runs, "timed runs per point (median)")->capture_default_str()->check(CLI::Range(1, 10000));
  cmd->add_option("--rotate-gb", a->rotate_gb, "cache copies rotated so each point reads at least this many GB")
      ->capture_default_str();
  cmd->add_option("--json", a->json, "JSON output")->capture_default_str();
  cmd->add_option("--markdown", a->markdown, "markdown table output")->capture_default_str();
  return [a, cmd] { return cmd->parsed() ? run_bench_mla(*a) : 1; };
}

}  // namespace fp4kv::cli
