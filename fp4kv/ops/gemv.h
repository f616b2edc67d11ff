// Y[m][n] = X[m][k] W[n][k]^T for a few rows (m <= kGemvMaxRows): the decode step's GEMMs at
// small batch, where the cost is reading W once. One warp per output feature streams W's row
// with 16-byte loads (8 BF16 per lane, 8 per lane in flight), multiplies by every X row in FP32 and
// reduces across the warp; BF16 or FP32 output. A candidate of ops::Gemm::tune, kept only
// where it measures faster than cuBLASLt's algorithms. Launched as a programmatic dependent
// (cache/dependent_launch.cuh): its first weight loads overlap the op that produces X (the norms and SwiGLU
// allow their dependents to start at once).
//
// Invariants: k is a multiple of 8 and x, w are 16-byte aligned (checked by the caller);
// accumulation is FP32 in a fixed order (per lane in k order, then a butterfly over lanes),
// so the tolerance of tests/ops/test_gemm_gpu.cpp (any-order FP32 sum) covers it. No host
// synchronization.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

namespace fp4kv::ops {

inline constexpr int kGemvMaxRows = 8;
inline constexpr int kGemvKMultiple = 8;  // one 16-byte load of BF16

bool gemv_supports(int m, int k);
// y is __nv_bfloat16* or float* as `f32_out` says.
void gemv(const __nv_bfloat16* x, const __nv_bfloat16* w, void* y, bool f32_out, int m, int n, int k,
          cudaStream_t stream);

}  // namespace fp4kv::ops
