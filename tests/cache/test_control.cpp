// The control kernel (slot table, split plan, promotions, error flags) and CUDA-graph
// capture of a whole decode step's cache work.
#include <gtest/gtest.h>

#include <map>
#include <memory>

#include "cache_test_util.h"
#include "fp4kv/cache/split_plan.h"
#include "fp4kv/cache/step_plan.h"
#include "fp4kv/core/decode_layout.h"

namespace fp4kv::cache::test {
namespace {

KvCacheConfig small_config(int slots, int max_batch, int heads = 1, int num_blocks = 64, int max_pages = 4) {
  KvCacheConfig c;
  c.layers = 1;
  c.kv_heads = heads;
  c.head_dim = 64;
  c.num_blocks = num_blocks;
  c.max_slots = slots;
  c.max_batch = max_batch;
  c.max_pages = max_pages;
  c.max_splits = 16;
  return c;
}

// Runs one decode step whose rows are requests identified by their first block; request
// `id` uses blocks id, id + 1, ... Returns the error flags after it.
struct StepDriver {
  KvCache& cache;
  int max_pages;
  int32_t step(const std::vector<int>& ids, const std::vector<int>& lens) {
    std::vector<int32_t> bt(ids.size() * max_pages);
    for (size_t r = 0; r < ids.size(); ++r)
      for (int p = 0; p < max_pages; ++p) bt[r * max_pages + p] = ids[r] + p;
    DeviceBuffer<int32_t> dbt(bt), dsl(std::vector<int32_t>(lens.begin(), lens.end()));
    const size_t n = ids.size() * cache.config().kv_heads * cache.config().head_dim;
    DeviceBuffer<float> k(random_tokens(int(ids.size()), cache.config().kv_heads, cache.config().head_dim, 77)), v(n);
    cache.begin_step(dbt.get(), dsl.get(), int(ids.size()), max_pages, nullptr);
    cache.append(0, k.get(), v.get(), nullptr);
    cache.end_step(nullptr);
    return cache.error_flags();
  }
  int32_t step(const std::vector<int>& ids) { return step(ids, std::vector<int>(ids.size(), 20)); }
};

TEST(ControlKernel, SlotAssignmentFollowsLeastRecentlySeen) {
  SKIP_WITHOUT_GPU();
  KvCache cache(small_config(4, 8), parse_recipe("nvfp4"));
  StepDriver drv{cache, 4};
  const int A = 10, B = 20, C = 30, D = 40, E = 50, F = 0;

  ASSERT_EQ(drv.step({A, B}), 0);
  EXPECT_EQ(cache.slot_of(A), 0);
  EXPECT_EQ(cache.slot_of(B), 1);
  auto plan = cache.read_plan();
  EXPECT_EQ(plan.num_rows, 2);
  EXPECT_EQ(plan.row_slot[0], 0);
  EXPECT_EQ(plan.row_slot[1], 1);
  EXPECT_EQ(plan.row_slot[2], -1);  // rows past the batch carry no work
  EXPECT_EQ(plan.row_splits[2], 0);
  EXPECT_EQ(cache.step_counter(), 1);

  // A is absent and keeps its slot; C takes the free slot 2.
  ASSERT_EQ(drv.step({B, C}), 0);
  EXPECT_EQ(cache.slot_of(A), 0);
  EXPECT_EQ(cache.slot_of(B), 1);
  EXPECT_EQ(cache.slot_of(C), 2);
  plan = cache.read_plan();
  EXPECT_EQ(plan.row_slot[0], 1);
  EXPECT_EQ(plan.row_slot[1], 2);

  ASSERT_EQ(drv.step({A, D}), 0);
  EXPECT_EQ(cache.slot_of(D), 3);
  // All slots owned. Last seen: A step 3, B step 2, C step 2, D step 3. E takes the least
  // recently seen slot not claimed by this batch: B's (step 2, lower index than C's).
  ASSERT_EQ(drv.step({E, A}), 0);
  EXPECT_EQ(cache.slot_of(E), 1);
  EXPECT_EQ(cache.slot_of(B), -1);
  EXPECT_EQ(cache.slot_of(A), 0);

  // A finished request released explicitly: its slot is free and taken first.
  cache.release(D, nullptr);
  EXPECT_EQ(cache.slot_of(D), -1);
  ASSERT_EQ(drv.step({F, A}), 0);
  EXPECT_EQ(cache.slot_of(F), 3);
  EXPECT_EQ(cache.slot_of(C), 2);
  EXPECT_EQ(cache.step_counter(), 5);
}

TEST(ControlKernel, PrefillClaimsSlotAndDecodeFindsIt) {
  SKIP_WITHOUT_GPU();
  KvCache cache(small_config(2, 4), parse_recipe("nvfp4"));
  StepDriver drv{cache, 4};
  DeviceBuffer<int32_t> row_a(std::vector<int32_t>{10, 11, 12, 13}), row_b(std::vector<int32_t>{20, 21, 22, 23});
  DeviceBuffer<float> k(random_tokens(20, 1, 64, 3)), v(random_tokens(20, 1, 64, 4));
  cache.prefill(0, row_a.get(), 0, 20, k.get(), v.get(), nullptr);
  cache.prefill(0, row_b.get(), 0, 20, k.get(), v.get(), nullptr);
  EXPECT_EQ(cache.slot_of(10), 0);
  EXPECT_EQ(cache.slot_of(20), 1);
  ASSERT_EQ(drv.step({20, 10}, {21, 21}), 0);
  const auto plan = cache.read_plan();
  EXPECT_EQ(plan.row_slot[0], 1);
  EXPECT_EQ(plan.row_slot[1], 0);
  // A third prefill while both slots were used by the last step: no slot.
  DeviceBuffer<int32_t> row_c(std::vector<int32_t>{30, 31, 32, 33});
  cache.prefill(0, row_c.get(), 0, 20, k.get(), v.get(), nullptr);
  EXPECT_EQ(cache.error_flags(), kErrorSlotsExhausted);
  EXPECT_EQ(cache.slot_of(30), -1);
  cache.clear_errors();
  // After a step without request 20, the prefill takes its slot (least recently seen).
  ASSERT_EQ(drv.step({10}, {22}), 0);
  cache.prefill(0, row_c.get(), 0, 20, k.get(), v.get(), nullptr);
  EXPECT_EQ(cache.error_flags(), 0);
  EXPECT_EQ(cache.slot_of(30), 1);
}

TEST(ControlKernel, MoreRequestsThanSlotsRaisesFlagAndTouchesNothing) {
  SKIP_WITHOUT_GPU();
  KvCache cache(small_config(4, 8), parse_recipe("nvfp4"));
  StepDriver drv{cache, 4};
  ASSERT_EQ(drv.step({0, 10, 20, 30}, {128, 20, 20, 20}), 0);
  ASSERT_EQ(drv.step({0, 10, 20, 30}, {129, 21, 21, 21}), 0);
  const auto plan = cache.read_plan();
  std::vector<SlotRows> slots;
  std::vector<std::vector<uint8_t>> pages;
  for (int s = 0; s < 4; ++s) slots.push_back(cache.read_slot(0, s, 0));
  for (int b = 0; b < 64; ++b) pages.push_back(cache.read_page(0, b, 0));
  const long long steps = cache.step_counter();

  // Five requests, four slots; row 0's token would fill its page (promotion) too.
  EXPECT_EQ(drv.step({0, 10, 20, 30, 40}, {256, 22, 22, 22, 20}), kErrorSlotsExhausted);
  for (int s = 0; s < 4; ++s) {
    const SlotRows now = cache.read_slot(0, s, 0);
    EXPECT_EQ(now.k, slots[s].k) << "slot " << s;
    EXPECT_EQ(now.v, slots[s].v) << "slot " << s;
  }
  for (int b = 0; b < 64; ++b) EXPECT_EQ(cache.read_page(0, b, 0), pages[b]) << "block " << b;
  const auto after = cache.read_plan();
  EXPECT_EQ(after.row_slot, plan.row_slot);
  EXPECT_EQ(after.row_splits, plan.row_splits);
  EXPECT_EQ(after.row_promote_block, plan.row_promote_block);
  EXPECT_EQ(after.num_rows, plan.num_rows);
  EXPECT_EQ(cache.step_counter(), steps);
  EXPECT_EQ(cache.slot_of(40), -1);
  for (int id : {0, 10, 20, 30}) EXPECT_GE(cache.slot_of(id), 0);

  // The flag is sticky: the next valid step is skipped too, until the host clears it.
  EXPECT_EQ(drv.step({0}, {130}), kErrorSlotsExhausted);
  EXPECT_EQ(cache.step_counter(), steps);
  cache.clear_errors();
  EXPECT_EQ(drv.step({0}, {130}), 0);
  EXPECT_EQ(cache.step_counter(), steps + 1);
}

TEST(ControlKernel, BadStepsRaiseFlags) {
  SKIP_WITHOUT_GPU();
  KvCache cache(small_config(4, 8), parse_recipe("nvfp4"));
  StepDriver drv{cache, 4};
  EXPECT_EQ(drv.step({10, 10}), kErrorDuplicateRequest);
  cache.clear_errors();
  EXPECT_EQ(drv.step({10, 20}), 0);
  EXPECT_EQ(drv.step({10, 10}), kErrorDuplicateRequest);  // both found in the table
  cache.clear_errors();
  EXPECT_EQ(drv.step({10}, {0}), kErrorBadSequence);
  cache.clear_errors();
  EXPECT_EQ(drv.step({10}, {4 * 128 + 1}), kErrorBadSequence);  // more pages than the table holds
  cache.clear_errors();
  EXPECT_EQ(drv.step({62}, {300}), kErrorBadSequence);  // page 2 would be block 64 (out of range)
  cache.clear_errors();
  EXPECT_EQ(drv.step({62}, {200}), 0);  // blocks 62, 63
}

TEST(ControlKernel, SplitPlanPagesAndPromotions) {
  SKIP_WITHOUT_GPU();
  for (const char* spec : {"nvfp4", "nvfp4:no-recent", "bf16", "fp8"}) {
    const Recipe recipe = parse_recipe(spec);
    const int heads = 8, max_pages = 64, batch = 64;
    KvCache cache(small_config(batch, batch, heads, 1024, max_pages), recipe);
    StepDriver drv{cache, max_pages};
    const int sms = cache.num_sms();
    // One long row: splits fill the GPU.
    ASSERT_EQ(drv.step({0}, {40 * 128 + 5}), 0) << spec;
    auto plan = cache.read_plan();
    const bool quantized = recipe.kv != KvFormat::bf16;
    const int pages0 = quantized ? decode_layout(40 * 128 + 5, true, recipe.bf16_sink, recipe.bf16_recent).quant_pages : 41;
    EXPECT_EQ(plan.row_pages[0], pages0) << spec;
    EXPECT_GT(plan.row_splits[0], 1) << spec;
    EXPECT_LE(plan.row_splits[0], 16) << spec;
    EXPECT_GE(plan.row_splits[0] * plan.row_pages_per_split[0], pages0) << spec;
    EXPECT_LT((plan.row_splits[0] - 1) * plan.row_pages_per_split[0], pages0) << spec;
    EXPECT_EQ(plan.row_promote_block[0], -1) << spec;

    // Many rows (batch * heads >= 2 * SMs): one split per row; lengths around page ends.
    std::vector<int> ids, lens;
    for (int r = 0; r < batch; ++r) {
      ids.push_back(r * 8);
      lens.push_back(r % 4 == 0 ? 128 * (1 + r % 3) : 1 + 37 * r);
    }
    ASSERT_EQ(drv.step(ids, lens), 0) << spec;
    plan = cache.read_plan();
    EXPECT_EQ(plan.num_rows, batch);
    ASSERT_GE(batch * heads, 2 * sms) << "test assumes a GPU with at most 256 SMs";
    for (int r = 0; r < batch; ++r) {
      const int n = lens[r];
      const int pages = quantized ? decode_layout(n, true, recipe.bf16_sink, recipe.bf16_recent).quant_pages : (n + 127) / 128;
      EXPECT_EQ(plan.row_pages[r], pages) << spec << " row " << r;
      EXPECT_EQ(plan.row_splits[r], pages > 0 ? 1 : 0) << spec << " row " << r;
      if (pages > 0) {
        EXPECT_EQ(plan.row_pages_per_split[r], pages);
      }
      const bool promote = quantized && recipe.bf16_recent && n % 128 == 0;
      EXPECT_EQ(plan.row_promote_block[r], promote ? ids[r] + n / 128 - 1 : -1) << spec << " row " << r;
      EXPECT_EQ(plan.row_slot[r], cache.slot_of(ids[r]));
    }
  }
}

// A batch-1 row long enough that one wave of whole splits decides its plan: the control
// kernel plans it as the host planner does with step_split_policy (on a 132-SM GPU, 2048
// pages x 8 heads with capacity for 64 splits: 32 splits of 64 pages, leaving the 8
// sink/recent CTAs slots of their own, not 33 of 63 and a second wave).
TEST(ControlKernel, LongRowPlansOneWaveWithTheSinkRecentCtas) {
  SKIP_WITHOUT_GPU();
  for (const char* spec : {"nvfp4", "bf16"}) {
    const Recipe recipe = parse_recipe(spec);
    const int heads = 8, max_pages = 2056;
    KvCacheConfig cfg = small_config(1, 1, heads, max_pages, max_pages);
    cfg.max_splits = 64;
    KvCache cache(cfg, recipe);
    StepDriver drv{cache, max_pages};
    const int n = 2048 * 128 + 5;  // 2048 pages with the nvfp4 recipe
    ASSERT_EQ(drv.step({0}, {n}), 0) << spec;
    const auto plan = cache.read_plan();
    const int pages = attended_pages(n, recipe);
    const SplitPolicy policy =
        step_split_policy(kSplitCtasPerSm * cache.num_sms(), heads, slot_row_ctas(recipe, heads), cfg.max_splits,
                          split_floor(recipe), max_one_wave_pages(recipe), cache.balance_sms());
    const RowSplit want = plan_row_split(pages, policy);
    EXPECT_EQ(plan.row_pages[0], pages) << spec;
    EXPECT_EQ(plan.row_splits[0], want.splits) << spec;
    EXPECT_EQ(plan.row_pages_per_split[0], want.pages_per_split) << spec;
    if (cache.num_sms() == kDefaultSmCount && recipe.kv == KvFormat::nvfp4) {
      ASSERT_EQ(pages, 2048);
      EXPECT_EQ(want.splits, 32) << spec;
      EXPECT_EQ(want.pages_per_split, 64) << spec;
    }
  }
}

// Five rows of ~64K tokens x 8 KV heads: the target's 6 splits per (row, head) would be 86
// pages each, over the 64-page cap, and with the 40 sink/recent CTAs they spill over one
// wave of 2 x 132; on an H100 the control kernel plans the one-wave plan that leaves those
// CTAs their slots (5 splits of up to 128 pages), on an H200 (issue-bound) the balanced
// 40-page cut, each as the host planner does.
TEST(ControlKernel, RowsOverTheSplitCapPlanOneWaveUpTo128Pages) {
  SKIP_WITHOUT_GPU();
  const Recipe recipe = parse_recipe("nvfp4");
  const int heads = 8, rows = 5, max_pages = 528;
  KvCacheConfig cfg = small_config(rows, rows, heads, rows * max_pages, max_pages);
  KvCache cache(cfg, recipe);
  StepDriver drv{cache, max_pages};
  std::vector<int> ids, lens;
  for (int r = 0; r < rows; ++r) {
    ids.push_back(r * max_pages);
    lens.push_back(65536 + 5 + 300 * r);
  }
  ASSERT_EQ(drv.step(ids, lens), 0);
  const auto plan = cache.read_plan();
  const int head_rows = rows * heads;
  const SplitPolicy policy =
      step_split_policy(kSplitCtasPerSm * cache.num_sms(), head_rows, slot_row_ctas(recipe, head_rows), cfg.max_splits,
                        split_floor(recipe), max_one_wave_pages(recipe), cache.balance_sms());
  for (int r = 0; r < rows; ++r) {
    const int pages = attended_pages(lens[r], recipe);
    const RowSplit want = plan_row_split(pages, policy);
    EXPECT_EQ(plan.row_pages[r], pages) << r;
    EXPECT_EQ(plan.row_splits[r], want.splits) << r;
    EXPECT_EQ(plan.row_pages_per_split[r], want.pages_per_split) << r;
    if (cache.num_sms() == kDefaultSmCount && cache.balance_sms() == 0) {  // an H100
      EXPECT_EQ(want.splits, 5) << r;
      EXPECT_GT(want.pages_per_split, kMaxSplitPages) << r;
    }
    if (cache.num_sms() == kDefaultSmCount && cache.balance_sms() > 0) {  // an H200: 40-page cuts (split_plan.h)
      EXPECT_EQ(want.pages_per_split, 40) << r;
    }
  }
}

// ---- CUDA graph ---------------------------------------------------------------------------

TEST(CacheGraph, CapturedStepReplaysLikeEagerLaunches) {
  SKIP_WITHOUT_GPU();
  for (const char* spec : {"nvfp4", "mxfp4-vanilla:no-recent"}) {
    KvCacheConfig cfg = small_config(4, 3, 2, 16, 4);
    cfg.layers = 3;
    cfg.head_dim = 128;
    const Recipe recipe = parse_recipe(spec);
    const auto mu = random_tokens(cfg.layers, cfg.kv_heads, cfg.head_dim, 5);
    KvCache eager(cfg, recipe, mu.data()), graphed(cfg, recipe, mu.data());
    const int B = 3, steps = 40, max_pages = 4, H = cfg.kv_heads, d = cfg.head_dim;
    const std::vector<int> prefix = {100, 1, 120};
    std::vector<int32_t> bt = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11};
    DeviceBuffer<int32_t> dbt(bt), dsl(B);
    std::vector<std::unique_ptr<DeviceBuffer<float>>> k, v;
    for (int l = 0; l < cfg.layers; ++l) {
      k.push_back(std::make_unique<DeviceBuffer<float>>(size_t(B) * H * d));
      v.push_back(std::make_unique<DeviceBuffer<float>>(size_t(B) * H * d));
    }
    for (KvCache* c : {&eager, &graphed})
      for (int r = 0; r < B; ++r)
        for (int l = 0; l < cfg.layers; ++l) {
          DeviceBuffer<float> pk(random_tokens(prefix[r], H, d, 100 * r + l)), pv(random_tokens(prefix[r], H, d, 100 * r + l + 50));
          c->prefill(l, dbt.get() + r * max_pages, 0, prefix[r], pk.get(), pv.get(), nullptr);
          FP4KV_CUDA_OK(cudaDeviceSynchronize());
        }
    cudaStream_t s;
    FP4KV_CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    auto enqueue = [&](KvCache& c) {
      c.begin_step(dbt.get(), dsl.get(), B, max_pages, s);
      for (int l = 0; l < cfg.layers; ++l) c.append(l, k[l]->get(), v[l]->get(), s);
      c.end_step(s);
    };
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    FP4KV_CUDA_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    enqueue(graphed);
    FP4KV_CUDA_OK(cudaStreamEndCapture(s, &graph));
    FP4KV_CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
    std::vector<int32_t> lens(prefix.begin(), prefix.end());
    for (int step = 0; step < steps; ++step) {
      for (int& n : lens) ++n;
      // Refill the same buffers, then run the step eagerly on one cache and by graph on the other.
      FP4KV_CUDA_OK(cudaMemcpyAsync(dsl.get(), lens.data(), B * sizeof(int32_t), cudaMemcpyHostToDevice, s));
      std::vector<std::vector<float>> hk, hv;
      for (int l = 0; l < cfg.layers; ++l) {
        hk.push_back(random_tokens(B, H, d, 7000 + step * 10 + l));
        hv.push_back(random_tokens(B, H, d, 9000 + step * 10 + l));
        if (step == 17 && l == 1) hk.back()[5] = std::numeric_limits<float>::infinity();
        FP4KV_CUDA_OK(cudaMemcpyAsync(k[l]->get(), hk[l].data(), hk[l].size() * 4, cudaMemcpyHostToDevice, s));
        FP4KV_CUDA_OK(cudaMemcpyAsync(v[l]->get(), hv[l].data(), hv[l].size() * 4, cudaMemcpyHostToDevice, s));
      }
      enqueue(eager);
      FP4KV_CUDA_OK(cudaGraphLaunch(exec, s));
      FP4KV_CUDA_OK(cudaStreamSynchronize(s));
    }
    EXPECT_EQ(eager.error_flags(), 0);
    EXPECT_EQ(graphed.error_flags(), 0);
    EXPECT_EQ(eager.step_counter(), steps);
    EXPECT_EQ(graphed.step_counter(), steps);
    EXPECT_EQ(eager.nonfinite_count(), graphed.nonfinite_count());
    EXPECT_GT(graphed.nonfinite_count(), 0u);
    for (int l = 0; l < cfg.layers; ++l)
      for (int b = 0; b < cfg.num_blocks; ++b)
        for (int h = 0; h < H; ++h) ASSERT_EQ(eager.read_page(l, b, h), graphed.read_page(l, b, h)) << spec << " block " << b;
    for (int l = 0; l < cfg.layers; ++l)
      for (int sl = 0; sl < cfg.max_slots; ++sl)
        for (int h = 0; h < H; ++h) {
          const SlotRows a = eager.read_slot(l, sl, h), b = graphed.read_slot(l, sl, h);
          ASSERT_EQ(a.k, b.k) << spec;
          ASSERT_EQ(a.v, b.v) << spec;
        }
    const auto pa = eager.read_plan(), pb = graphed.read_plan();
    EXPECT_EQ(pa.row_slot, pb.row_slot);
    EXPECT_EQ(pa.row_splits, pb.row_splits);
    EXPECT_EQ(pa.row_pages_per_split, pb.row_pages_per_split);
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    cudaStreamDestroy(s);
  }
}

}  // namespace
}  // namespace fp4kv::cache::test
