// Paged GQA decode attention over the fp4kv cache (SPEC sections 2, 4, 6; paper 4.1-4.3),
// in the plan/run shape: DecodeAttention is built once per (geometry, recipe, capacity)
// and run once per layer of every decode step.
//
// What one run computes, for a batch of requests and one layer:
//   - one CTA per (batch row, KV head, split) over the row's quantized pages (NVFP4, MXFP4,
//     FP8) or BF16 pages, transposed layout (keys are MMA rows, the G query heads - and in
//     native mode their dual-residual second terms - are MMA columns), FP32 accumulation;
//   - one extra CTA per (row, KV head) for the BF16 sink + recent tokens of the slot
//     buffer (FP32 CUDA-core math), when the recipe keeps them in BF16;
//   - a combine kernel that merges the partial (o, lse) by log-sum-exp and writes the
//     output and the LSE (natural log of the true logits q.k/sqrt(d)).
//
// Construction (host, outside any graph capture): validates the combination (fp4kv::Error
// naming the bad value, before any CUDA call), picks the kernel instance, allocates the
// workspace of partial results for the capacity, sets the kernel's shared-memory limit and
// fills every kernel argument that does not change per step.
// run (graph-safe): fills the per-step pointers and enqueues the decode and combine
// kernels. No allocation, no attribute call, no synchronization, no message built unless
// an argument is out of range (then it throws). Grids are sized by capacity
// (StepPlan::max_splits); CTAs without work exit at once, so a step is capturable in a
// CUDA graph with no host synchronization.
//
// Invariants: both kernels are programmatic dependent launches (cache/dependent_launch.cuh):
// the decode kernel waits for the op before it on the stream before reading anything, so
// its inputs may come from that op. The object owns its workspace, so runs of one object
// must be ordered (one stream, or joined by events); objects for different layers of one
// model may share the geometry but not a workspace. Queries and output are BF16 (the
// model's activations) or FP32 (the reference path and tests); the kernels read and write
// either type directly.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "fp4kv/attention/kernel_args.h"
#include "fp4kv/attention/kernel_registry.h"
#include "fp4kv/cache/layout.h"
#include "fp4kv/cache/split_plan.h"
#include "fp4kv/cache/step_plan.h"
#include "fp4kv/core/recipe.h"

namespace fp4kv::attention {

// The one "attended pages" formula lives in the cache layer (split_plan.h).
using cache::attended_pages;

// Whether the recipe reads the BF16 slot buffer (sink and/or recent rows).
inline bool uses_slot_buffer(const Recipe& r) {
  return cache::has_slot_rows(r.kv, r.bf16_sink, r.bf16_recent);
}

// The attention shape of a model layer: fixed for the life of a DecodeAttention.
struct DecodeGeometry {
  int q_heads = 0;   // kv_heads * G; query head h uses KV head h / G
  int kv_heads = 0;
  int head_dim = 0;  // 64, 128 or 256
};

// The largest step a DecodeAttention serves: sizes its workspace and bounds every run.
struct DecodeCapacity {
  int max_batch = 0;   // rows per step (<= 65535, a grid dimension)
  int max_pages = 0;   // pages per row: the row stride of every step's block table
  int max_splits = 0;  // splits per row (<= 4096); a step's plan may use fewer
};

// The paged cache of one layer, as a run reads it. All pointers are device pointers.
struct DecodeLayerView {
  KvFormat format = KvFormat::nvfp4;  // what the pool stores (must be the recipe's format)
  const uint8_t* pool = nullptr;      // cache block 0 of this layer (16-byte aligned)
  long long block_stride = 0;         // bytes between consecutive blocks (multiple of 16)
  // BF16 slot buffer of this layer: [slots][kv_heads][2 (K', V)][144][head_dim] bf16
  // (cache::slot_row_offset with layer 0). Needed when the recipe keeps BF16 sink or recent
  // tokens (uses_slot_buffer); ignored otherwise (and by the BF16 format).
  const uint16_t* slot_buffer = nullptr;
  int slots = 0;
  // mu_k the keys were smoothed with, [kv_heads][head_dim] float, or null (zero): only the
  // returned LSE uses it (softmax ignores the shift q.mu_k).
  const float* mu_k = nullptr;
};

// What changes every decode step and is the same for every layer of it.
struct DecodeStep {
  const int32_t* block_tables = nullptr;  // int32 [batch][capacity.max_pages]: each row's block ids in order
  const int32_t* seq_lens = nullptr;      // int32 [batch]: tokens each row attends to (the new one included)
  int batch = 0;                          // 1 .. capacity.max_batch
  cache::StepPlan plan;                   // from the control kernel (or a host-filled plan)
};

class DecodeAttention {
 public:
  // Validates (throws fp4kv::Error before any CUDA call), then allocates the workspace and
  // configures the kernel. Call outside graph capture.
  DecodeAttention(const DecodeGeometry& geometry, const Recipe& recipe, const DecodeCapacity& capacity);
  ~DecodeAttention();
  DecodeAttention(DecodeAttention&& other) noexcept;
  DecodeAttention& operator=(DecodeAttention&& other) noexcept;
  DecodeAttention(const DecodeAttention&) = delete;
  DecodeAttention& operator=(const DecodeAttention&) = delete;

  // The checks of the constructor alone (no CUDA call): throws fp4kv::Error for an
  // unsupported combination of format, head_dim, G and recipe, or a bad capacity.
  static void check_supported(const DecodeGeometry& geometry, const Recipe& recipe, const DecodeCapacity& capacity);

  // Runs decode attention of one layer. q: [batch][q_heads][d] post-RoPE queries, 16-byte
  // aligned (not rotated: the kernel applies the recipe's Hadamard rotation). out:
  // [batch][q_heads][d]; lse: [batch][q_heads] float32 (may be null).
  // Rows with seq_len < 1 (or >= *plan.num_rows) get output 0 and LSE -inf. While any bit
  // of *plan.error_flags is set (sticky, step_plan.h) the step is skipped: output and LSE
  // NaN. Throws fp4kv::Error if the step or the layer view is outside what the object was
  // built for (batch, plan capacity, format, strides, null pointers).
  void run(const DecodeStep& step, const DecodeLayerView& layer, const __nv_bfloat16* q, __nv_bfloat16* out,
           float* lse, cudaStream_t stream = nullptr);
  void run(const DecodeStep& step, const DecodeLayerView& layer, const float* q, float* out, float* lse,
           cudaStream_t stream = nullptr);

  // CTAs of the picked decode kernel one SM holds at once (CUDA occupancy; 0 if unknown).
  int ctas_per_sm() const { return ctas_per_sm_; }
  // Decode CTAs of this kernel a GPU of `sms` SMs holds at once (its occupancy x sms), for the
  // split planner of `fp4kv bench` (cache::step_split_policy); the control kernel plans for
  // two CTAs per SM.
  int resident_ctas(int sms) const { return std::max(1, ctas_per_sm_) * sms; }

  const DecodeGeometry& geometry() const { return geometry_; }
  const DecodeCapacity& capacity() const { return capacity_; }
  const Recipe& recipe() const { return recipe_; }
  const cache::PageLayout& layout() const { return layout_; }

 private:
  void run_typed(const DecodeStep& step, const DecodeLayerView& layer, const void* q, detail::IoType io, void* out,
                 float* lse, cudaStream_t stream);
  // The first failed check of a run (0: none), and the Error that names it.
  int step_problem(const DecodeStep& step, const DecodeLayerView& layer, const void* q, const void* out) const;
  [[noreturn]] void throw_step_problem(int problem, const DecodeStep& step, const DecodeLayerView& layer) const;
  long long min_block_stride() const { return (long long)layout_.bytes * geometry_.kv_heads; }
  void release() noexcept;

  DecodeGeometry geometry_;
  Recipe recipe_;
  DecodeCapacity capacity_;
  cache::PageLayout layout_;
  detail::DecodeKernel kernel_;
  detail::CombineLaunch combine_f32_ = nullptr;   // the combine writing FP32 output
  detail::CombineLaunch combine_bf16_ = nullptr;  // and BF16
  int ctas_per_sm_ = 0;
  float* partial_out_ = nullptr;  // [max_batch][q_heads][max_splits + 1][d]
  float* partial_lse_ = nullptr;  // [max_batch][q_heads][max_splits + 1] (base 2)
  detail::KernelArgs decode_args_{};    // the per-step fields are filled by run
  detail::CombineArgs combine_args_{};  // likewise
};

}  // namespace fp4kv::attention
