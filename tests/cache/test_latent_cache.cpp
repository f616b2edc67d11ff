// The MLA latent cache (KvCacheConfig::rope_dim > 0): after chunked prefill (a chunk ending
// mid-page, the next completing it from the slot's recent rows), decode appends and
// promotions, every page is byte-identical to the CPU reference's page (ref::MlaSequence,
// packed by host_page.h pack_latent_page), and the slot rows hold the reference's BF16 rows;
// BF16 latent caches hold the BF16 rows in their pages. Recipes: the mixed NVFP4 and MXFP4
// presets, a vanilla one (no smoothing, rotation or search), quantize on write (partial pages
// re-quantized every step), BF16.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <random>

#include "cache_test_util.h"
#include "fp4kv/cache/host_page.h"
#include "fp4kv/core/error.h"
#include "fp4kv/ref/mla.h"

namespace fp4kv::cache::test {
namespace {

constexpr int kDc = kMlaLatentDim, kDr = kMlaRopeDim;
constexpr int kLayers = 2, kMaxPages = 4;

// Latents with a per-channel mean and a few outlier channels (what smoothing is for).
std::vector<float> latents(int n, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> mean(kDc);
  for (int x = 0; x < kDc; ++x) mean[x] = x % 61 == 7 ? 12.0f : normal(rng);
  std::vector<float> c(size_t(n) * kDc);
  for (int t = 0; t < n; ++t)
    for (int x = 0; x < kDc; ++x) c[size_t(t) * kDc + x] = mean[x] + normal(rng);
  return c;
}

KvCacheConfig latent_config(int layers, int num_blocks, int slots, int max_batch) {
  return KvCacheConfig{.layers = layers, .kv_heads = 1, .head_dim = kDc, .num_blocks = num_blocks, .max_slots = slots,
                       .max_batch = max_batch, .max_pages = kMaxPages, .rope_dim = kDr};
}

struct LatentHarness {
  KvCacheConfig cfg;
  Recipe recipe;
  std::vector<float> mu;                 // [layers][512]
  std::vector<std::vector<float>> c, r;  // [layer][n_total][512], [layer][n_total][64]
  std::vector<int32_t> blocks = {5, 2, 7, 0};
  std::unique_ptr<KvCache> cache;
  int n = 0;

  LatentHarness(const std::string& spec, int n_total) : cfg(latent_config(kLayers, 8, 4, 2)), recipe(parse_recipe(spec)) {
    for (int l = 0; l < kLayers; ++l) {
      c.push_back(latents(n_total, 17 + l));
      r.push_back(random_tokens(n_total, 1, kDr, 31 + l, 1.0f));
      std::vector<float> m(kDc, 0.0f);
      for (int t = 0; t < n_total; ++t)
        for (int x = 0; x < kDc; ++x) m[x] += c[l][size_t(t) * kDc + x] / float(n_total);
      mu.insert(mu.end(), m.begin(), m.end());
    }
    cache = std::make_unique<KvCache>(cfg, recipe, mu.data());
  }

  void prefill(int count) {
    DeviceBuffer<int32_t> row(blocks);
    cache->begin_prefill(row.get(), n, count, nullptr);
    for (int l = 0; l < kLayers; ++l) {
      DeviceBuffer<float> dc(std::vector<float>(c[l].begin() + size_t(n) * kDc, c[l].begin() + size_t(n + count) * kDc));
      DeviceBuffer<float> dr(std::vector<float>(r[l].begin() + size_t(n) * kDr, r[l].begin() + size_t(n + count) * kDr));
      cache->prefill(l, dc.get(), dr.get(), nullptr);
      FP4KV_CUDA_OK(cudaDeviceSynchronize());
    }
    n += count;
  }

  void decode_step() {
    DeviceBuffer<int32_t> table(blocks), len(std::vector<int32_t>{n + 1});
    std::vector<std::unique_ptr<DeviceBuffer<float>>> dc, dr;
    cache->begin_step(table.get(), len.get(), 1, kMaxPages, nullptr);
    for (int l = 0; l < kLayers; ++l) {
      dc.push_back(std::make_unique<DeviceBuffer<float>>(
          std::vector<float>(c[l].begin() + size_t(n) * kDc, c[l].begin() + size_t(n + 1) * kDc)));
      dr.push_back(std::make_unique<DeviceBuffer<float>>(
          std::vector<float>(r[l].begin() + size_t(n) * kDr, r[l].begin() + size_t(n + 1) * kDr)));
      cache->append(l, dc.back()->get(), dr.back()->get(), nullptr);
    }
    cache->end_step(nullptr);
    FP4KV_CUDA_OK(cudaDeviceSynchronize());
    ++n;
  }

  // Every page and slot row of the n tokens so far against the reference's.
  void expect_matches_reference(const std::string& what) const {
    ASSERT_EQ(cache->error_flags(), 0) << what;
    const LatentPageLayout L = LatentPageLayout::make(recipe.kv, kDc, kDr);
    for (int l = 0; l < kLayers; ++l) {
      const std::string at = what + ", layer " + std::to_string(l);
      if (recipe.kv == KvFormat::bf16) {
        expect_bf16_pages(l, L, at);
        continue;
      }
      const ref::MlaSequence seq(c[l].data(), r[l].data(), n, ref::MlaShape{}, recipe, &mu[size_t(l) * kDc]);
      ref::HeadSequence::View v;
      seq.latent().view(n, v);
      const DecodeLayout& dl = v.view.layout;
      const std::vector<float>& rb = seq.rope_keys();
      for (int pg = 0; pg < dl.quant_pages; ++pg) {
        std::vector<uint8_t> want(L.bytes);
        pack_latent_page(*v.view.pages[pg], rb.data() + size_t(pg) * kPage * kDr, std::min(kPage, n - kPage * pg), L,
                         want.data());
        expect_same_bytes(cache->read_page(l, blocks[pg], 0), want, at + ", page " + std::to_string(pg));
      }
      const SlotRows s = cache->read_slot(l, cache->slot_of(blocks[0]), 0);
      for (int t = 0; t < dl.sink_tokens; ++t)
        expect_row(s, t, v.bf16_k.data() + size_t(t) * kDc, rb.data() + size_t(t) * kDr, at + ", sink row");
      for (int t = dl.recent_begin; t < dl.recent_end; ++t)
        expect_row(s, kSinkTokens + t % kPage, v.bf16_k.data() + size_t(dl.sink_tokens + t - dl.recent_begin) * kDc,
                   rb.data() + size_t(t) * kDr, at + ", recent token " + std::to_string(t));
    }
  }

  void expect_bf16_pages(int l, const LatentPageLayout& L, const std::string& at) const {
    std::vector<float> cb(c[l].size()), rbf(r[l].size());
    for (size_t i = 0; i < cb.size(); ++i) cb[i] = round_bf16(c[l][i]);
    for (size_t i = 0; i < rbf.size(); ++i) rbf[i] = round_bf16(r[l][i]);
    for (int pg = 0; pg * kPage < n; ++pg) {
      std::vector<uint8_t> want(L.bytes);
      pack_bf16_latent_page(cb.data() + size_t(pg) * kPage * kDc, rbf.data() + size_t(pg) * kPage * kDr,
                            std::min(kPage, n - kPage * pg), L, want.data());
      expect_same_bytes(cache->read_page(l, blocks[pg], 0), want, at + ", bf16 page " + std::to_string(pg));
    }
  }

  static void expect_same_bytes(const std::vector<uint8_t>& got, const std::vector<uint8_t>& want, const std::string& at) {
    ASSERT_EQ(got.size(), want.size()) << at;
    for (size_t i = 0; i < got.size(); ++i)
      ASSERT_EQ(int(got[i]), int(want[i])) << at << ": first differing byte " << i << " of " << got.size();
  }

  static void expect_row(const SlotRows& s, int row, const float* latent, const float* rope, const std::string& at) {
    for (int x = 0; x < kDc; ++x) ASSERT_EQ(s.k[size_t(row) * kDc + x], latent[x]) << at << ", latent " << x;
    for (int x = 0; x < kDr; ++x) ASSERT_EQ(s.v[size_t(row) * kDr + x], rope[x]) << at << ", r " << x;
  }
};

class LatentCacheBytes : public ::testing::TestWithParam<std::string> {};

TEST_P(LatentCacheBytes, PrefillAppendsAndPromotionsMatchReference) {
  SKIP_WITHOUT_GPU();
  constexpr int kTotal = 300;
  LatentHarness hx(GetParam(), kTotal);
  hx.prefill(100);  // ends mid-page
  hx.prefill(60);   // completes page 0 from the recent rows and its own input
  hx.expect_matches_reference("after prefill of 160");
  while (hx.n < kTotal) hx.decode_step();  // promotes page 1 at token 256
  hx.expect_matches_reference("after decode to 300");
}

INSTANTIATE_TEST_SUITE_P(Recipes, LatentCacheBytes,
                         ::testing::Values("nvfp4", "mxfp4", "nvfp4-vanilla", "nvfp4:no-recent", "bf16"),
                         [](const auto& info) {
                           std::string s = info.param;
                           for (char& ch : s)
                             if (ch == '-' || ch == ':') ch = '_';
                           return s;
                         });

TEST(LatentCacheErrors, ShapeAndFormatAreChecked) {
  SKIP_WITHOUT_GPU();
  const KvCacheConfig cfg = latent_config(1, 2, 1, 1);
  EXPECT_NO_THROW(KvCache(cfg, parse_recipe("nvfp4")));
  EXPECT_THROW(KvCache(cfg, parse_recipe("fp8")), Error);
  KvCacheConfig bad = cfg;
  bad.kv_heads = 2;
  EXPECT_THROW(KvCache(bad, parse_recipe("nvfp4")), Error);
  bad = cfg;
  bad.rope_dim = 32;
  EXPECT_THROW(KvCache(bad, parse_recipe("nvfp4")), Error);
  bad = cfg;
  bad.head_dim = 256;
  EXPECT_THROW(KvCache(bad, parse_recipe("mxfp4")), Error);
}

}  // namespace
}  // namespace fp4kv::cache::test
