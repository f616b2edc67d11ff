// The decode and combine kernel instances the library is built with, found by what they
// compute. The instance list (kernel_instances.h) generates both the instantiations and
// this lookup, so the two cannot disagree.
#pragma once

#include <cuda_runtime.h>

#include "fp4kv/attention/kernel_args.h"
#include "fp4kv/core/recipe.h"

namespace fp4kv::attention::detail {

// One decode kernel instance (format x head_dim x operand mode x MMA column tiles).
struct DecodeKernel {
  // Sets the instance's dynamic shared-memory limit. Call once, outside graph capture.
  cudaError_t (*configure)() = nullptr;
  // Bytes of dynamic shared memory a launch for group size G uses.
  int (*smem_bytes)(int G) = nullptr;
  // Resident CTAs per SM for group size G (after configure); 0 when the query fails.
  int (*ctas_per_sm)(int G) = nullptr;
  // Enqueues the kernel on `stream`: grid (max_splits + 1, kv_heads, batch). Graph-safe: no
  // attribute calls, no synchronization, no host allocation.
  void (*launch)(const KernelArgs&, cudaStream_t) = nullptr;
  explicit operator bool() const { return launch != nullptr; }
};

// The instance for (format, head_dim, mode, column_tiles), or an empty one if the library
// has none.
DecodeKernel find_decode_kernel(KvFormat format, int head_dim, OperandMode mode, int column_tiles);

// The combine kernel of a head_dim (64, 128, 256) writing I/O type `io`, or null. Enqueued
// as a programmatic dependent of the decode kernel when the device allows it, else a plain
// launch.
using CombineLaunch = void (*)(const CombineArgs&, cudaStream_t);
CombineLaunch find_combine_kernel(int head_dim, IoType io);

// The operand mode a recipe's kernel uses: native recipes quantize Q and P together.
OperandMode operand_mode(const Recipe& r);
// MMA column tiles of 8: the G heads times their query terms.
int column_tiles(const Recipe& r, int G);

}  // namespace fp4kv::attention::detail
