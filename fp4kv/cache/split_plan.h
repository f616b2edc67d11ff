// The split-KV planner: which pool pages a row attends to, and how a row's pages are cut
// into splits (one decode CTA per split and KV head). One definition for the host and the
// device: the control kernel (control.cu) plans every decode step with it on the GPU, the
// host-filled plans of the tests and benchmarks (fp4kv/testing/host_step_plan.h) with the
// same functions, and the decode attention's combine reads the same page count.
//
// Invariants of a RowSplit for a row of `pages` pages and capacity max_splits:
//   pages == 0  -> splits == 0, pages_per_split == 0 (no split CTA runs);
//   pages  > 0  -> 1 <= splits <= max_splits, split s covers pages
//                  [s * pages_per_split, min((s + 1) * pages_per_split, pages)), and every
//                  split has at least one page ((splits - 1) * pages_per_split < pages).
#pragma once

#include "fp4kv/core/decode_layout.h"
#include "fp4kv/core/host_device.h"
#include "fp4kv/core/recipe.h"

namespace fp4kv::cache {

// Split CTAs the planner aims for per SM when nothing better is known (the control kernel;
// the benchmark passes a measured one-wave target instead): two per SM keeps every SM busy
// while a CTA waits on its first pages.
inline constexpr int kSplitCtasPerSm = 2;
// SMs assumed by host-filled plans that are given no target (the H200 has 132).
inline constexpr int kDefaultSmCount = 132;
// Most pages a planned split takes (unless the row needs more to fit max_splits). A long
// row is cut finer than the CTA target asks: the step then runs as many short CTAs that
// the SMs pick up as others finish, instead of one or two waves of long ones whose last,
// partly filled wave leaves SMs idle. Measured on the H200 (docs/PERF.md, "Pages per
// split at long context"): at 64K context, batch 8-45, 64-page splits were the fastest or
// within 1 % of the fastest size for nvfp4 (up to 19 % faster than the CTA target's
// 256-512-page splits) and within 2 % for bf16; a CTA's fixed cost makes 16-32 pages slower.
inline constexpr int kMaxSplitPages = 64;
// ... except in a one-wave plan: where every row's splits of a step fit one wave beside the
// sink/recent CTAs (one_wave_split_ctas) with at most this many pages each, that plan
// stands instead of the kMaxSplitPages cut, whose extra CTAs spill into a second, partly
// filled wave. Measured on the H100 (docs/PERF.md, "One wave of splits up to 128 pages"):
// the kernels with 16-bit P, Qwen3-4B and Qwen3-30B-A3B at 32K-128K, batch 2-12, 7 % faster
// (geometric mean; 0.81-1.07) where the plan changes; the native kernels slower (step_plan.h
// max_one_wave_pages); a one-wave plan whose sink/recent CTAs spill (the target's, below
// kReserveFromSplits splits) up to 17 % slower, so the sink/recent CTAs keep their slots.
inline constexpr int kMaxOneWavePages = 128;
// ... and where the page loop is issue-bound (the FP4 recipes on a card with at least
// kIssueBoundGBpsPerSm of read bandwidth per SM: the H200's 36, an H100 run on 96 SMs; not
// the whole H100's 25), long rows take whichever of the one-wave plan and cuts of
// kMinBalancedSplitPages to kMaxSplitPages pages (steps of kBalancedSplitStep) finishes first
// by issue_bound_time. Measured on an H100 at 96 SMs (docs/PERF.md, "Split sizes on an
// H200-like card"): the one-wave plan of 2 x 128 pages over 64 head rows, which leaves a third
// of the SMs holding two long CTAs, 18-24 % slower than 32-64-page cuts; 64-page cuts of 2.67
// waves 4-5 % slower than 32 pages.
inline constexpr double kIssueBoundGBpsPerSm = 30.0;
inline constexpr int kMinBalancedSplitPages = 32;
inline constexpr int kBalancedSplitStep = 8;

// How a row of n tokens (n >= 1) is attended through the split CTAs: decode_layout for
// FP4/FP8 caches; for BF16 caches, which keep every token in their pool pages, every page
// (the last one partial) and no BF16 slot rows.
FP4KV_HD DecodeLayout attended_layout(int n_tokens, KvFormat format, bool bf16_sink, bool bf16_recent) {
  if (format != KvFormat::bf16) return decode_layout(n_tokens, true, bf16_sink, bf16_recent);
  DecodeLayout l;
  l.quant_pages = (n_tokens + kPageTokens - 1) / kPageTokens;
  l.last_page_tokens = n_tokens - (l.quant_pages - 1) * kPageTokens;
  return l;
}

// Pages of the pool a row with n tokens attends to through the split CTAs (StepPlan's
// row_pages); 0 for n <= 0.
FP4KV_HD int attended_pages(int n_tokens, KvFormat format, bool bf16_sink, bool bf16_recent) {
  if (n_tokens <= 0) return 0;
  return attended_layout(n_tokens, format, bf16_sink, bf16_recent).quant_pages;
}
inline int attended_pages(int n_tokens, const Recipe& r) {
  return attended_pages(n_tokens, r.kv, r.bf16_sink, r.bf16_recent);
}

// Fewest pages a split covers (step_plan.h split_floor has each recipe's): `pages`, but
// rows of at most `single_page_rows` pages may be cut into single pages.
struct SplitFloor {
  int pages = 1;
  int single_page_rows = 0;
  FP4KV_HD int for_row(int row_pages) const { return row_pages <= single_page_rows ? 1 : pages; }
};

// What the planner needs to know about the whole step.
struct SplitPolicy {
  int head_rows = 1;    // rows with at least one page, times KV heads: the CTAs of one split each
  int max_splits = 1;   // capacity of splits per row (StepPlan::max_splits)
  int target_ctas = 1;  // split CTAs wanted over the whole step
  SplitFloor split_floor;  // fewest pages per split, by the row's pages
  int max_pages = kMaxSplitPages;  // most pages per split the planner chooses (the floor wins)
  int one_wave_ctas = 0;           // split CTAs of the one-wave plan (one_wave_split_ctas; 0: none)
  int max_one_wave_pages = kMaxOneWavePages;  // its most pages per split (the floor wins)
  int forced_pages_per_split = 0;  // > 0: this split size (still capped by max_splits)
  int balance_sms = 0;  // > 0: an issue-bound kernel on this many SMs (balanced_split_pages)
};

// Whether a cache keeps BF16 sink/recent rows in slots, which a decode step attends through
// a CTA of their own per (row, KV head): the quantized GPU formats with either switch on.
FP4KV_HD bool has_slot_rows(KvFormat format, bool bf16_sink, bool bf16_recent) {
  const bool quantized = format == KvFormat::fp8 || format == KvFormat::nvfp4 || format == KvFormat::mxfp4;
  return quantized && (bf16_sink || bf16_recent);
}

// CTAs of a decode grid besides its splits: the sink/recent CTA of each (row, KV head).
FP4KV_HD int slot_row_ctas(KvFormat format, bool bf16_sink, bool bf16_recent, int head_rows) {
  return has_slot_rows(format, bf16_sink, bf16_recent) ? head_rows : 0;
}
inline int slot_row_ctas(const Recipe& r, int head_rows) {
  return slot_row_ctas(r.kv, r.bf16_sink, r.bf16_recent, head_rows);
}

// Split CTAs to aim for over a step whose grid holds `resident_ctas` CTAs at once: as many
// whole splits per (row, KV head) as fit in one wave, so no split CTA is left for a second
// wave; `side_ctas` other CTAs of the same grid (the BF16 sink/recent CTAs, one per row and
// KV head: short) get slots of their own only when that costs at most one split in
// kReserveFromSplits. Rounding up instead overfills the wave with long split CTAs: 8 rows x
// 8 KV heads of 32K tokens in 264 slots were 5 splits of 52 pages (320 split CTAs + 64
// sink/recent), where 4 of 64 (256 + 64) are 7 % faster (docs/PERF.md).
inline constexpr int kReserveFromSplits = 8;
FP4KV_HD int split_target_ctas(int resident_ctas, int head_rows, int side_ctas) {
  const int rows = head_rows > 1 ? head_rows : 1;
  int s = resident_ctas / rows;
  if (s >= kReserveFromSplits && s * rows + side_ctas > resident_ctas) s = (resident_ctas - side_ctas) / rows;
  return (s > 1 ? s : 1) * rows;
}

// Split CTAs of a one-wave plan: as many whole splits per (row, KV head) as fit in one wave
// beside all `side_ctas`, when that is two or more (else 0: no such plan).
FP4KV_HD int one_wave_split_ctas(int resident_ctas, int head_rows, int side_ctas) {
  const int rows = head_rows > 1 ? head_rows : 1;
  const int s = (resident_ctas - side_ctas) / rows;
  return s >= 2 ? s * rows : 0;
}

// The policy of a decode step over `head_rows` (rows with pages x KV heads) on a GPU that
// holds `resident_ctas` decode CTAs at once, `side_ctas` of them the sink/recent CTAs, for a
// kernel with the split floor `floor` and one-wave splits of at most `max_one_wave_pages`
// (step_plan.h has each recipe's).
FP4KV_HD SplitPolicy step_split_policy(int resident_ctas, int head_rows, int side_ctas, int max_splits,
                                       SplitFloor floor, int max_one_wave_pages, int balance_sms = 0) {
  SplitPolicy p;
  p.balance_sms = balance_sms;
  p.head_rows = head_rows;
  p.max_splits = max_splits;
  p.target_ctas = split_target_ctas(resident_ctas, head_rows, side_ctas);
  p.one_wave_ctas = one_wave_split_ctas(resident_ctas, head_rows, side_ctas);
  p.max_one_wave_pages = max_one_wave_pages;
  p.split_floor = floor;
  return p;
}

struct RowSplit {
  int splits = 0;
  int pages_per_split = 0;
};

FP4KV_HD int ceil_div_pages(int a, int b) { return (a + b - 1) / b; }

// Splits of a row of `pages` pages when `ctas` split CTAs are spread over the policy's head
// rows: ceil(ctas / head_rows), at least 1, at most max_splits and the row's pages.
FP4KV_HD int splits_for_ctas(int ctas, int pages, const SplitPolicy& p) {
  const int head_rows = p.head_rows > 1 ? p.head_rows : 1;
  int s = ceil_div_pages(ctas > 1 ? ctas : 1, head_rows);
  s = s < p.max_splits ? s : p.max_splits;
  s = s < pages ? s : pages;
  return s > 1 ? s : 1;
}

// The split size of the one-wave plan for a row of `pages` pages, if the policy has one
// (two or more splits) with at most max_one_wave_pages pages a split; else 0.
FP4KV_HD int one_wave_pages(int pages, const SplitPolicy& p) {
  const int s = splits_for_ctas(p.one_wave_ctas, pages, p);
  if (s < 2) return 0;
  const int even = ceil_div_pages(pages, s);
  return even <= p.max_one_wave_pages ? even : 0;
}

// The time, in pages one SM streams, of `split_ctas` CTAs of `pps` pages each on `sms` SMs
// whose page loop is issue-bound: an SM streams at about one rate whether it holds one CTA or
// two, so the SM given the most CTAs sets the time.
FP4KV_HD long long issue_bound_time(int split_ctas, int sms, int pps) {
  const int per_sm = (split_ctas + sms - 1) / sms;
  return (long long)per_sm * pps;
}

// A split size and its issue_bound_time over the step's head rows.
struct TimedSplit {
  int pages_per_split = 0;
  long long time = 0;
};

// `best`, or `pps` pages per split if its issue_bound_time over the policy's head rows (all
// assumed as long as this row) is less, or equal with a larger split (fewer CTAs, less fixed
// cost).
FP4KV_HD TimedSplit faster_split(TimedSplit best, int pages, int pps, const SplitPolicy& p) {
  const int head_rows = p.head_rows > 1 ? p.head_rows : 1;
  const long long t = issue_bound_time(ceil_div_pages(pages, pps) * head_rows, p.balance_sms, pps);
  const bool better = best.pages_per_split == 0 || t < best.time || (t == best.time && pps > best.pages_per_split);
  return better ? TimedSplit{pps, t} : best;
}

// The split size of a long row (the target's split over max_pages) under an issue-bound
// kernel (balance_sms > 0): the fastest of the cuts of kMinBalancedSplitPages..max_pages
// pages and the one-wave plan's split.
FP4KV_HD int balanced_split_pages(int pages, const SplitPolicy& p) {
  TimedSplit best;
  for (int pps = kMinBalancedSplitPages; pps < p.max_pages; pps += kBalancedSplitStep)
    best = faster_split(best, pages, pps, p);
  best = faster_split(best, pages, p.max_pages, p);
  const int one_wave = one_wave_pages(pages, p);
  if (one_wave > 0) best = faster_split(best, pages, one_wave, p);
  return best.pages_per_split;
}

// Pages per split for a row of `pages` (> 0) pages: about target_ctas split CTAs over the
// step, at most max_splits per row, at most max_pages pages per split (where more are
// needed: balanced_split_pages for an issue-bound kernel, else the one-wave plan's split if it
// has one, else max_pages), at least the floor's pages for this row (or the whole row; the
// floor wins over max_pages).
FP4KV_HD int choose_pages_per_split(int pages, const SplitPolicy& p) {
  const int want = splits_for_ctas(p.target_ctas, pages, p);
  const int min_pages = p.split_floor.for_row(pages);
  const int floor_pages = min_pages < pages ? min_pages : pages;
  int even = ceil_div_pages(pages, want);
  if (even > p.max_pages && p.balance_sms > 0) {
    even = balanced_split_pages(pages, p);
  } else if (even > p.max_pages) {
    const int one_wave = one_wave_pages(pages, p);
    even = one_wave > 0 ? one_wave : p.max_pages;
  }
  return even > floor_pages ? even : floor_pages;
}

// The splits of one row: the policy's split size (forced or chosen), raised to the smallest
// size that needs no more than max_splits splits.
FP4KV_HD RowSplit plan_row_split(int pages, const SplitPolicy& p) {
  RowSplit s;
  if (pages <= 0) return s;
  int pps = p.forced_pages_per_split > 0 ? p.forced_pages_per_split : choose_pages_per_split(pages, p);
  const int max_splits = p.max_splits > 1 ? p.max_splits : 1;
  const int capacity_floor = ceil_div_pages(pages, max_splits);
  pps = pps > capacity_floor ? pps : capacity_floor;
  s.pages_per_split = pps;
  s.splits = ceil_div_pages(pages, pps);
  return s;
}

}  // namespace fp4kv::cache
