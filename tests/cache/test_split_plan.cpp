// The one split planner (cache/split_plan.h), on the CPU: the invariants of every row's
// plan over many shapes, agreement with the planner the decode benchmark's numbers were
// measured with (written out here independently: a loop that raises the split size until
// the row fits the capacity), and the attended-pages formula.
#include <gtest/gtest.h>

#include <algorithm>

#include "fp4kv/cache/split_plan.h"
#include "fp4kv/cache/step_plan.h"

namespace fp4kv::cache::test {
namespace {

// The benchmark's original host planner with the split-size cap, kept as the specification
// of plan_row_split, and the one-wave exception: a split over max_pages takes the one-wave
// plan's size (one_wave_ctas / head_rows splits, at least 2) when that is at most
// max_one_wave pages, else max_pages.
int measured_pages_per_split(int pages, int head_rows, int max_splits, int target_ctas, int min_pages, int max_pages,
                             int one_wave_ctas, int max_one_wave) {
  const int rows = std::max(1, head_rows);
  int want = std::max(1, (target_ctas + rows - 1) / rows);
  want = std::min({want, max_splits, pages});
  int even = (pages + want - 1) / want;
  if (even > max_pages) {
    const int s = std::min({one_wave_ctas / rows, max_splits, pages});
    const int one_wave = s >= 2 ? (pages + s - 1) / s : 0;
    even = one_wave > 0 && one_wave <= max_one_wave ? one_wave : max_pages;
  }
  int pps = std::max(even, std::min(min_pages, pages));
  while ((pages + pps - 1) / pps > max_splits) ++pps;
  return pps;
}

TEST(SplitPlan, RowsWithoutPagesHaveNoSplits) {
  SplitPolicy p;
  p.max_splits = 8;
  p.target_ctas = 264;
  const RowSplit s = plan_row_split(0, p);
  EXPECT_EQ(s.splits, 0);
  EXPECT_EQ(s.pages_per_split, 0);
}

TEST(SplitPlan, InvariantsAndTheMeasuredPlannerOverManyShapes) {
  for (int pages : {1, 2, 3, 7, 8, 9, 31, 40, 41, 100, 257, 1024, 2048})
    for (int head_rows : {1, 4, 8, 32, 256, 512, 2048})
      for (int max_splits : {1, 2, 7, 16, 128})
        for (int target : {1, 132, 264, 1000})
          for (int floor_pages : {1, 2, 4, 8})
            for (int single_page_rows : {0, 8, 64})
              for (int max_pages : {3, 64, 1 << 20})
                for (int one_wave : {0, 2, 3})  // one-wave splits per (row, head), 0: none
                  for (int forced : {0, 1, 5}) {
                    SplitPolicy p;
                    p.head_rows = head_rows;
                    p.max_splits = max_splits;
                    p.target_ctas = target;
                    p.split_floor = {floor_pages, single_page_rows};
                    p.max_pages = max_pages;
                    p.one_wave_ctas = one_wave * head_rows;
                    p.forced_pages_per_split = forced;
                    const RowSplit s = plan_row_split(pages, p);
                    const int min_pages = pages <= single_page_rows ? 1 : floor_pages;
                    // 1..max_splits splits, every page covered, none empty; the specification's
                    // size; unforced, a cap holds unless min_pages or the capacity asks for more.
                    const int want =
                        forced > 0 ? std::max(forced, (pages + max_splits - 1) / max_splits)
                                   : measured_pages_per_split(pages, head_rows, max_splits, target, min_pages, max_pages,
                                                              p.one_wave_ctas, p.max_one_wave_pages);
                    const int cap = std::max({max_pages, one_wave > 0 ? kMaxOneWavePages : 0,
                                              std::min(min_pages, pages), (pages + max_splits - 1) / max_splits});
                    const bool ok = s.splits >= 1 && s.splits <= max_splits && s.splits * s.pages_per_split >= pages &&
                                    (s.splits - 1) * s.pages_per_split < pages && s.pages_per_split == want &&
                                    (forced > 0 || s.pages_per_split <= cap);
                    if (!ok)  // one check per case: a SCOPED_TRACE here would format ~10^6 messages
                      FAIL() << "pages " << pages << " head_rows " << head_rows << " max_splits " << max_splits
                             << " target " << target << " floor " << floor_pages << " single-page rows "
                             << single_page_rows << " max " << max_pages << " one-wave splits " << one_wave
                             << " forced " << forced << ": " << s.splits << " splits of " << s.pages_per_split
                             << " pages, expected " << want << " pages";
                  }
}

TEST(SplitPlan, TargetIsOneWaveOfWholeSplitsWithSlotsForTheSinkRecentCtas) {
  // 2 CTAs on each of 132 SMs.
  EXPECT_EQ(split_target_ctas(264, 8, 0), 264);   // 33 splits per (row, head)
  EXPECT_EQ(split_target_ctas(264, 8, 8), 256);   // 32: the 8 sink/recent CTAs fit beside them
  EXPECT_EQ(split_target_ctas(264, 64, 64), 256);  // 4 per row: fewer than 8, no slots given up
  EXPECT_EQ(split_target_ctas(264, 96, 96), 192);  // whole splits: 2 per row, not 2.75
  EXPECT_EQ(split_target_ctas(264, 512, 512), 512);  // at least one split per row
  EXPECT_EQ(split_target_ctas(264, 0, 0), 264);
  // The batch-1 rows of 262144 tokens (Qwen3-4B: 8 KV heads): 32 splits of 64 pages.
  SplitPolicy p;
  p.head_rows = 8;
  p.max_splits = 128;
  p.split_floor = {8, 0};
  p.target_ctas = split_target_ctas(kSplitCtasPerSm * kDefaultSmCount, 8, 8);
  const RowSplit s = plan_row_split(2048, p);
  EXPECT_EQ(s.splits, 32);
  EXPECT_EQ(s.pages_per_split, 64);
  EXPECT_EQ(slot_row_ctas(KvFormat::nvfp4, true, true, 8), 8);
  EXPECT_EQ(slot_row_ctas(KvFormat::fp8, false, true, 8), 8);
  EXPECT_EQ(slot_row_ctas(KvFormat::nvfp4, false, false, 8), 0);
  EXPECT_EQ(slot_row_ctas(KvFormat::bf16, true, true, 8), 0);
  EXPECT_FALSE(has_slot_rows(KvFormat::fp32, true, true));  // the CPU oracle: no GPU cache
  EXPECT_TRUE(has_slot_rows(KvFormat::mxfp4, true, false));
}

TEST(SplitPlan, OneWaveOfSplitsUpTo128PagesBesideTheSinkRecentCtas) {
  // 2 CTAs on each of 132 SMs, the FP4 split floor, one sink/recent CTA per (row, KV head):
  // the cases of docs/PERF.md, "One wave of splits up to 128 pages".
  auto split_of = [](int batch, int kv_heads, int pages) {
    const int head_rows = batch * kv_heads;
    const SplitPolicy p =
        step_split_policy(kSplitCtasPerSm * kDefaultSmCount, head_rows, head_rows, 128, {4, 0}, kMaxOneWavePages);
    return plan_row_split(pages, p);
  };
  // Qwen3-4B (8 KV heads), 64K tokens (511 attended pages).
  EXPECT_EQ(split_of(3, 8, 511).splits, 10);  // 52 pages: the target's one wave, under 64
  EXPECT_EQ(split_of(4, 8, 511).splits, 7);   // 73 pages: 7 x 32 + 32 = 256 CTAs, not 8 x 32 + 32
  EXPECT_EQ(split_of(4, 8, 511).pages_per_split, 73);
  EXPECT_EQ(split_of(5, 8, 511).splits, 5);  // 103 pages: 5 x 40 + 40 = 240 (the target's 6 x 40 + 40 spill)
  EXPECT_EQ(split_of(6, 8, 511).splits, 4);  // 128 pages
  EXPECT_EQ(split_of(6, 8, 511).pages_per_split, kMaxOneWavePages);
  EXPECT_EQ(split_of(8, 8, 511).splits, 8);  // one wave would be 3 of 171 pages: splits of 64
  EXPECT_EQ(split_of(8, 8, 511).pages_per_split, kMaxSplitPages);
  // 32K tokens (255 pages): batch 12 has room for one split beside the sink/recent CTAs only.
  EXPECT_EQ(split_of(10, 8, 255).splits, 2);
  EXPECT_EQ(split_of(12, 8, 255).splits, 4);
  EXPECT_EQ(split_of(12, 8, 255).pages_per_split, kMaxSplitPages);
  // Qwen3-30B-A3B (4 KV heads) at 128K tokens (1023 pages): batch 5, 12 splits of 86.
  EXPECT_EQ(split_of(5, 4, 1023).splits, 12);
  EXPECT_EQ(split_of(64, 8, 511).splits, 8);  // one split per (row, head) is no one-wave plan
  EXPECT_EQ(one_wave_split_ctas(264, 64, 64), 192);
  EXPECT_EQ(one_wave_split_ctas(264, 96, 96), 0);
  EXPECT_EQ(one_wave_split_ctas(264, 200, 0), 0);
  // The native kernels keep the 64-page cut: batch 5 of 64K tokens, 8 splits.
  EXPECT_EQ(max_one_wave_pages(parse_recipe("nvfp4")), kMaxOneWavePages);
  EXPECT_EQ(max_one_wave_pages(parse_recipe("bf16")), kMaxOneWavePages);
  const Recipe native = parse_recipe("nvfp4-native");
  EXPECT_EQ(max_one_wave_pages(native), 0);
  const SplitPolicy p = step_split_policy(kSplitCtasPerSm * kDefaultSmCount, 40, 40, 128, split_floor(native),
                                          max_one_wave_pages(native));
  EXPECT_EQ(plan_row_split(511, p).splits, 8);
  EXPECT_EQ(plan_row_split(511, p).pages_per_split, kMaxSplitPages);
}

// An issue-bound card (an H100 at 96 SMs, the H200): long rows take the split size with the
// least ceil(split CTAs / SMs) x pages, the cases of docs/PERF.md, "Split sizes on an H200-like
// card".
TEST(SplitPlan, BalancedSplitsWhereThePageLoopIsIssueBound) {
  constexpr int kSms = 96;
  auto split_of = [](int head_rows, int pages, int balance_sms) {
    const SplitPolicy p = step_split_policy(kSplitCtasPerSm * kSms, head_rows, head_rows, 128, {4, 0},
                                            kMaxOneWavePages, balance_sms);
    return plan_row_split(pages, p);
  };
  // 64 head rows at 32K: not the one wave of 2 x 128 (a third of the SMs hold two), 64 pages.
  EXPECT_EQ(split_of(64, 255, 0).splits, 2);
  EXPECT_EQ(split_of(64, 255, kSms).splits, 4);
  EXPECT_EQ(split_of(64, 255, kSms).pages_per_split, 64);
  // 32 head rows at 128K: 32 pages (11 x 32 page-times against 6 x 64).
  EXPECT_EQ(split_of(32, 1023, kSms).pages_per_split, 32);
  EXPECT_EQ(split_of(32, 1023, 0).pages_per_split, 64);
  // 16 head rows at 128K: the one wave of 11 x 93 stands (2 x 93 against 3 x 64).
  EXPECT_EQ(split_of(16, 1023, kSms).splits, 11);
  EXPECT_EQ(split_of(16, 1023, kSms).pages_per_split, 93);
  // 128 head rows at 32K: 32 pages; 96 head rows: a tie, the larger split.
  EXPECT_EQ(split_of(128, 255, kSms).pages_per_split, 32);
  EXPECT_EQ(split_of(96, 255, kSms).pages_per_split, 64);
  // Rows the target already cuts under 64 pages are untouched.
  EXPECT_EQ(split_of(8, 1023, kSms).pages_per_split, split_of(8, 1023, 0).pages_per_split);
  EXPECT_EQ(issue_bound_time(128, kSms, 128), 256);
  EXPECT_EQ(issue_bound_time(256, kSms, 64), 192);
  // Which kernels on which cards: the mixed FP4 kernels where an SM has 30 GB/s or more.
  EXPECT_EQ(issue_bound_sms(parse_recipe("nvfp4"), 96, 3190), 96);    // an H100 at 96 SMs
  EXPECT_EQ(issue_bound_sms(parse_recipe("mxfp4"), 132, 4800), 132);  // an H200
  EXPECT_EQ(issue_bound_sms(parse_recipe("nvfp4"), 132, 3350), 0);    // an H100
  EXPECT_EQ(issue_bound_sms(parse_recipe("bf16"), 96, 3190), 0);
  EXPECT_EQ(issue_bound_sms(parse_recipe("fp8"), 96, 3190), 0);
  EXPECT_EQ(issue_bound_sms(parse_recipe("nvfp4-native"), 96, 3190), 0);
  // Invariants hold with balancing on, over many shapes.
  for (int head_rows = 1; head_rows <= 300; head_rows += 7)
    for (int pages = 1; pages <= 2100; pages += 37) {
      const RowSplit r = split_of(head_rows, pages, kSms);
      ASSERT_GE(r.splits, 1);
      ASSERT_LE(r.splits, 128);
      ASSERT_LT((r.splits - 1) * r.pages_per_split, pages);
      ASSERT_GE(r.splits * r.pages_per_split, pages);
    }
}

TEST(SplitPlan, TargetInvariantsOverManyShapes) {
  for (int resident : {1, 132, 264, 396, 528})
    for (int rows = 1; rows <= 600; rows += rows < 40 ? 1 : 7)
      for (bool side : {false, true}) {
        const int side_ctas = side ? rows : 0;
        const int t = split_target_ctas(resident, rows, side_ctas);
        const int s = t / rows;
        SCOPED_TRACE(::testing::Message() << "resident " << resident << " rows " << rows << " side " << side_ctas);
        ASSERT_EQ(t % rows, 0);  // whole splits per (row, head)
        ASSERT_GE(s, 1);
        if (s > 1) {
          ASSERT_LE(t, resident);  // one wave unless a row needs its one split
        }
        const int whole = resident / rows;  // splits per (row, head) that fill one wave
        if (whole >= kReserveFromSplits) {
          // Many splits: the side CTAs (one per row and head) get slots, for one split at most.
          ASSERT_LE(t + side_ctas, resident);
          ASSERT_GE(s, whole - 1);
        } else {
          ASSERT_EQ(s, std::max(1, whole));  // few splits: none given up
        }
      }
}

TEST(SplitPlan, FullGpuMeansOneSplitPerRowUpToTheCap) {
  SplitPolicy p;
  p.head_rows = 512;  // 64 rows x 8 KV heads >= 2 x 132 SMs
  p.max_splits = 16;
  p.target_ctas = kSplitCtasPerSm * kDefaultSmCount;
  p.split_floor = {8, 0};
  for (int pages : {1, 5, 40, kMaxSplitPages}) {
    const RowSplit s = plan_row_split(pages, p);
    EXPECT_EQ(s.splits, 1) << pages;
    EXPECT_EQ(s.pages_per_split, pages) << pages;
  }
  // Longer rows: splits of kMaxSplitPages, until max_splits needs longer ones.
  EXPECT_EQ(plan_row_split(300, p).splits, 5);
  EXPECT_EQ(plan_row_split(300, p).pages_per_split, kMaxSplitPages);
  EXPECT_EQ(plan_row_split(4000, p).splits, 16);
  EXPECT_EQ(plan_row_split(4000, p).pages_per_split, 250);
}

TEST(SplitPlan, EachRecipesFloor) {
  const SplitFloor native = split_floor(parse_recipe("nvfp4-native"));
  EXPECT_EQ(native.for_row(1), 1);
  EXPECT_EQ(native.for_row(32), 1);  // 4K tokens: single pages
  EXPECT_EQ(native.for_row(33), 2);
  EXPECT_EQ(split_floor(parse_recipe("mxfp4-native")).for_row(32), 1);
  for (const char* mixed : {"nvfp4", "mxfp4", "fp8"}) {
    EXPECT_EQ(split_floor(parse_recipe(mixed)).for_row(1), 4) << mixed;
    EXPECT_EQ(split_floor(parse_recipe(mixed)).for_row(1000), 4) << mixed;
  }
  EXPECT_EQ(split_floor(parse_recipe("bf16")).for_row(16), 2);
  // Qwen3-30B-A3B at batch 1 (4 KV heads, a one-wave target of 65 splits per head): a native
  // row of 63 pages (8K tokens) in 32 splits of 2 pages, one of 31 pages (4K) in 31 single pages.
  SplitPolicy p;
  p.head_rows = 4;
  p.max_splits = 128;
  p.target_ctas = split_target_ctas(kSplitCtasPerSm * kDefaultSmCount, 4, 4);
  p.split_floor = native;
  EXPECT_EQ(plan_row_split(63, p).splits, 32);
  EXPECT_EQ(plan_row_split(63, p).pages_per_split, 2);
  EXPECT_EQ(plan_row_split(31, p).splits, 31);
  EXPECT_EQ(plan_row_split(31, p).pages_per_split, 1);
}

TEST(SplitPlan, AttendedPages) {
  EXPECT_EQ(attended_pages(0, KvFormat::nvfp4, true, true), 0);
  EXPECT_EQ(attended_pages(-3, KvFormat::bf16, false, false), 0);
  // BF16 caches attend every page, the last one partial.
  EXPECT_EQ(attended_pages(1, KvFormat::bf16, true, true), 1);
  EXPECT_EQ(attended_pages(128, KvFormat::bf16, true, true), 1);
  EXPECT_EQ(attended_pages(129, KvFormat::bf16, true, true), 2);
  // Quantized caches: decode_layout's quantized pages.
  for (int n : {1, 17, 128, 129, 300, 4096, 4097})
    for (bool sink : {false, true})
      for (bool recent : {false, true}) {
        EXPECT_EQ(attended_pages(n, KvFormat::nvfp4, sink, recent), decode_layout(n, true, sink, recent).quant_pages);
        EXPECT_EQ(attended_pages(n, KvFormat::fp8, sink, recent), decode_layout(n, true, sink, recent).quant_pages);
      }
  const Recipe r = parse_recipe("mxfp4-native:no-recent");
  EXPECT_EQ(attended_pages(300, r), attended_pages(300, KvFormat::mxfp4, r.bf16_sink, false));
}

}  // namespace
}  // namespace fp4kv::cache::test
