// A full decode step on the GPU cache (fp4kv/cache/kv_cache.h): control kernel, append,
// decode attention and combine for every layer, promotion. (1) Captured in a CUDA graph
// and replayed, it equals eager execution bit for bit (outputs, LSE, promoted pages).
// (2) Its attention equals the CPU reference on the cache's own contents read back (pages,
// slot rows, split plan).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <memory>
#include <random>

#include "fp4kv/attention/kv_cache_adapter.h"
#include "fp4kv/ref/attention.h"
#include "harness.h"

namespace fp4kv::test {
namespace {

std::vector<float> randv(size_t n, unsigned seed, float scale) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, scale);
  std::vector<float> x(n);
  for (auto& v : x) v = nd(rng);
  return x;
}

struct StepRig {
  static constexpr int kLayers = 2, kHeads = 2, kD = 128, kG = 4, kMaxPages = 8, kBatch = 3;
  Recipe recipe;
  cache::KvCacheConfig cfg;
  std::vector<float> mu;
  std::unique_ptr<cache::KvCache> cache;
  std::vector<int> prefix = {300, 127, 40};  // the step appends token prefix[r]: 301, 128 (promotes), 41
  std::vector<std::vector<std::vector<float>>> k, v;  // [row][layer] -> [n][heads][d]
  std::vector<int32_t> table;
  std::unique_ptr<DeviceBuffer<int32_t>> bt, lens;
  std::vector<std::unique_ptr<DeviceBuffer<float>>> knew, vnew, q, out, lse;
  std::unique_ptr<attention::DecodeAttention> attn;

  explicit StepRig(const std::string& spec) {
    recipe = parse_recipe(spec);
    cfg.layers = kLayers;
    cfg.kv_heads = kHeads;
    cfg.head_dim = kD;
    cfg.num_blocks = kBatch * kMaxPages + 2;
    cfg.max_slots = 4;
    cfg.max_batch = kBatch;
    cfg.max_pages = kMaxPages;
    cfg.max_splits = 8;
    mu = randv(size_t(kLayers) * kHeads * kD, 77, 0.5f);
    cache = std::make_unique<cache::KvCache>(cfg, recipe, mu.data());
    table.assign(size_t(kBatch) * kMaxPages, 0);
    for (int r = 0; r < kBatch; ++r)
      for (int p = 0; p < kMaxPages; ++p) table[size_t(r) * kMaxPages + p] = (kBatch - 1 - r) * kMaxPages + p + 1;
    bt = std::make_unique<DeviceBuffer<int32_t>>(table);
    std::vector<int32_t> l;
    for (int r = 0; r < kBatch; ++r) l.push_back(prefix[r] + 1);
    lens = std::make_unique<DeviceBuffer<int32_t>>(l);
    const size_t tok = size_t(kHeads) * kD;
    k.resize(kBatch);
    v.resize(kBatch);
    for (int r = 0; r < kBatch; ++r)
      for (int L = 0; L < kLayers; ++L) {
        k[r].push_back(randv((prefix[r] + 1) * tok, 1000u * r + 10u * L + 1u, 2.0f));
        v[r].push_back(randv((prefix[r] + 1) * tok, 1000u * r + 10u * L + 2u, 1.0f));
      }
    // Prefill every row.
    for (int r = 0; r < kBatch; ++r) {
      DeviceBuffer<int32_t> row(std::vector<int32_t>(table.begin() + size_t(r) * kMaxPages,
                                                     table.begin() + size_t(r + 1) * kMaxPages));
      for (int L = 0; L < kLayers; ++L) {
        DeviceBuffer<float> dk(std::vector<float>(k[r][L].begin(), k[r][L].begin() + prefix[r] * tok));
        DeviceBuffer<float> dv(std::vector<float>(v[r][L].begin(), v[r][L].begin() + prefix[r] * tok));
        cache->prefill(L, row.get(), 0, prefix[r], dk.get(), dv.get(), nullptr);
        FP4KV_CUDA_OK(cudaDeviceSynchronize());
      }
    }
    // The step's inputs.
    for (int L = 0; L < kLayers; ++L) {
      std::vector<float> hk, hv;
      for (int r = 0; r < kBatch; ++r) {
        hk.insert(hk.end(), k[r][L].begin() + prefix[r] * tok, k[r][L].begin() + (prefix[r] + 1) * tok);
        hv.insert(hv.end(), v[r][L].begin() + prefix[r] * tok, v[r][L].begin() + (prefix[r] + 1) * tok);
      }
      knew.push_back(std::make_unique<DeviceBuffer<float>>(hk));
      vnew.push_back(std::make_unique<DeviceBuffer<float>>(hv));
      q.push_back(std::make_unique<DeviceBuffer<float>>(randv(size_t(kBatch) * kHeads * kG * kD, 500u + L, 0.3f)));
      out.push_back(std::make_unique<DeviceBuffer<float>>(size_t(kBatch) * kHeads * kG * kD));
      lse.push_back(std::make_unique<DeviceBuffer<float>>(size_t(kBatch) * kHeads * kG));
    }
    // Built once (validated, configured, workspace allocated); run once per layer per step.
    attn = std::make_unique<attention::DecodeAttention>(attention::geometry_of(*cache, kHeads * kG), recipe,
                                                        attention::capacity_of(*cache));
  }

  void enqueue(cudaStream_t s) {
    cache->begin_step(bt->get(), lens->get(), kBatch, kMaxPages, s);
    const attention::DecodeStep step = attention::step_of(*cache, bt->get(), lens->get(), kBatch);
    for (int L = 0; L < kLayers; ++L) {
      cache->append(L, knew[L]->get(), vnew[L]->get(), s);
      attn->run(step, attention::layer_view(*cache, L), q[L]->get(), out[L]->get(), lse[L]->get(), s);
    }
    cache->end_step(s);
  }
};

class DecodeStep : public ::testing::TestWithParam<const char*> {};

TEST_P(DecodeStep, GraphReplayEqualsEagerAndTheReference) {
  SKIP_WITHOUT_GPU();
  StepRig eager(GetParam()), graph(GetParam());
  cudaStream_t s;
  FP4KV_CUDA_OK(cudaStreamCreate(&s));
  eager.enqueue(s);
  FP4KV_CUDA_OK(cudaStreamSynchronize(s));
  cudaGraph_t g;
  cudaGraphExec_t ge;
  FP4KV_CUDA_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  graph.enqueue(s);
  FP4KV_CUDA_OK(cudaStreamEndCapture(s, &g));
  FP4KV_CUDA_OK(cudaGraphInstantiate(&ge, g, 0));
  FP4KV_CUDA_OK(cudaGraphLaunch(ge, s));
  FP4KV_CUDA_OK(cudaStreamSynchronize(s));
  ASSERT_EQ(eager.cache->error_flags(), 0);
  ASSERT_EQ(graph.cache->error_flags(), 0);
  for (int L = 0; L < StepRig::kLayers; ++L) {
    EXPECT_EQ(graph.out[L]->download(), eager.out[L]->download()) << "layer " << L;
    EXPECT_EQ(graph.lse[L]->download(), eager.lse[L]->download()) << "layer " << L;
  }
  // The promoted page (row 1 reached 128 tokens) is the same in both caches.
  const int promoted = eager.table[size_t(1) * StepRig::kMaxPages];
  for (int h = 0; h < StepRig::kHeads; ++h)
    EXPECT_EQ(graph.cache->read_page(0, promoted, h), eager.cache->read_page(0, promoted, h));

  // The step's attention against the CPU reference on the cache's own contents.
  const auto plan = eager.cache->read_plan();
  const Recipe& r = eager.recipe;
  const int d = StepRig::kD, G = StepRig::kG, H = StepRig::kHeads, QH = H * G;
  double max_rel = 0, max_lse = 0;
  for (int L = 0; L < StepRig::kLayers; ++L) {
    const auto out = eager.out[L]->download(), lse = eager.lse[L]->download(), q = eager.q[L]->download();
    for (int row = 0; row < StepRig::kBatch; ++row) {
      const int n = eager.prefix[row] + 1;
      const DecodeLayout lay = decode_layout(n, true, r.bf16_sink, r.bf16_recent);
      std::vector<int> bounds{0};
      for (int sp = 0; sp < plan.row_splits[row]; ++sp)
        bounds.push_back(std::min((sp + 1) * plan.row_pages_per_split[row], lay.quant_pages));
      if (bounds.size() == 1) bounds.push_back(0);
      for (int h = 0; h < H; ++h) {
        std::vector<ref::QuantPage> pages;
        for (int p = 0; p < lay.quant_pages; ++p)
          pages.push_back(eager.cache->read_quant_page(L, eager.table[size_t(row) * StepRig::kMaxPages + p], h,
                                                       p == lay.quant_pages - 1 ? lay.last_page_tokens : kPageTokens));
        const cache::SlotRows rows = eager.cache->read_slot(L, plan.row_slot[row], h);
        std::vector<float> bk, bv;
        for (int i = 0; i < lay.bf16_tokens(); ++i) {
          const int slot_row = i < lay.sink_tokens ? i : kSinkTokens + (lay.recent_begin + i - lay.sink_tokens) % kPageTokens;
          bk.insert(bk.end(), rows.k.begin() + size_t(slot_row) * d, rows.k.begin() + size_t(slot_row + 1) * d);
          bv.insert(bv.end(), rows.v.begin() + size_t(slot_row) * d, rows.v.begin() + size_t(slot_row + 1) * d);
        }
        ref::HeadCacheView view;
        view.d = d;
        view.layout = lay;
        for (auto& p : pages) view.pages.push_back(&p);
        view.bf16_k = bk.data();
        view.bf16_v = bv.data();
        view.mu_k = r.smooth_keys ? &eager.mu[(size_t(L) * H + h) * d] : nullptr;
        const float* qh = &q[(size_t(row) * QH + size_t(h) * G) * d];
        const auto want = ref::quantized_attention(qh, G, view, r, bounds);
        for (int g = 0; g < G; ++g) {
          double num = 0, den = 0;
          for (int c = 0; c < d; ++c) {
            const double x = out[(size_t(row) * QH + h * G + g) * d + c], y = want.out[size_t(g) * d + c];
            num = std::max(num, std::isfinite(x) ? std::fabs(x - y) : 1e30);
            den = std::max(den, std::fabs(y));
          }
          max_rel = std::max(max_rel, num / den);
          max_lse = std::max(max_lse, double(std::fabs(lse[size_t(row) * QH + h * G + g] - want.lse[g])));
        }
      }
    }
  }
  std::printf("  decode step %-14s vs reference on the cache's contents: max_rel %.2e max_lse %.2e\n", GetParam(),
              max_rel, max_lse);
  EXPECT_LT(max_rel, r.native() ? 5e-2 : 1e-3);
  EXPECT_LT(max_lse, 1e-4);
  cudaGraphExecDestroy(ge);
  cudaGraphDestroy(g);
  cudaStreamDestroy(s);
}

INSTANTIATE_TEST_SUITE_P(Recipes, DecodeStep, ::testing::Values("nvfp4", "nvfp4-native", "mxfp4-native", "fp8"),
                         [](const auto& info) {
                           std::string s = info.param;
                           for (auto& ch : s)
                             if (ch == '-') ch = '_';
                           return s;
                         });

}  // namespace
}  // namespace fp4kv::test
