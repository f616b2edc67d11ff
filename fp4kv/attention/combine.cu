// The combine kernel instances (one per head_dim, kernel_instances.h).
#include "fp4kv/attention/lse_merge.cuh"
#include "fp4kv/attention/kernel_instances.h"

namespace fp4kv::attention::detail {
FP4KV_COMBINE_HEAD_DIMS(FP4KV_INSTANTIATE_COMBINE)
}  // namespace fp4kv::attention::detail
