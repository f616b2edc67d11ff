// The GPU paged KV cache (SPEC section 5, paper section 4.3): per-layer pools of cache
// blocks in the byte layout of layout.h (NVFP4, MXFP4, FP8 or BF16 pages), the BF16 slot
// buffer of sink and recent tokens, the slot table, the step plan (step_plan.h) and the
// device-side non-finite counter and error flags.
//
// Driving it (all calls asynchronous on a stream; issue them in order on one stream, or
// order the streams yourself):
//
//   prefill: begin_prefill(block_row, first_token_pos, n_tokens), then prefill(layer, k, v)
//     for every layer. k, v: device [n_tokens][kv_heads][head_dim] float, post-RoPE, not
//     transformed. Chunked prefill: call again with the next chunk; a chunk may start and
//     end mid-page. The request's slot is found or claimed on the device by its first
//     cache block block_row[0].
//   decode step: begin_step(block_tables, seq_lens, batch, max_pages) (the control
//     kernel), then for every layer append(layer, k, v) (k, v: [batch][kv_heads][head_dim])
//     or its fused form (append_target / finish_append) followed by that layer's decode
//     attention, then end_step() (promotions). seq_lens
//     include the token appended in this step. The decode-step calls never synchronize
//     with the host and are capturable in a CUDA graph (the device pointers given to
//     begin_step and append are baked into the graph: refill the same buffers).
//   a finished request: release(first_block) frees its slot (recommended). Without it, its
//     slot is reused once it is the least recently seen slot that a new request can take.
//   between steps: nonfinite_count(), error_flags(), clear_errors() (these synchronize).
//
// What the cache stores (docs/DESIGN.md "Cache semantics"): keys as k' = H(k - mu_k) per
// the recipe (FP32, core/transform.h), values as they are. Every token is first rounded to
// BF16 (non-finite elements counted and stored as 0), and quantized pages are quantized
// from these BF16 values, on every path (prefill, re-quantization, promotion), so a
// sequence prefilled at once and one built by chunks and decode appends have the same
// bytes. Token t's BF16 copy lives in the slot's recent row t % 128 (the last 128 tokens
// are always there); with recipe.bf16_sink the first 16 tokens are also kept in the slot's
// sink rows. With recipe.bf16_recent (every preset) a page is quantized when its 128th
// token arrives (prefill) or after the step that wrote it (end_step); without it
// (`no-recent`, quantize on write) the unfinished page is quantized as it stands,
// zero-padded, at prefill and again after every append (from the recent rows). The BF16
// format writes every token straight into its BF16 pool page and has no slot buffer.
//
// Errors: bad arguments the host can see throw fp4kv::Error at the call. What only the
// device sees (block ids out of range in a block table, bad sequence lengths, more
// requests than slots, a request twice in one batch) raises a sticky bit of error_flags()
// (step_plan.h); the offending step is skipped and leaves memory untouched.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <functional>
#include <vector>

#include "fp4kv/cache/append_target.h"
#include "fp4kv/cache/kernels.h"
#include "fp4kv/cache/layout.h"
#include "fp4kv/cache/step_plan.h"
#include "fp4kv/core/recipe.h"
#include "fp4kv/ref/quant_page.h"

namespace fp4kv::cache {

struct KvCacheConfig {
  int layers = 1;
  int kv_heads = 1;
  int head_dim = 128;   // 64, 128 or 256
  int num_blocks = 0;   // cache blocks per layer (one 128-token page of all KV heads each)
  int max_slots = 0;    // running requests that can hold BF16 slots (<= 2048)
  int max_batch = 0;    // rows of a decode step (<= 2048)
  int max_pages = 0;    // pages of one request (longest sequence = 128 * max_pages)
  int max_splits = 32;  // split-KV capacity per row (StepPlan::max_splits)
  // > 0: an MLA latent cache (DeepSeek-V2/V3; pages in layout.h LatentPageLayout, slot rows
  // latent_slot_row_offset): kv_heads 1, head_dim = the latent size 512, rope_dim 64. Its "K"
  // is the latent c (cached as c' = H (c - mu_c) per the recipe, mu_k = mu_c), its "V" the
  // positional key r, stored in BF16 and never quantized. Formats bf16, nvfp4, mxfp4.
  int rope_dim = 0;
};

// One slot's BF16 rows of one (layer, KV head), as floats: rows 0..15 sink, 16..143 recent.
struct SlotRows {
  std::vector<float> k;  // [144][head_dim] transformed keys (latent caches: c')
  std::vector<float> v;  // [144][head_dim] (latent caches: r, [144][rope_dim])
};

// Where a cache's device memory comes from when the caller owns it (the PyTorch extension
// hands out tensors of its caching allocator): allocate(bytes, what) returns device memory of
// at least `bytes`, 256-byte aligned, that stays valid until the cache is destroyed, or throws.
// The cache zeroes it and never frees it.
struct DeviceMemorySource {
  std::function<void*(size_t bytes, const char* what)> allocate;
};

class KvCache {
 public:
  // mu_k: host [layers][kv_heads][head_dim] mean keys for the smoothing of the recipe, or
  // null (zero). Allocates (cudaMalloc, or `memory` when given) and zeroes all device memory
  // on the current device.
  KvCache(const KvCacheConfig& config, const Recipe& recipe, const float* mu_k = nullptr,
          const DeviceMemorySource* memory = nullptr);
  ~KvCache();
  KvCache(const KvCache&) = delete;
  KvCache& operator=(const KvCache&) = delete;

  // ---- prefill ----
  // Starts a prefill chunk of the request whose block table row is `block_row` (device,
  // at least ceil((first_token_pos + n_tokens) / 128) entries): claims its slot.
  void begin_prefill(const int32_t* block_row, int first_token_pos, int n_tokens, cudaStream_t stream);
  // Writes the chunk's K and V of one layer (device [n_tokens][kv_heads][head_dim]).
  void prefill(int layer, const float* k, const float* v, cudaStream_t stream);
  // Both at once (claims the slot again on every call: cheap, idempotent).
  void prefill(int layer, const int32_t* block_row, int first_token_pos, int n_tokens, const float* k,
               const float* v, cudaStream_t stream);

  // ---- decode step ----
  void begin_step(const int32_t* block_tables, const int32_t* seq_lens, int batch, int max_pages,
                  cudaStream_t stream);
  void append(int layer, const float* k, const float* v, cudaStream_t stream);
  // The same append done by the kernel that produces the rows (cache/append_row.cuh): that
  // kernel writes every row of the step through append_target(layer), then the caller
  // enqueues finish_append(layer). Together they equal append(layer, k, v) bit for bit.
  AppendTarget append_target(int layer) const;
  void finish_append(int layer, cudaStream_t stream);
  void end_step(cudaStream_t stream);

  // Frees the slot of the request whose first cache block is `first_block` (asynchronous).
  void release(int32_t first_block, cudaStream_t stream);

  // ---- host queries (synchronize the device) ----
  unsigned long long nonfinite_count() const;
  int32_t error_flags() const;
  void clear_errors(cudaStream_t stream = nullptr);
  void reset_nonfinite_count(cudaStream_t stream = nullptr);
  // Slot of a request (-1 when it has none).
  int slot_of(int32_t first_block) const;
  long long step_counter() const;

  // One KV head's part of a block (layout().bytes; latent caches: the whole latent page), and
  // the same as a logical page (NVFP4/MXFP4/FP8 only; MXFP4 g is 1 there, the page scale
  // being a layout detail; latent pages: unpack_latent_page of read_page's bytes).
  std::vector<uint8_t> read_page(int layer, int block, int head) const;
  ref::QuantPage read_quant_page(int layer, int block, int head, int tokens = kPage) const;
  SlotRows read_slot(int layer, int slot, int head) const;
  // Copies of the step plan arrays (first max_batch rows) for tests and debugging.
  struct PlanCopy {
    std::vector<int32_t> row_slot, row_splits, row_pages_per_split, row_promote_block, row_pages;
    int32_t num_rows = 0;
  };
  PlanCopy read_plan() const;

  // ---- what the decode kernels need ----
  const KvCacheConfig& config() const { return config_; }
  const Recipe& recipe() const { return recipe_; }
  const PageLayout& layout() const { return dims_.layout; }
  long long block_stride() const { return dims_.block_stride; }  // bytes per block (all heads)
  const uint8_t* pool(int layer) const;                           // block b's head h: + b * block_stride() + h * layout().bytes
  const uint16_t* slot_buffer() const { return mem_.slots; }      // BF16 bits, layout.h slot_row_offset
  // Latent caches: this layer's slot rows [max_slots][144][latent + rope] (MlaStep::slot_rows).
  const uint16_t* latent_slot_rows(int layer) const;
  const int32_t* prefill_slot() const { return mem_.prefill_slot; }  // [1] slot of the chunk being prefilled
  const StepPlan& plan() const { return plan_; }
  const float* mu_k_device() const { return mem_.mu; }            // [layers][kv_heads][head_dim] or null
  int num_sms() const { return num_sms_; }
  // SMs the split planner balances an issue-bound kernel's CTAs over (step_plan.h; 0: none).
  int balance_sms() const { return dims_.balance_sms; }
  size_t device_bytes() const { return device_bytes_; }

 private:
  void check_layer(int layer) const;
  SlotRows read_latent_slot(int layer, int slot) const;

  KvCacheConfig config_;
  Recipe recipe_;
  detail::CacheDims dims_;
  detail::CacheMem mem_;
  StepPlan plan_;
  int num_sms_ = 0;
  size_t device_bytes_ = 0;
  std::vector<void*> allocations_;
  detail::PrefillArgs prefill_;  // the chunk of the last begin_prefill
  bool have_prefill_ = false;
  detail::StepArgs step_;        // the step of the last begin_step
  bool have_step_ = false;
};

}  // namespace fp4kv::cache
