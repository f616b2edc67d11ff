// Limits of the work a command may start: the positions the model was trained for, the
// memory this process can still get, and input paths that must be regular files. Checked
// before long work, so that a request that cannot finish fails at once with an Error
// naming the option, never with std::bad_alloc, a hang or a crash hours later.
#pragma once

#include <cstdint>
#include <new>
#include <string>

#include "fp4kv/core/error.h"
#include "fp4kv/model/qwen3_config.h"

namespace fp4kv::eval {

// Bytes this process may still allocate: the least of /proc/meminfo's MemAvailable, the
// cgroup's memory.max minus memory.current, and RLIMIT_AS (ulimit -v) minus the address
// space already mapped. 0 when none of them can be read (then no memory check is made).
uint64_t available_memory_bytes();

// What one forward pass keeps besides its activations.
struct ForwardFootprint {
  int logits_copies = 1;            // [tokens][vocab] float32 arrays alive at once
  bool capture_all_layers = false;  // Capture of q, k, v of every layer (calibration)
  int kv_states = 0;                // KvState copies of every layer's K and V (retrieval)
};

// An upper estimate of the float32 bytes a forward pass over `tokens` positions allocates:
// the per-token activations of one layer (residual, projections, MLP), the logits, the
// attention working buffers (quantized K/V copies and score blocks) and what `footprint`
// keeps. A double, so that absurd requests do not overflow.
double forward_pass_bytes(const model::Qwen3Config& config, int64_t tokens, const ForwardFootprint& footprint);

// Throws Error naming `option` when `tokens` positions exceed the model's
// max_position_embeddings (no limit when the config does not give one).
void require_within_positions(const model::Qwen3Config& config, int64_t tokens, const std::string& option);

// Throws Error naming `option` and `work` when `bytes` exceed `available` (0: unknown, no check).
void require_fits_memory(double bytes, uint64_t available, const std::string& option, const std::string& work);

// Throws Error naming `option` unless `path` is an existing regular file (a directory, a
// missing path or a device are refused).
void require_regular_file(const std::string& path, const std::string& option);

// Runs fn(); std::bad_alloc (an allocation the estimates did not foresee) becomes an Error
// naming `work`, so the CLI reports it like any other input problem.
template <class F>
auto with_memory_guard(const std::string& work, F&& fn) -> decltype(fn()) {
  try {
    return fn();
  } catch (const std::bad_alloc&) {
    throw Error("out of memory while " + work + ": ask for less (shorter --context, fewer tokens) or free memory");
  }
}

}  // namespace fp4kv::eval
