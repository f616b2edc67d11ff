// GPU cache: page bytes equal the CPU quantizer's; prefill + decode appends + promotions
// equal prefilling at once; chunked prefill; non-finite counting; host-side errors.
#include <gtest/gtest.h>

#include <memory>
#include <numeric>
#include <tuple>

#include "cache_test_util.h"
#include "fp4kv/core/error.h"

namespace fp4kv::cache::test {
namespace {

// One request: its block table (same for every layer) and its tokens per layer.
struct Request {
  std::vector<int32_t> blocks;
  std::vector<std::vector<float>> k, v;  // [layer][n][heads][d]
  int n = 0;                             // tokens written so far
};

struct Harness {
  KvCacheConfig cfg;
  Recipe recipe;
  std::vector<float> mu;  // [layers][heads][d]
  std::unique_ptr<KvCache> cache;

  Harness(const std::string& spec, int d, int layers, int heads, int num_blocks, int max_pages, int slots = 8,
          int max_batch = 8, const DeviceMemorySource* memory = nullptr) {
    recipe = parse_recipe(spec);
    cfg.layers = layers;
    cfg.kv_heads = heads;
    cfg.head_dim = d;
    cfg.num_blocks = num_blocks;
    cfg.max_slots = slots;
    cfg.max_batch = max_batch;
    cfg.max_pages = max_pages;
    mu = random_tokens(layers, heads, d, 999, 0.5f);
    cache = std::make_unique<KvCache>(cfg, recipe, mu.data(), memory);
  }
  const float* mu_layer(int l) const { return recipe.smooth_keys ? &mu[size_t(l) * cfg.kv_heads * cfg.head_dim] : nullptr; }

  Request make_request(std::vector<int32_t> blocks, int n_total, unsigned seed) const {
    Request r;
    r.blocks = std::move(blocks);
    for (int l = 0; l < cfg.layers; ++l) {
      r.k.push_back(random_tokens(n_total, cfg.kv_heads, cfg.head_dim, seed * 100 + 2 * l, 2.0f));
      r.v.push_back(random_tokens(n_total, cfg.kv_heads, cfg.head_dim, seed * 100 + 2 * l + 1, 1.0f));
    }
    return r;
  }

  // Prefills tokens [r.n, r.n + count) of the request (all layers).
  void prefill(Request& r, int count) {
    if (count <= 0) return;
    DeviceBuffer<int32_t> row(r.blocks);
    const size_t stride = size_t(cfg.kv_heads) * cfg.head_dim;
    cache->begin_prefill(row.get(), r.n, count, nullptr);
    for (int l = 0; l < cfg.layers; ++l) {
      std::vector<float> k(r.k[l].begin() + r.n * stride, r.k[l].begin() + (r.n + count) * stride);
      std::vector<float> v(r.v[l].begin() + r.n * stride, r.v[l].begin() + (r.n + count) * stride);
      DeviceBuffer<float> dk(k), dv(v);
      cache->prefill(l, dk.get(), dv.get(), nullptr);
      FP4KV_CUDA_OK(cudaDeviceSynchronize());
    }
    r.n += count;
  }

  void expect_matches(const Request& r, const std::string& what) const {
    const int slot = recipe.kv == KvFormat::bf16 ? -1 : cache->slot_of(r.blocks[0]);
    if (recipe.kv != KvFormat::bf16) {
      ASSERT_GE(slot, 0) << what;
    }
    for (int l = 0; l < cfg.layers; ++l)
      expect_request_matches(*cache, l, r.blocks, slot, r.k[l], r.v[l], r.n, mu_layer(l), what + " layer " + std::to_string(l));
  }
};

// Decode steps for a batch of requests (one token each per step, every layer).
struct Stepper {
  Harness& hx;
  std::vector<Request*> rows;
  int max_pages;
  DeviceBuffer<int32_t> bt, sl;
  std::vector<std::unique_ptr<DeviceBuffer<float>>> k, v;

  Stepper(Harness& h, std::vector<Request*> batch, int max_pages_)
      : hx(h), rows(std::move(batch)), max_pages(max_pages_), bt(rows.size() * max_pages_), sl(rows.size()) {
    std::vector<int32_t> table(rows.size() * max_pages, 0);
    for (size_t i = 0; i < rows.size(); ++i)
      std::copy(rows[i]->blocks.begin(), rows[i]->blocks.end(), table.begin() + i * max_pages);
    bt.upload(table);
    const size_t n = rows.size() * h.cfg.kv_heads * h.cfg.head_dim;
    for (int l = 0; l < h.cfg.layers; ++l) {
      k.push_back(std::make_unique<DeviceBuffer<float>>(n));
      v.push_back(std::make_unique<DeviceBuffer<float>>(n));
    }
  }
  // Uploads this step's inputs (the next token of every row).
  void stage(cudaStream_t s) {
    std::vector<int32_t> lens;
    const size_t stride = size_t(hx.cfg.kv_heads) * hx.cfg.head_dim;
    for (Request* r : rows) lens.push_back(r->n + 1);
    sl.upload(lens);
    for (int l = 0; l < hx.cfg.layers; ++l) {
      std::vector<float> hk, hv;
      for (Request* r : rows) {
        hk.insert(hk.end(), r->k[l].begin() + r->n * stride, r->k[l].begin() + (r->n + 1) * stride);
        hv.insert(hv.end(), r->v[l].begin() + r->n * stride, r->v[l].begin() + (r->n + 1) * stride);
      }
      k[l]->upload(hk);
      v[l]->upload(hv);
    }
    (void)s;
  }
  void enqueue(KvCache& c, cudaStream_t s) {
    c.begin_step(bt.get(), sl.get(), int(rows.size()), max_pages, s);
    for (int l = 0; l < hx.cfg.layers; ++l) c.append(l, k[l]->get(), v[l]->get(), s);
    c.end_step(s);
  }
  void step() {
    stage(nullptr);
    enqueue(*hx.cache, nullptr);
    FP4KV_CUDA_OK(cudaDeviceSynchronize());
    for (Request* r : rows) ++r->n;
  }
};

// ---- Page bytes against the CPU quantizer ------------------------------------------------

class PageBytes : public ::testing::TestWithParam<std::tuple<std::string, int>> {};

TEST_P(PageBytes, PrefillMatchesCpuQuantizer) {
  SKIP_WITHOUT_GPU();
  const auto [spec, d] = GetParam();
  Harness hx(spec, d, 2, 2, 16, 4);
  // 300 tokens: two full pages and a partial one; 256: page-aligned end.
  Request a = hx.make_request({5, 2, 9, 0}, 300, 1);
  Request b = hx.make_request({3, 11, 7, 1}, 256, 2);
  hx.prefill(a, 300);
  hx.prefill(b, 256);
  hx.expect_matches(a, spec + " d=" + std::to_string(d) + " n=300");
  hx.expect_matches(b, spec + " d=" + std::to_string(d) + " n=256");
  EXPECT_EQ(hx.cache->error_flags(), 0);
  EXPECT_EQ(hx.cache->nonfinite_count(), 0u);
}

INSTANTIATE_TEST_SUITE_P(Recipes, PageBytes,
                         ::testing::Combine(::testing::Values("nvfp4", "nvfp4:no-search", "nvfp4:no-rotate",
                                                              "nvfp4:no-smooth", "nvfp4:no-recent", "nvfp4-vanilla",
                                                              "nvfp4-vanilla:no-recent", "mxfp4", "mxfp4:no-search",
                                                              "mxfp4-vanilla:no-recent", "fp8", "fp8:no-recent",
                                                              "bf16"),
                                            ::testing::Values(64, 128, 256)),
                         [](const auto& info) {
                           std::string s = std::get<0>(info.param) + "_d" + std::to_string(std::get<1>(info.param));
                           for (char& c : s)
                             if (!isalnum(static_cast<unsigned char>(c))) c = '_';
                           return s;
                         });

// ---- Incremental == at once ---------------------------------------------------------------

class Incremental : public ::testing::TestWithParam<std::tuple<std::string, int>> {};

TEST_P(Incremental, ChunkedPrefillAppendsAndPromotionsEqualPrefillAtOnce) {
  SKIP_WITHOUT_GPU();
  const auto [spec, d] = GetParam();
  const int steps = 160, max_pages = 4;
  Harness hx(spec, d, 2, 2, 40, max_pages, 8, 4);
  const std::vector<int> prefix = {1, 16, 100, 129};
  // Block tables: shuffled ids, disjoint between requests (8 requests x 4 pages <= 40).
  std::vector<int32_t> ids(40);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), std::mt19937(7));
  auto blocks_of = [&](int i) { return std::vector<int32_t>(ids.begin() + 4 * i, ids.begin() + 4 * i + 4); };

  std::vector<Request> inc, whole;
  for (int i = 0; i < 4; ++i) inc.push_back(hx.make_request(blocks_of(i), prefix[i] + steps, 10 + i));
  for (int i = 0; i < 4; ++i) {
    // Chunks of 50 and 37 tokens: most end mid-page.
    for (int c = 0; inc[i].n < prefix[i]; ++c) hx.prefill(inc[i], std::min(c % 2 ? 37 : 50, prefix[i] - inc[i].n));
    hx.expect_matches(inc[i], spec + " after chunked prefill of request " + std::to_string(i));
  }
  Stepper st(hx, {&inc[0], &inc[1], &inc[2], &inc[3]}, max_pages);
  for (int s = 0; s < steps; ++s) {
    st.step();
    // Lengths cross 16, 127, 128, 129, 255, 256, 257 on the way.
    if (s == 14 || s == 27 || s == 28 || s == 125 || s == 126 || s == 127 || s == steps - 1)
      for (int i = 0; i < 4; ++i)
        hx.expect_matches(inc[i], spec + " request " + std::to_string(i) + " at " + std::to_string(inc[i].n) + " tokens");
  }
  ASSERT_EQ(hx.cache->error_flags(), 0);
  // The same sequences prefilled at once, in other blocks and slots: identical bytes.
  for (int i = 0; i < 4; ++i) {
    whole.push_back(hx.make_request(blocks_of(4 + i), prefix[i] + steps, 10 + i));
    hx.prefill(whole[i], prefix[i] + steps);
    hx.expect_matches(whole[i], spec + " request " + std::to_string(i) + " prefilled at once");
    for (int l = 0; l < hx.cfg.layers; ++l)
      for (int p = 0; p < stored_pages(whole[i].n, hx.recipe); ++p)
        for (int h = 0; h < hx.cfg.kv_heads; ++h)
          ASSERT_EQ(hx.cache->read_page(l, inc[i].blocks[p], h), hx.cache->read_page(l, whole[i].blocks[p], h))
              << spec << " request " << i << " page " << p;
  }
  EXPECT_EQ(hx.cache->error_flags(), 0);
}

TEST_P(Incremental, ChunkedPrefillEqualsWhole) {
  SKIP_WITHOUT_GPU();
  const auto [spec, d] = GetParam();
  Harness hx(spec, d, 1, 2, 16, 6);
  Request chunked = hx.make_request({0, 2, 4, 6, 8, 10}, 700, 3);
  Request whole = hx.make_request({1, 3, 5, 7, 9, 11}, 700, 3);
  for (int c : {1, 127, 200, 64, 300, 8}) hx.prefill(chunked, c);
  hx.prefill(whole, 700);
  hx.expect_matches(chunked, spec + " chunked");
  hx.expect_matches(whole, spec + " whole");
}

INSTANTIATE_TEST_SUITE_P(Recipes, Incremental,
                         ::testing::Values(std::make_tuple(std::string("nvfp4"), 128),
                                           std::make_tuple(std::string("nvfp4"), 64),
                                           std::make_tuple(std::string("nvfp4:no-recent"), 128),
                                           std::make_tuple(std::string("nvfp4-vanilla"), 64),
                                           std::make_tuple(std::string("nvfp4-vanilla:no-recent"), 128),
                                           std::make_tuple(std::string("mxfp4"), 256),
                                           std::make_tuple(std::string("mxfp4-vanilla:no-recent"), 64),
                                           std::make_tuple(std::string("fp8"), 128),
                                           std::make_tuple(std::string("fp8:no-recent"), 64),
                                           std::make_tuple(std::string("bf16"), 128)),
                         [](const auto& info) {
                           std::string s = std::get<0>(info.param) + "_d" + std::to_string(std::get<1>(info.param));
                           for (char& c : s)
                             if (!isalnum(static_cast<unsigned char>(c))) c = '_';
                           return s;
                         });

// ---- Non-finite inputs ------------------------------------------------------------------------

TEST(KvCacheNonFinite, CountedAndEncodedAsZero) {
  SKIP_WITHOUT_GPU();
  for (const char* spec : {"nvfp4", "nvfp4-vanilla:no-recent", "mxfp4:no-rotate", "fp8:no-recent", "bf16"}) {
    Harness hx(spec, 64, 1, 2, 8, 3, 4, 2);
    Request r = hx.make_request({4, 1, 6}, 260, 5);
    const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
    const int H = 2, d = 64;
    auto at = [&](std::vector<float>& x, int t, int h, int c) -> float& { return x[(size_t(t) * H + h) * d + c]; };
    at(r.k[0], 3, 0, 5) = nan;     // page 0 (with rotation: the whole transformed row)
    at(r.v[0], 40, 1, 0) = -inf;   // page 0
    at(r.v[0], 150, 0, 7) = inf;   // tail of the prefill
    at(r.k[0], 151, 1, 63) = inf;
    at(r.k[0], 255, 0, 1) = nan;   // decode token that fills page 1
    at(r.v[0], 258, 1, 2) = nan;   // decode token after it
    hx.prefill(r, 200);
    Stepper st(hx, {&r}, 3);
    for (int s = 0; s < 60; ++s) st.step();
    long want = 0;
    for (int h = 0; h < H; ++h) {
      cached_rows(r.k[0], r.n, H, h, d, hx.recipe, hx.mu_layer(0), true, &want);
      cached_rows(r.v[0], r.n, H, h, d, hx.recipe, nullptr, false, &want);
    }
    EXPECT_EQ(hx.cache->nonfinite_count(), static_cast<unsigned long long>(want)) << spec;
    EXPECT_GT(want, 0);
    hx.expect_matches(r, std::string(spec) + " with non-finite inputs");
    EXPECT_EQ(hx.cache->error_flags(), 0);
  }
}

// A cache on the caller's memory (the PyTorch extension's tensors) holds the same bytes as one
// on its own, lives entirely in what the caller gave, and leaves freeing it to the caller.
TEST(KvCacheMemory, CallerMemoryHoldsTheSameCache) {
  SKIP_WITHOUT_GPU();
  std::vector<std::pair<void*, size_t>> given;
  const DeviceMemorySource source{[&given](size_t bytes, const char*) {
    void* p = nullptr;
    FP4KV_CUDA_OK(cudaMalloc(&p, bytes));
    given.emplace_back(p, bytes);
    return p;
  }};
  for (const char* spec : {"nvfp4", "bf16"}) {
    given.clear();
    Harness own(spec, 128, 2, 2, 8, 3);
    Harness theirs(spec, 128, 2, 2, 8, 3, 8, 8, &source);
    Request a = own.make_request({2, 5, 0}, 300, 7), b = theirs.make_request({2, 5, 0}, 300, 7);
    own.prefill(a, 300);
    theirs.prefill(b, 300);
    theirs.expect_matches(b, std::string(spec) + " on caller memory");
    for (int l = 0; l < 2; ++l)
      for (int block : {2, 5, 0})
        for (int h = 0; h < 2; ++h) EXPECT_EQ(own.cache->read_page(l, block, h), theirs.cache->read_page(l, block, h));
    size_t total = 0;
    bool pool_given = false;
    for (const auto& [p, bytes] : given) {
      total += bytes;
      pool_given = pool_given || p == static_cast<const void*>(theirs.cache->pool(0));
    }
    EXPECT_TRUE(pool_given) << spec;
    EXPECT_EQ(total, theirs.cache->device_bytes()) << spec;
    EXPECT_EQ(theirs.cache->device_bytes(), own.cache->device_bytes()) << spec;
    theirs.cache.reset();  // must not free what it was given
    for (const auto& [p, bytes] : given) EXPECT_EQ(cudaFree(p), cudaSuccess) << spec;
  }
}

// ---- Host-side errors -------------------------------------------------------------------------

TEST(KvCacheErrors, UnsupportedShapeOrFormatIsRejectedEarly) {
  // These throw before the device is touched, so they run without a GPU too.
  KvCacheConfig c;
  c.num_blocks = 4;
  c.max_slots = 2;
  c.max_batch = 2;
  c.max_pages = 2;
  c.head_dim = 96;
  EXPECT_THROW(KvCache(c, parse_recipe("nvfp4")), Error);
  c.head_dim = 512;
  EXPECT_THROW(KvCache(c, parse_recipe("nvfp4")), Error);
  c.head_dim = 128;
  EXPECT_THROW(KvCache(c, parse_recipe("fp32")), Error);
  c.max_slots = 0;
  EXPECT_THROW(KvCache(c, parse_recipe("nvfp4")), Error);
  c.max_slots = 4096;
  EXPECT_THROW(KvCache(c, parse_recipe("nvfp4")), Error);
}

TEST(KvCacheErrors, BadArgumentsThrow) {
  SKIP_WITHOUT_GPU();
  Harness hx("nvfp4", 64, 2, 2, 8, 2, 4, 2);
  KvCache& c = *hx.cache;
  DeviceBuffer<int32_t> row(std::vector<int32_t>{1, 2});
  DeviceBuffer<float> x(size_t(4) * 2 * 64 + 4);
  EXPECT_THROW(c.prefill(0, x.get(), x.get(), nullptr), Error);  // no begin_prefill
  EXPECT_THROW(c.begin_prefill(row.get(), 200, 100, nullptr), Error);  // past max_pages * 128
  EXPECT_THROW(c.begin_prefill(row.get(), -1, 1, nullptr), Error);
  EXPECT_THROW(c.begin_prefill(nullptr, 0, 1, nullptr), Error);
  c.begin_prefill(row.get(), 0, 4, nullptr);
  EXPECT_THROW(c.prefill(2, x.get(), x.get(), nullptr), Error);       // layer out of range
  EXPECT_THROW(c.prefill(0, x.get() + 1, x.get(), nullptr), Error);   // misaligned
  EXPECT_THROW(c.append(0, x.get(), x.get(), nullptr), Error);        // no begin_step
  DeviceBuffer<int32_t> lens(std::vector<int32_t>{1, 1});
  EXPECT_THROW(c.begin_step(row.get(), lens.get(), 3, 2, nullptr), Error);  // batch > max_batch
  EXPECT_THROW(c.begin_step(row.get(), lens.get(), 0, 2, nullptr), Error);
  EXPECT_THROW(c.begin_step(reinterpret_cast<const int32_t*>(reinterpret_cast<const char*>(row.get()) + 2), lens.get(),
                            1, 2, nullptr),
               Error);
  EXPECT_THROW(c.read_page(0, 8, 0), Error);  // block out of range
  EXPECT_THROW(c.read_page(0, 0, 2), Error);  // head out of range
  EXPECT_THROW(c.release(-1, nullptr), Error);
  EXPECT_THROW(c.read_slot(0, 4, 0), Error);
}

}  // namespace
}  // namespace fp4kv::cache::test
