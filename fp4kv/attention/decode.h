// Paged GQA decode attention over the fp4kv cache (SPEC sections 2, 4, 6; paper 4.1-4.3).
//
// One call runs one decode step's attention of one layer for a batch of requests:
//   - one CTA per (batch row, KV head, split) over the row's quantized pages (NVFP4, MXFP4,
//     FP8) or BF16 pages, transposed layout (keys are MMA rows, the G query heads - and in
//     native mode their dual-residual second terms - are MMA columns), FP32 accumulation;
//   - one extra CTA per (row, KV head) for the BF16 sink + recent tokens of the slot
//     buffer (FP32 CUDA-core math), when the recipe keeps them in BF16;
//   - a combine kernel that merges the partial (o, lse) by log-sum-exp and writes the
//     output and the LSE (natural log of the true logits q.k/sqrt(d)).
// Grids are sized by capacity (StepPlan::max_splits); CTAs without work exit at once, so a
// step is capturable in a CUDA graph with no host synchronization.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "fp4kv/cache/layout.h"
#include "fp4kv/cache/step_plan.h"
#include "fp4kv/core/host_device.h"
#include "fp4kv/core/decode_layout.h"
#include "fp4kv/core/recipe.h"

namespace fp4kv::attention {

// The paged cache of one layer, and the layer's attention geometry. All pointers are
// device pointers.
struct DecodeParams {
  const uint8_t* pool = nullptr;   // cache block 0 of this layer (16-byte aligned)
  long long block_stride = 0;      // bytes between consecutive blocks
  cache::PageLayout layout;        // one KV head's part of a block (layout.h)
  int kv_heads = 0;
  int q_heads = 0;                 // kv_heads * G; query head h uses KV head h / G
  int head_dim = 0;
  // BF16 slot buffer of this layer: [slots][kv_heads][2 (K', V)][144][head_dim] bf16
  // (cache::slot_row_offset with layer 0). Needed when the recipe keeps BF16 sink or recent
  // tokens (uses_slot_buffer); ignored otherwise (and by the BF16 format).
  const uint16_t* slot_buffer = nullptr;
  int slots = 0;
  // mu_k the keys were smoothed with, [kv_heads][head_dim] float, or null (zero): only the
  // returned LSE uses it (softmax ignores the shift q.mu_k).
  const float* mu_k = nullptr;
};

// Partial results of the split CTAs, sized by capacity. Allocate once per (max batch,
// geometry, max splits); reuse every step and layer.
class DecodeWorkspace {
 public:
  DecodeWorkspace(int max_batch, int q_heads, int head_dim, int max_splits);
  ~DecodeWorkspace();
  DecodeWorkspace(const DecodeWorkspace&) = delete;
  DecodeWorkspace& operator=(const DecodeWorkspace&) = delete;

  int max_batch() const { return max_batch_; }
  int q_heads() const { return q_heads_; }
  int head_dim() const { return head_dim_; }
  int max_splits() const { return max_splits_; }
  float* partial_out() const { return partial_out_; }  // [batch][q_heads][max_splits + 1][d]
  float* partial_lse() const { return partial_lse_; }  // [batch][q_heads][max_splits + 1] (base 2)

 private:
  int max_batch_, q_heads_, head_dim_, max_splits_;
  float* partial_out_ = nullptr;
  float* partial_lse_ = nullptr;
};

// Runs decode attention. q: [batch][q_heads][d] float32 post-RoPE queries, 16-byte aligned (not rotated:
// the kernel applies the recipe's Hadamard rotation). block_tables: int32 [batch][max_pages]
// block ids of each row's pages in order; seq_lens: int32 [batch] tokens each row attends
// to (the step's new token included). plan: from the control kernel (or make_host_plan).
// out: [batch][q_heads][d] float32; lse: [batch][q_heads] float32 (may be null).
// Rows with seq_len < 1 (or >= *plan.num_rows) get output 0 and LSE -inf. While any bit of
// *plan.error_flags is set (sticky, step_plan.h) the step is skipped: output and LSE NaN.
// Throws fp4kv::Error for unsupported combinations (format / head_dim / G / recipe).
void decode_attention(const DecodeParams& params, const Recipe& recipe, const float* q, const int32_t* block_tables,
                      const int32_t* seq_lens, int batch, int max_pages, const cache::StepPlan& plan,
                      DecodeWorkspace& workspace, float* out, float* lse, cudaStream_t stream = nullptr);

// Checks the combination without launching anything (the same errors decode_attention throws).
void check_supported(const DecodeParams& params, const Recipe& recipe);

// ---- Split planning ----------------------------------------------------------------------

// Pages of the pool a row with n tokens attends to through the split CTAs (StepPlan's
// row_pages): the quantized pages of decode_layout for FP4/FP8 caches; every page (the last
// one partial) for BF16 caches, which have no slot buffer.
FP4KV_HD int attended_pages(int n_tokens, KvFormat format, bool bf16_sink, bool bf16_recent) {
  if (n_tokens <= 0) return 0;
  if (format == KvFormat::bf16) return (n_tokens + kPageTokens - 1) / kPageTokens;
  return decode_layout(n_tokens, true, bf16_sink, bf16_recent).quant_pages;
}
inline int attended_pages(int n_tokens, const Recipe& r) {
  return attended_pages(n_tokens, r.kv, r.bf16_sink, r.bf16_recent);
}
// Whether the recipe reads the BF16 slot buffer (sink and/or recent rows).
inline bool uses_slot_buffer(const Recipe& r) {
  return (r.fp4() || r.kv == KvFormat::fp8) && (r.bf16_sink || r.bf16_recent);
}

// Pages per split for a row: splits the row so that about `target_ctas` CTAs run over the
// whole batch, at most max_splits per row and at least min_pages pages per split
// (cache::min_split_pages for the format).
int choose_pages_per_split(int pages, int batch, int kv_heads, int max_splits, int target_ctas, int min_pages);

// CTAs of the decode kernel that one SM holds at once for this geometry and recipe (from
// the CUDA occupancy calculator; 0 if unknown).
int decode_ctas_per_sm(const DecodeParams& params, const Recipe& recipe);
// A split target for choose_pages_per_split / HostStepPlan::fill: as many split CTAs as
// are resident at once (one wave), a whole number per (row, KV head), less the BF16
// sink/recent CTAs' slots when there are many splits per row (used by `fp4kv bench`).
int split_target_ctas(const DecodeParams& params, const Recipe& recipe, int batch, int sms);

// A StepPlan filled on the host (what the control kernel computes on the device), with
// the device arrays it points to. For tests and benchmarks.
class HostStepPlan {
 public:
  HostStepPlan(int max_batch, int max_splits);
  ~HostStepPlan();
  HostStepPlan(const HostStepPlan&) = delete;
  HostStepPlan& operator=(const HostStepPlan&) = delete;

  // pages_per_split > 0 forces a split size (capped so no row needs more than max_splits);
  // 0 chooses with choose_pages_per_split for `target_ctas` (0: two waves of 132 SMs).
  // slots[b] is the BF16 slot of row b (identity when empty). Synchronous upload.
  void fill(const std::vector<int>& seq_lens, const Recipe& recipe, int kv_heads, int pages_per_split = 0,
            const std::vector<int>& slots = {}, int target_ctas = 0);

  const cache::StepPlan& plan() const { return plan_; }
  const std::vector<int>& splits() const { return splits_; }
  const std::vector<int>& pages_per_split() const { return pps_; }
  // Split bounds of row b in pages (the ref::SplitBounds the kernel follows).
  std::vector<int> bounds(int b) const;

 private:
  cache::StepPlan plan_;
  int max_batch_;
  std::vector<int> splits_, pps_, pages_;
};

}  // namespace fp4kv::attention
