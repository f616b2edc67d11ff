// `fp4kv bench decode`: decode-attention speed sweep on the GPU. For each point
// (shape x context x batch x preset): median of CUDA-event-timed runs over rotated cache
// copies (cold L2), the KV bytes actually read, TB/s, the fraction of the read bandwidth
// measured in the same run by a streaming-read kernel, and the speedup over our bf16 kernel
// (and over PyTorch SDPA when its JSON from bench/sdpa_baseline.py is given). This file only
// measures and writes the sweep as JSON; the markdown table and the SVG plot of speedup
// against context are rendered from that JSON by bench/report.h (as `fp4kv bench-report`
// does), so there is one renderer. Output paths are checked before any measurement.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "bench/report.h"
#include "fp4kv/attention/decode.h"
#include "fp4kv/cache/cuda_check.h"
#include "fp4kv/cache/split_plan.h"
#include "fp4kv/cache/step_plan.h"
#include "fp4kv/core/error.h"
#include "fp4kv/core/output_file.h"
#include "fp4kv/testing/bench_support.h"
#include "fp4kv/testing/cuda_testing.h"
#include "fp4kv/testing/host_step_plan.h"
#include "fp4kv/testing/sm_partition.h"
#include "tools/commands.h"
#include "tools/csv_args.h"

namespace fp4kv::cli {

namespace {

using cache::cuda_check;
using testing::DeviceBuffer;
using testing::median_event_us;

struct Shape {
  std::string name;
  int q_heads, kv_heads, d;
};

Shape shape_of(const std::string& n) {
  if (n == "qwen3-4b") return {n, 32, 8, 128};
  if (n == "qwen3-30b-a3b") return {n, 32, 4, 128};
  if (n.find("mla") != std::string::npos)
    throw Error("bench: '" + n + "' is an MLA shape: MLA decode takes latent queries and has its own sweep, " +
                "`fp4kv bench mla --heads 16,128` (DeepSeek-V2/V3: d_c 512, d_r 64)");
  throw Error("bench: unknown shape '" + n + "' (qwen3-4b, qwen3-30b-a3b; MLA: fp4kv bench mla)");
}

struct BenchArgs {
  std::string contexts = "4096,16384,32768,65536,131072,262144";
  std::string batches = "1,8,16,32,64";
  std::string shapes = "qwen3-4b,qwen3-30b-a3b";
  std::string presets = "bf16,fp8,nvfp4-vanilla,nvfp4,nvfp4-native,mxfp4,mxfp4-native";
  int runs = 30;
  double rotate_gb = 1.0;
  int max_splits = 128;
  int pages_per_split = 0;  // 0: the planner's choice (cache::step_split_policy)
  int sms = 0;              // > 0: run on a partition of this many SMs (testing::confine_to_sms)
  std::string json = "bench_decode.json", markdown = "bench_decode.md", svg = "bench_decode.svg", sdpa;
};

struct Point {
  std::string shape, preset;
  int context = 0, batch = 0, splits = 0, copies = 0;
  double us = 0, bytes = 0, tbs = 0, frac = 0, x_bf16 = 0, sdpa_us = 0, x_sdpa = 0;
  bool skipped = false;
  std::string note;
};

// read_gbps: the card's read bandwidth (the whole card's, also under --sms: an SM's share of
// it is what decides whether the page loop is issue-bound).
Point run_point(const Shape& s, const std::string& preset, int ctx, int batch, const BenchArgs& A, int sms,
                double sm_mhz, double read_gbps) {
  Point pt;
  pt.shape = s.name;
  pt.preset = preset;
  pt.context = ctx;
  pt.batch = batch;
  const Recipe r = parse_recipe(preset);
  const int d = s.d, H = s.kv_heads, QH = s.q_heads;
  const cache::PageLayout L = cache::PageLayout::make(r.kv, d);
  const long long stride = (long long)L.bytes * H;
  const int pages = std::max(1, cache::attended_pages(ctx, r));
  const bool slots_used = attention::uses_slot_buffer(r);
  const DecodeLayout lay = decode_layout(ctx, true, r.kv != KvFormat::bf16 && r.bf16_sink, r.kv != KvFormat::bf16 && r.bf16_recent);
  const int bf16_tokens = r.kv == KvFormat::bf16 ? 0 : lay.bf16_tokens();
  const double slot_bytes_read = double(bf16_tokens) * d * 2 * 2 * H;  // per row
  const double copy_bytes = double(batch) * pages * stride;
  pt.bytes = double(batch) * (double(pages) * stride + slot_bytes_read);
  const size_t slot_row_elems = size_t(H) * 2 * cache::kSlotRows * d;  // one slot
  size_t free_b = 0, total_b = 0;
  cuda_check(cudaMemGetInfo(&free_b, &total_b), "bench: cudaMemGetInfo");
  const double margin = 2.0e9 + double(batch) * QH * (A.max_splits + 2) * (d + 1) * 4.0;
  int copies = int(std::max(1.0, std::ceil(A.rotate_gb * 1e9 / (copy_bytes + batch * slot_row_elems * 2.0))));
  while (copies > 1 && copies * (copy_bytes + batch * slot_row_elems * 2.0) > double(free_b) - margin) --copies;
  if (copy_bytes + batch * slot_row_elems * 2.0 > double(free_b) - margin) {
    pt.skipped = true;
    char buf[160];
    std::snprintf(buf, sizeof buf, "skipped: needs %.1f GB, %.1f GB free", (copy_bytes + batch * slot_row_elems * 2.0) / 1e9,
                  double(free_b) / 1e9);
    pt.note = buf;
    return pt;
  }
  pt.copies = copies;
  const long long nblocks = (long long)batch * pages * copies;
  DeviceBuffer<uint8_t> pool(size_t(nblocks) * stride);
  testing::fill_random_pages(pool.get(), nblocks, stride, L, 0x1234u + ctx + batch);
  const int nslots = slots_used ? batch * copies : 1;
  DeviceBuffer<uint16_t> slots(size_t(nslots) * slot_row_elems);
  if (slots_used) testing::fill_random_bf16(slots.get(), size_t(nslots) * slot_row_elems, 77);
  std::vector<int32_t> tables(size_t(copies) * batch * pages);
  for (size_t i = 0; i < tables.size(); ++i) tables[i] = int32_t(i);
  const DeviceBuffer<int32_t> dtab(tables), dlen(std::vector<int32_t>(batch, ctx));
  const std::vector<int> lens(batch, ctx);
  DeviceBuffer<float> q(size_t(batch) * QH * d), out(size_t(batch) * QH * d), lse(size_t(batch) * QH), mu(size_t(H) * d);
  testing::fill_random_float(q.get(), size_t(batch) * QH * d, 2.0f, 5);
  testing::fill_random_float(mu.get(), size_t(H) * d, 0.5f, 6);
  attention::DecodeLayerView layer;
  layer.format = r.kv;
  layer.pool = pool.get();
  layer.block_stride = stride;
  layer.slot_buffer = slots.get();
  layer.slots = nslots;
  layer.mu_k = mu.get();
  const attention::DecodeGeometry geometry{QH, H, d};
  // The split plan needs the picked kernel's occupancy: a probe object at full capacity.
  const int resident =
      attention::DecodeAttention(geometry, r, attention::DecodeCapacity{batch, pages, 1}).resident_ctas(sms);
  const int balance = cache::issue_bound_sms(r, sms, read_gbps);  // as the control kernel decides on this card
  // The grid is sized by the plan's capacity (max_splits + 1 CTAs per row and head): use the
  // splits this point needs as the capacity, so no empty CTAs are launched.
  int cap = 1;
  {
    testing::HostStepPlan probe(batch, A.max_splits);
    probe.fill(lens, r, H, A.pages_per_split, {}, resident, balance);
    for (int x : probe.splits()) cap = std::max(cap, x);
  }
  // One plan per copy: copy c uses slots [c * batch, (c + 1) * batch).
  std::vector<std::unique_ptr<testing::HostStepPlan>> plans;
  const int nplans = slots_used ? copies : 1;
  for (int c = 0; c < nplans; ++c) {
    std::vector<int> sl(batch);
    for (int b = 0; b < batch; ++b) sl[b] = slots_used ? c * batch + b : b;
    plans.push_back(std::make_unique<testing::HostStepPlan>(batch, cap));
    plans.back()->fill(lens, r, H, A.pages_per_split, sl, resident, balance);
  }
  pt.splits = plans[0]->splits()[0];
  attention::DecodeAttention attn(geometry, r, attention::DecodeCapacity{batch, pages, cap});
  auto run = [&](int i) {
    const int c = i % copies;
    attention::DecodeStep step;
    step.block_tables = dtab.get() + size_t(c) * batch * pages;
    step.seq_lens = dlen.get();
    step.batch = batch;
    step.plan = plans[slots_used ? c : 0]->plan();
    attn.run(step, layer, q.get(), out.get(), lse.get());
  };
  testing::hold_sm_clock(sm_mhz);  // the pool's allocation and fill may have let the card idle
  const int first_timed = testing::warm_up(run);
  pt.us = median_event_us(A.runs, [&](int i) { run(first_timed + i); });
  pt.tbs = pt.bytes / (pt.us * 1e-6) / 1e12;
  return pt;
}

int run_bench(const BenchArgs& A) {
  // Arguments first (clear errors on any machine), then the GPU.
  std::vector<Shape> shapes;
  for (const auto& s : split_csv(A.shapes)) shapes.push_back(shape_of(s));
  require(!shapes.empty(), "bench: no shapes given");
  const std::vector<int> ctxs = positive_ints(A.contexts, "bench: contexts");
  const std::vector<int> batches = positive_ints(A.batches, "bench: batches");
  auto presets = split_csv(A.presets);
  require(!presets.empty(), "bench: no presets given");
  // bf16 first in every group, so each line printed as it is measured has its x_bf16.
  std::stable_partition(presets.begin(), presets.end(), [](const std::string& p) { return p == "bf16"; });
  for (const auto& pr : presets) (void)parse_recipe(pr);  // fail early on a bad name
  check_output_writable(A.json, "--json");
  check_output_writable(A.markdown, "--markdown");
  check_output_writable(A.svg, "--svg");
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    (void)cudaGetLastError();
    throw Error("bench decode needs a CUDA GPU (sm_90: H100/H200); none is visible here");
  }
  int dev = 0;
  cuda_check(cudaGetDevice(&dev), "bench: cudaGetDevice");
  cudaDeviceProp prop;
  cuda_check(cudaGetDeviceProperties(&prop, dev), "bench: cudaGetDeviceProperties");
  // The card's read bandwidth is what every point is held to, measured on all SMs; on a
  // partition (--sms) its own probe, which one SM's few loads in flight keep below the card's
  // (3.02 against 3.19 TB/s on 96 of an H100's 132), is recorded beside it.
  double read_tbs = 0, copy_tbs = 0, sm_mhz = 0;
  testing::measure_bandwidth(read_tbs, copy_tbs, &sm_mhz);
  const int sms = A.sms > 0 ? testing::confine_to_sms(A.sms) : prop.multiProcessorCount;
  const double partition_read_tbs = A.sms > 0 ? testing::measure_read_bandwidth() : 0.0;
  std::printf("device %s, %d SMs, L2 %d MB, SM clock %.0f MHz: streaming read %.2f TB/s, device copy %.2f TB/s "
              "(read + write)\n", prop.name, prop.multiProcessorCount, prop.l2CacheSize >> 20, sm_mhz, read_tbs,
              copy_tbs);
  if (A.sms > 0)
    std::printf("running on %d of its SMs (a green context): streaming read from them %.2f TB/s\n", sms,
                partition_read_tbs);
  std::map<std::string, double> sdpa;  // "shape/ctx/batch" -> us
  if (!A.sdpa.empty()) {
    std::ifstream in(A.sdpa);
    require(bool(in), "bench: cannot read '" + A.sdpa + "'");
    const auto j = nlohmann::json::parse(in);
    for (const auto& e : j.at("points"))
      if (e.contains("us") && !e.at("us").is_null())
        sdpa[e.at("shape").get<std::string>() + "/" + std::to_string(e.at("context").get<int>()) + "/" +
             std::to_string(e.at("batch").get<int>())] = e.at("us").get<double>();
  }
  std::vector<Point> pts;
  std::printf("%-14s %7s %5s %-14s %10s %9s %7s %6s %7s %7s %6s\n", "shape", "ctx", "batch", "preset", "median_us", "KV_MB",
              "TB/s", "%read", "x_bf16", "x_sdpa", "splits");
  for (const auto& s : shapes)
    for (int c : ctxs)
      for (int b : batches) {
        double bf16_us = 0;
        for (const auto& pr : presets) {
          Point p = run_point(s, pr, c, b, A, sms, sm_mhz, read_tbs * 1e3);
          const auto it = sdpa.find(s.name + "/" + std::to_string(c) + "/" + std::to_string(b));
          if (!p.skipped) {
            p.frac = p.tbs / read_tbs;
            if (pr == "bf16") bf16_us = p.us;
            p.x_bf16 = bf16_us > 0 ? bf16_us / p.us : 0;  // 0: no bf16 time for this point
            if (it != sdpa.end()) {
              p.sdpa_us = it->second;
              p.x_sdpa = it->second / p.us;
            }
            std::printf("%-14s %7d %5d %-14s %10.1f %9.1f %7.2f %5.1f%% %7.2f %7.2f %6d\n", s.name.c_str(), c, b, pr.c_str(),
                        p.us, p.bytes / 1e6, p.tbs, 100 * p.frac, p.x_bf16, p.x_sdpa, p.splits);
          } else {
            std::printf("%-14s %7d %5d %-14s %s\n", s.name.c_str(), c, b, pr.c_str(), p.note.c_str());
          }
          std::fflush(stdout);
          pts.push_back(p);
        }
      }
  const std::time_t now = std::time(nullptr);
  char date[32];
  std::strftime(date, sizeof date, "%Y-%m-%d", std::gmtime(&now));
  nlohmann::json j;
  j["date"] = date;
  j["device"] = prop.name;
  j["sms"] = sms;
  if (A.sms > 0) {
    j["device_sms"] = prop.multiProcessorCount;
    j["partition_read_tbs"] = partition_read_tbs;
  }
  j["read_tbs"] = read_tbs;
  j["copy_tbs"] = copy_tbs;
  j["sm_mhz"] = sm_mhz;
  j["runs"] = A.runs;
  j["points"] = nlohmann::json::array();
  for (const auto& p : pts) {
    nlohmann::json e{{"shape", p.shape}, {"preset", p.preset}, {"context", p.context}, {"batch", p.batch}};
    if (p.skipped) {
      e["skipped"] = p.note;
    } else {
      e["us"] = p.us;
      e["kv_bytes"] = p.bytes;
      e["tbs"] = p.tbs;
      e["read_fraction"] = p.frac;
      e["x_bf16"] = p.x_bf16;
      e["splits"] = p.splits;
      e["copies"] = p.copies;
      if (p.sdpa_us > 0) {
        e["sdpa_us"] = p.sdpa_us;
        e["x_sdpa"] = p.x_sdpa;
      }
    }
    j["points"].push_back(e);
  }
  // Rendered from the JSON text itself, as `fp4kv bench-report` renders it.
  const std::string json_text = j.dump(1) + "\n";
  write_output_file(A.json, json_text, "--json");
  const bench::Sweep sweep = bench::parse_sweep(json_text, A.json);
  write_output_file(A.markdown, bench::sweep_markdown(sweep), "--markdown");
  write_output_file(A.svg, bench::speedup_svg(sweep), "--svg");
  std::printf("wrote %s, %s, %s\n", A.markdown.c_str(), A.json.c_str(), A.svg.c_str());
  return 0;
}

}  // namespace

Action add_bench(CLI::App& app) {
  auto* cmd = app.add_subcommand("bench", "GPU benchmarks (needs a CUDA device)");
  auto* dec = cmd->add_subcommand("decode", "decode-attention sweep: time, TB/s, read-bandwidth fraction, speedup over bf16");
  cmd->require_subcommand(1);
  auto a = std::make_shared<BenchArgs>();
  dec->add_option("--contexts", a->contexts, "context lengths (tokens), comma-separated")->capture_default_str();
  dec->add_option("--batches", a->batches, "batch sizes, comma-separated")->capture_default_str();
  dec->add_option("--shapes", a->shapes, "shapes: qwen3-4b (32/8 heads, d 128), qwen3-30b-a3b (32/4, d 128)")
      ->capture_default_str();
  dec->add_option("--presets", a->presets, "recipe presets, comma-separated")->capture_default_str();
  dec->add_option("--runs", a->runs, "timed runs per point (median)")->capture_default_str()->check(CLI::Range(1, 100000));
  dec->add_option("--rotate-gb", a->rotate_gb, "cache copies rotated so each point reads at least this many GB")
      ->capture_default_str();
  dec->add_option("--max-splits", a->max_splits, "split capacity per row")->capture_default_str()->check(CLI::Range(1, 4096));
  dec->add_option("--pages-per-split", a->pages_per_split,
                  "force the pages per split (0: the planner's choice; for tuning the split floor)")
      ->capture_default_str()
      ->check(CLI::Range(0, 1 << 20));
  dec->add_option("--sms", a->sms,
                  "run on a green context of this many SMs (rounded up by the driver; 0: all): an H100 on ~96 SMs "
                  "has the H200's read bandwidth per SM")
      ->capture_default_str()
      ->check(CLI::Range(0, 1024));
  dec->add_option("--json", a->json, "JSON output")->capture_default_str();
  dec->add_option("--markdown", a->markdown, "markdown table output")->capture_default_str();
  dec->add_option("--svg", a->svg, "SVG plot output")->capture_default_str();
  dec->add_option("--sdpa", a->sdpa, "JSON from bench/sdpa_baseline.py (adds the SDPA column)");
  const Action step = add_bench_step(*cmd);
  const Action e2e = add_bench_e2e(*cmd);
  const Action gemm = add_bench_gemm(*cmd);
  const Action prefill = add_bench_prefill(*cmd);
  const Action mla = add_bench_mla(*cmd);
  CLI::App* step_cmd = cmd->get_subcommand("step");
  CLI::App* gemm_cmd = cmd->get_subcommand("gemm");
  CLI::App* prefill_cmd = cmd->get_subcommand("prefill");
  CLI::App* mla_cmd = cmd->get_subcommand("mla");
  return [a, dec, step, e2e, gemm, prefill, mla, step_cmd, gemm_cmd, prefill_cmd, mla_cmd] {
    if (dec->parsed()) return run_bench(*a);
    if (step_cmd->parsed()) return step();
    if (gemm_cmd->parsed()) return gemm();
    if (prefill_cmd->parsed()) return prefill();
    if (mla_cmd->parsed()) return mla();
    return e2e();
  };
}

}  // namespace fp4kv::cli
