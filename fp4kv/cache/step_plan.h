// What the control kernel (once per decode step, on the device) tells the decode and
// promotion kernels. Plain device arrays of fixed capacity, allocated once, so that a
// whole step is capturable in a CUDA graph: grids are sized for the capacity and CTAs
// with no work exit at once.
#pragma once

#include <cstdint>

#include "fp4kv/cache/split_plan.h"
#include "fp4kv/core/recipe.h"

namespace fp4kv::cache {

// Fewest pages a split covers when the plan cuts a row into splits. A split CTA pays fixed
// costs (prologue, first-page latency, its partial output and the combine's read of it)
// that its pages must amortize: 4 pages in mixed FP4 and FP8 (75-150 KB at d = 128); 2 in
// BF16 (a page is 4x an FP4 one) and in native FP4, whose pages have the longer latency
// per CTA (the P quantization sits between the tile maximum and P.V). Measured on the H200
// (docs/PERF.md, "The floor on pages per split" and "The combine over splits in
// parallel"): with the sink/recent CTA and the combine off the critical path, mixed
// NVFP4/MXFP4 at 4K-16K tokens, batch 1-4, is up to 22 % faster at 4 pages than at 8
// (Qwen3-4B nvfp4 4K batch 1: 14.0 vs 17.0 us); native NVFP4 at 4K is 1.1-1.25x slower
// with 8 pages per split than with 2. Native rows of up to 32 pages (4K tokens) split into
// single pages: on an H100 (docs/PERF.md, "Single-page splits for short native rows"),
// Qwen3-30B-A3B's native presets at 4K, batch 1-2, are 4-10 % faster that way; at 6K-8K, batch
// 1, single pages (up to 63 splits a row) were 6-15 % slower than two.
inline SplitFloor split_floor(const Recipe& r) {
  constexpr int kBf16SplitPages = 2, kMixedSplitPages = 4, kNativeSplitPages = 2, kNativeSinglePageRows = 32;
  if (r.kv == KvFormat::bf16) return {kBf16SplitPages, 0};
  if (r.native()) return {kNativeSplitPages, kNativeSinglePageRows};
  return {kMixedSplitPages, 0};
}

// Most pages a split of a one-wave plan takes for the recipe's decode kernel (split_plan.h
// kMaxOneWavePages; 0: no one-wave plans). The kernels with FP4 P (native) are issue-bound
// even on the H100: one wave of long splits leaves the SMs that hold two of them behind
// those that hold one (measured 3-21 % slower than the 64-page cut), so they keep the cut.
inline int max_one_wave_pages(const Recipe& r) { return r.native() ? 0 : kMaxOneWavePages; }

// SMs to balance the split CTAs over (SplitPolicy::balance_sms) for the recipe's kernel on a
// card of `sms` SMs reading `read_gbps`: the mixed FP4 kernels, whose page loop is
// issue-bound where each SM has kIssueBoundGBpsPerSm or more; 0 (the one-wave rule) otherwise.
// The native kernels keep their own rule (no one-wave plans, the 64-page cut): not measured.
inline int issue_bound_sms(const Recipe& r, int sms, double read_gbps) {
  return r.fp4() && !r.native() && sms > 0 && read_gbps / sms >= kIssueBoundGBpsPerSm ? sms : 0;
}

// Device pointers; capacity `max_batch` rows. Row r of this step's batch:
struct StepPlan {
  int32_t* row_slot = nullptr;         // [max_batch] BF16 slot of the row's request
  int32_t* row_splits = nullptr;       // [max_batch] FP4 splits (0 when no quantized page)
  int32_t* row_pages_per_split = nullptr;  // [max_batch] split s covers pages [s*pps, min((s+1)*pps, quant_pages))
  int32_t* row_promote_block = nullptr;    // [max_batch] block to quantize the full recent page into after the
                                           // step's last layer, or -1
  int32_t* error_flags = nullptr;      // [1] bit 0: more requests than slots (the step's work is skipped)
  int32_t max_splits = 1;              // capacity of splits per row (grid dimension of the decode kernel)
  // Filled by the cache's control kernel:
  int32_t* row_pages = nullptr;        // [max_batch] pool pages the row attends (split_plan.h attended_pages)
  int32_t* num_rows = nullptr;         // [1] this step's batch; rows >= it have row_splits = 0, row_slot = -1
};
// Semantics (kv_cache.h): error_flags is sticky. The control kernel ORs in new bits and
// leaves the slot table and the plan untouched when it raises one; while any bit is set,
// every later begin_step does nothing and every kernel of a step (the cache's append and
// promotion, the decode kernels) must skip, until the host calls KvCache::clear_errors().
// Rows >= num_rows of the plan arrays (up to max_batch) are filled with "no work" each step.

// Error flag bits (read by the host after the step).
inline constexpr int32_t kErrorSlotsExhausted = 1;
inline constexpr int32_t kErrorBadSequence = 2;  // seq_len < 1 or block table entry out of range
inline constexpr int32_t kErrorDuplicateRequest = 4;  // two rows of one step share a first cache block

}  // namespace fp4kv::cache
