// What every GPU op of this layer shares: the sticky error-flag bits an op raises instead of
// reading out of bounds, and the BF16 storage type of the activations.
//
// Invariants: an op never clears a flag bit; it ORs its own bit into error_flags[0] and
// writes zeros where the bad input's output would go, so the step continues with defined
// values and the host reads the flags after the step (no host synchronization inside an op).
#pragma once

#include <cstdint>

namespace fp4kv::ops {

inline constexpr int32_t kErrorTokenOutOfRange = 1;     // embedding_gather: id < 0 or id >= vocab
inline constexpr int32_t kErrorPositionOutOfRange = 2;  // qk_norm_rope: position < 0 or >= the RoPE table's rows
inline constexpr int32_t kErrorRouterLogit = 4;         // moe_route: a non-finite router logit

}  // namespace fp4kv::ops
