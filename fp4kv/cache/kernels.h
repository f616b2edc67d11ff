// Internal interface between the host API (kv_cache.cpp) and the cache kernels (*.cu).
// Not part of the public API: plain structs of device pointers and sizes, passed by value
// to the kernels, and one launcher per kernel. Every launcher is asynchronous on `stream`
// and never synchronizes, so the decode-step launchers are capturable in a CUDA graph.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "fp4kv/cache/layout.h"
#include "fp4kv/cache/step_plan.h"

namespace fp4kv::cache::detail {

// Static shape and recipe switches of one cache.
struct CacheDims {
  int layers = 0, heads = 0, d = 0;
  int num_blocks = 0;  // per layer
  int slots = 0;
  KvFormat format = KvFormat::nvfp4;
  PageLayout layout;            // one head's part of a block
  long long block_stride = 0;   // bytes per block = heads * layout.bytes
  long long layer_stride = 0;   // bytes per layer pool = num_blocks * block_stride
  bool smooth = false, rotate = false, search = false;
  bool sink = false;            // recipe.bf16_sink: the first 16 tokens also in the slot's sink rows
  bool recent = true;           // recipe.bf16_recent: pages quantized when full (promotion); off: the
                                // open page is re-quantized after every write (quantize on write)
  SplitFloor split_floor;       // step_plan.h: fewest pages per split for the recipe's decode kernel
  int max_one_wave_pages = 0;   // step_plan.h: most pages per split of a one-wave plan (0: none)
  int balance_sms = 0;          // step_plan.h: SMs an issue-bound kernel's splits balance over (0: none)
  // MLA latent caches (kv_cache.h): rope_dim > 0, heads 1, d = latent_dim. The K side is the
  // latent (quantized like keys), the V side the positional keys r: rope_dim BF16 values per
  // token, in the page's r rows (byte offset r_rows) and after the latent in each slot row.
  int rope_dim = 0;
  int r_rows = 0;
  FP4KV_HD bool quantized() const { return format != KvFormat::bf16; }
  FP4KV_HD bool latent() const { return rope_dim > 0; }
  FP4KV_HD int width(int kv) const { return latent() && kv == 1 ? rope_dim : d; }  // values per row of K or V
  FP4KV_HD int slot_row_stride() const { return latent() ? d + rope_dim : d; }
};

// Device memory owned by the cache.
struct CacheMem {
  uint8_t* pool = nullptr;               // [layers][num_blocks][heads][layout.bytes]
  uint16_t* slots = nullptr;             // BF16 bits, layout.h slot_row_offset
  const float* mu = nullptr;             // [layers][heads][d] or null
  unsigned long long* nonfinite = nullptr;
  int32_t* error_flags = nullptr;        // sticky error bits (step_plan.h)
  int32_t* slot_owner = nullptr;         // [slots] first cache block of the owner, -1 free
  long long* slot_last_seen = nullptr;   // [slots] step counter when last seen, -1 never
  long long* step_counter = nullptr;     // [1] decode steps begun
  int32_t* prefill_slot = nullptr;       // [1] slot of the request being prefilled, -1 none
  int32_t* promote_rows = nullptr;       // [max_batch] rows to promote after this step
  int32_t* promote_count = nullptr;      // [1]
};

// The chunk of one prefill call.
struct PrefillArgs {
  int layer = 0;
  const int32_t* block_row = nullptr;  // the request's block table row
  int first = 0, end = 0;              // token positions [first, end)
  const float* k = nullptr;            // [end - first][heads][d]
  const float* v = nullptr;
};

// The decode step being run (from begin_step).
struct StepArgs {
  int layer = 0;
  const int32_t* block_tables = nullptr;  // [batch][max_pages]
  const int32_t* seq_lens = nullptr;      // [batch], including this step's token
  int batch = 0, max_pages = 0, max_batch = 0;
  const float* k = nullptr;  // [batch][heads][d]
  const float* v = nullptr;
};

// Sets kernel attributes (dynamic shared memory) once, outside any stream capture.
void prepare_page_kernels(const CacheDims& dims);
void prepare_control_kernel();

// Slot table and step planning (control.cu).
void launch_claim_prefill_slot(const CacheDims& dims, const CacheMem& mem, const int32_t* block_row, cudaStream_t stream);
void launch_release_slot(const CacheDims& dims, const CacheMem& mem, int32_t first_block, cudaStream_t stream);
void launch_control(const CacheDims& dims, const CacheMem& mem, const StepPlan& plan, const StepArgs& step,
                    int num_sms, cudaStream_t stream);
// Largest batch / slot count the control kernel handles.
inline constexpr int kControlMaxRows = 2048;
inline constexpr int kControlMaxSlots = 2048;

// Page quantization (quantize_page.cu): full pages of a prefill chunk (and the unfinished
// last page without BF16 recent), the open page of every row after an append (without BF16
// recent), and the promotions of a step.
void launch_prefill_pages(const CacheDims& dims, const CacheMem& mem, const PrefillArgs& args, cudaStream_t stream);
void launch_requantize_open_pages(const CacheDims& dims, const CacheMem& mem, const StepPlan& plan,
                                  const StepArgs& step, cudaStream_t stream);
void launch_promote(const CacheDims& dims, const CacheMem& mem, const StepPlan& plan, const StepArgs& step,
                    cudaStream_t stream);

// BF16 rows (append.cu): the slot rows (or BF16 pool rows) of a prefill chunk, and the
// new token of every row of a decode step.
void launch_prefill_rows(const CacheDims& dims, const CacheMem& mem, const PrefillArgs& args, cudaStream_t stream);
void launch_append(const CacheDims& dims, const CacheMem& mem, const StepPlan& plan, const StepArgs& step,
                   cudaStream_t stream);

}  // namespace fp4kv::cache::detail
