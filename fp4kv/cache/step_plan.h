// What the control kernel (once per decode step, on the device) tells the decode and
// promotion kernels. Plain device arrays of fixed capacity, allocated once, so that a
// whole step is capturable in a CUDA graph: grids are sized for the capacity and CTAs
// with no work exit at once.
#pragma once

#include <cstdint>

namespace fp4kv::cache {

// Device pointers; capacity `max_batch` rows. Row r of this step's batch:
struct StepPlan {
  int32_t* row_slot = nullptr;         // [max_batch] BF16 slot of the row's request
  int32_t* row_splits = nullptr;       // [max_batch] FP4 splits (0 when no quantized page)
  int32_t* row_pages_per_split = nullptr;  // [max_batch] split s covers pages [s*pps, min((s+1)*pps, quant_pages))
  int32_t* row_promote_block = nullptr;    // [max_batch] block to quantize the full recent page into after the
                                           // step's last layer, or -1
  int32_t* error_flags = nullptr;      // [1] bit 0: more requests than slots (the step's work is skipped)
  int32_t max_splits = 1;              // capacity of splits per row (grid dimension of the decode kernel)
};

// Error flag bits (read by the host after the step).
inline constexpr int32_t kErrorSlotsExhausted = 1;
inline constexpr int32_t kErrorBadSequence = 2;  // seq_len < 1 or block table entry out of range

}  // namespace fp4kv::cache
