// QK-norm + RoPE with the cache append fused in (ops::qk_norm_rope_append) against the two
// kernels it replaces, qk_norm_rope then KvCache::append: two caches with the same history
// run the same decode steps, one each way, and must hold the same bytes (pages after the
// promotions, sink and recent slot rows, BF16 pool rows), count the same non-finite values
// and give the same queries, bit for bit, over lengths that cross the sink rows (16) and
// page ends (128, 256), for every cache format and head size. The two kernels are each
// checked against their CPU twins (OpsGpu.QkNormRopeMatchesTwin; the cache's PageBytes and
// Incremental tests); byte equality with them is the tighter check for the fused form, since
// QK-norm's twin may differ by ulps through the norm's sum order.
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "fp4kv/cache/kv_cache.h"
#include "fp4kv/core/error.h"
#include "fp4kv/core/recipe.h"
#include "fp4kv/ops/qk_norm_rope.h"
#include "ops_test_util.h"

namespace fp4kv::ops::test {
namespace {

using cache::KvCache;
using cache::KvCacheConfig;

struct FusedCase {
  std::string recipe;
  int q_heads, kv_heads, head_dim;
};

constexpr int kLayers = 2;
constexpr int kMaxPages = 4;
constexpr int kRopePositions = 4 * cache::kPage;

KvCacheConfig config_of(const FusedCase& c, int rows) {
  KvCacheConfig cfg;
  cfg.layers = kLayers;
  cfg.kv_heads = c.kv_heads;
  cfg.head_dim = c.head_dim;
  cfg.num_blocks = rows * kMaxPages;
  cfg.max_slots = rows;
  cfg.max_batch = rows;
  cfg.max_pages = kMaxPages;
  return cfg;
}

// Both caches' bytes of every block and slot row the requests use, and their counters.
void expect_same_cache(const KvCache& a, const KvCache& b, const std::vector<int32_t>& first_blocks,
                       const std::string& what) {
  const KvCacheConfig& cfg = a.config();
  for (int l = 0; l < cfg.layers; ++l)
    for (int blk = 0; blk < cfg.num_blocks; ++blk)
      for (int h = 0; h < cfg.kv_heads; ++h)
        ASSERT_EQ(a.read_page(l, blk, h), b.read_page(l, blk, h))
            << what << ": layer " << l << " block " << blk << " head " << h;
  if (a.recipe().kv != KvFormat::bf16) {
    for (int32_t first : first_blocks) {
      const int sa = a.slot_of(first), sb = b.slot_of(first);
      ASSERT_GE(sa, 0) << what;
      ASSERT_EQ(sa, sb) << what;
      for (int l = 0; l < cfg.layers; ++l)
        for (int h = 0; h < cfg.kv_heads; ++h) {
          const cache::SlotRows ra = a.read_slot(l, sa, h), rb = b.read_slot(l, sb, h);
          ASSERT_EQ(ra.k, rb.k) << what << ": slot K rows, layer " << l << " head " << h;
          ASSERT_EQ(ra.v, rb.v) << what << ": slot V rows, layer " << l << " head " << h;
        }
    }
  }
  EXPECT_EQ(a.nonfinite_count(), b.nonfinite_count()) << what;
  EXPECT_EQ(a.error_flags(), 0) << what;
  EXPECT_EQ(b.error_flags(), 0) << what;
}

void run_case(const FusedCase& c) {
  SCOPED_TRACE(c.recipe + " q_heads " + std::to_string(c.q_heads) + " kv_heads " + std::to_string(c.kv_heads) + " d " +
               std::to_string(c.head_dim));
  const Recipe recipe = parse_recipe(c.recipe);
  const std::vector<int> prefix = {3, 120, 250};  // decode crosses 16, 128, 256
  const int rows = int(prefix.size()), steps = 20, d = c.head_dim;
  const int heads = c.q_heads + 2 * c.kv_heads;
  const KvCacheConfig cfg = config_of(c, rows);
  std::vector<float> mu(size_t(kLayers) * c.kv_heads * d);
  std::mt19937 rng(17);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (float& x : mu) x = 0.5f * nd(rng);
  KvCache unfused(cfg, recipe, mu.data()), fused(cfg, recipe, mu.data());

  // Block tables (disjoint) and the same prefilled history in both caches.
  std::vector<int32_t> table(size_t(rows) * kMaxPages), first_blocks;
  for (int i = 0; i < rows * kMaxPages; ++i) table[size_t(i)] = (i * 5 + 3) % (rows * kMaxPages);
  for (int r = 0; r < rows; ++r) first_blocks.push_back(table[size_t(r) * kMaxPages]);
  DeviceBuffer<int32_t> d_table(table);
  for (int r = 0; r < rows; ++r) {
    const size_t n = size_t(prefix[size_t(r)]) * c.kv_heads * d;
    for (int l = 0; l < kLayers; ++l) {
      std::vector<float> k(n), v(n);
      for (float& x : k) x = 2.0f * nd(rng);
      for (float& x : v) x = nd(rng);
      DeviceBuffer<float> dk(k), dv(v);
      for (KvCache* u : {&unfused, &fused})
        u->prefill(l, d_table.get() + size_t(r) * kMaxPages, 0, prefix[size_t(r)], dk.get(), dv.get(), nullptr);
    }
  }
  FP4KV_CUDA_OK(cudaDeviceSynchronize());

  const auto qn = random_bf16(size_t(d), 1.0f, 0.3f, 31), kn = random_bf16(size_t(d), 1.0f, 0.3f, 32);
  const RopeTable rope = make_rope_table(d, 1000000.0, kRopePositions);
  DeviceBuffer<uint16_t> d_qn(qn), d_kn(kn), d_cos(rope.cos_bits), d_sin(rope.sin_bits);
  DeviceBuffer<uint16_t> d_qkv(size_t(rows) * heads * d), d_q_unfused(size_t(rows) * c.q_heads * d),
      d_q_fused(size_t(rows) * c.q_heads * d);
  DeviceBuffer<float> d_k(size_t(rows) * c.kv_heads * d), d_v(size_t(rows) * c.kv_heads * d);
  const size_t row_count = static_cast<size_t>(rows);
  DeviceBuffer<int32_t> d_pos(row_count), d_lens(row_count), d_flags(1);

  std::vector<int> n = prefix;
  for (int s = 0; s < steps; ++s) {
    std::vector<int32_t> pos, lens;
    for (int r = 0; r < rows; ++r) {
      pos.push_back(n[size_t(r)]);
      lens.push_back(n[size_t(r)] + 1);
    }
    d_pos.upload(pos);
    d_lens.upload(lens);
    for (KvCache* u : {&unfused, &fused})
      u->begin_step(d_table.get(), d_lens.get(), rows, kMaxPages, nullptr);
    for (int l = 0; l < kLayers; ++l) {
      auto qkv = random_bf16(size_t(rows) * heads * d, 0.0f, 2.0f, uint32_t(1000 + 10 * s + l));
      // A non-finite K and V element in one step: counted once by each path, cached as 0.
      if (s == 5 && l == 1) {
        qkv[size_t(c.q_heads) * d + 3] = 0x7fc0;                        // K head 0 of row 0: NaN
        qkv[(size_t(heads) + c.q_heads + c.kv_heads) * d + 1] = 0x7f80;  // V head 0 of row 1: +inf
      }
      d_qkv.upload(qkv);
      QkNormRopeArgs a{as_bf16(d_qkv), d_pos.get(), as_bf16(d_qn), as_bf16(d_kn), as_bf16(d_cos), as_bf16(d_sin),
                       rope.positions, rows, c.q_heads, c.kv_heads, d, 1e-6f, as_bf16(d_q_unfused), d_k.get(),
                       d_v.get(), d_flags.get()};
      qk_norm_rope(a, nullptr);
      unfused.append(l, d_k.get(), d_v.get(), nullptr);
      a.q = as_bf16(d_q_fused);
      a.k = nullptr;  // the fused form writes no K/V buffers
      a.v = nullptr;
      qk_norm_rope_append(a, fused.append_target(l), nullptr);
      fused.finish_append(l, nullptr);
      FP4KV_CUDA_OK(cudaDeviceSynchronize());
      ASSERT_EQ(d_q_fused.download(), d_q_unfused.download()) << "q, step " << s << " layer " << l;
    }
    for (KvCache* u : {&unfused, &fused}) u->end_step(nullptr);
    FP4KV_CUDA_OK(cudaDeviceSynchronize());
    for (int& x : n) ++x;
    if (s == 0 || s == 8 || s == 12 || s == steps - 1)
      expect_same_cache(unfused, fused, first_blocks, "after step " + std::to_string(s));
  }
  EXPECT_EQ(d_flags.download()[0], 0);
  EXPECT_GE(fused.nonfinite_count(), 2u);  // the NaN key row (all of it after the norm) and the inf value
}

TEST(QkNormRopeAppendGpu, EqualsQkNormRopeThenAppend) {
  SKIP_WITHOUT_GPU();
  for (const FusedCase& c : {FusedCase{"nvfp4", 8, 2, 128}, FusedCase{"mxfp4", 4, 4, 64}, FusedCase{"fp8", 4, 1, 256},
                             FusedCase{"bf16", 8, 2, 128}, FusedCase{"nvfp4:no-recent", 4, 2, 64},
                             FusedCase{"nvfp4-vanilla", 2, 1, 256}, FusedCase{"fp8:no-recent", 16, 8, 128}})
    run_case(c);
}

TEST(QkNormRopeAppendGpu, RejectsArgumentsThatDoNotFitTheCache) {
  SKIP_WITHOUT_GPU();
  const FusedCase c{"nvfp4", 4, 2, 128};
  const KvCacheConfig cfg = config_of(c, 2);
  const std::vector<float> mu(size_t(kLayers) * c.kv_heads * c.head_dim, 0.0f);
  KvCache kv(cfg, parse_recipe(c.recipe), mu.data());
  EXPECT_THROW(kv.append_target(0), Error);  // no step begun
  DeviceBuffer<int32_t> table(2 * kMaxPages), lens(std::vector<int32_t>{1, 1});
  table.upload(std::vector<int32_t>{0, 1, 2, 3, 4, 5, 6, 7});
  kv.begin_step(table.get(), lens.get(), 2, kMaxPages, nullptr);
  EXPECT_THROW(kv.append_target(kLayers), Error);
  const cache::AppendTarget target = kv.append_target(1);
  DeviceBuffer<uint16_t> buf(size_t(2) * 8 * 128), q(size_t(2) * 4 * 128);
  DeviceBuffer<int32_t> pos(std::vector<int32_t>{0, 0}), flags(1);
  QkNormRopeArgs a;
  a.qkv = as_bf16(buf);
  a.positions = pos.get();
  a.q_norm = a.k_norm = a.rope_cos = a.rope_sin = as_bf16(buf);
  a.rope_positions = 1;
  a.tokens = 2;
  a.q_heads = 4;
  a.kv_heads = 2;
  a.head_dim = 128;
  a.q = as_bf16(q);
  a.error_flags = flags.get();
  a.tokens = 1;  // not the step's batch
  EXPECT_THROW(qk_norm_rope_append(a, target, nullptr), Error);
  a.tokens = 2;
  a.kv_heads = 1;  // not the cache's KV heads
  EXPECT_THROW(qk_norm_rope_append(a, target, nullptr), Error);
  a.kv_heads = 2;
  a.head_dim = 64;  // not the cache's head_dim
  EXPECT_THROW(qk_norm_rope_append(a, target, nullptr), Error);
  a.head_dim = 128;
  a.q = nullptr;
  EXPECT_THROW(qk_norm_rope_append(a, target, nullptr), Error);
  FP4KV_CUDA_OK(cudaDeviceSynchronize());
}

}  // namespace
}  // namespace fp4kv::ops::test
