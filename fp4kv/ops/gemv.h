// Y[m][n] = X[m][k] W[n][k]^T for a few rows (m <= kGemvMaxRows): the decode step's GEMMs at
// small batch, where the cost is reading W once. Each output feature's row of W is cut into
// gemv_slices(k) k-slices, one warp each, streamed with 16-byte loads (8 BF16 per lane, 8 per
// lane in flight), multiplied by every X row in FP32, reduced across the warp and then across
// the row's slices; BF16 or FP32 output. A candidate of ops::Gemm::tune, kept only
// where it measures faster than cuBLASLt's algorithms. Launched as a programmatic dependent
// (cache/dependent_launch.cuh): its first weight loads overlap the op that produces X (the norms and SwiGLU
// allow their dependents to start at once).
//
// Invariants: k is a multiple of 8 and x, w are 16-byte aligned (checked by the caller);
// accumulation is FP32 in a fixed order (per lane in k order, a butterfly over lanes, the
// slices in order),
// so the tolerance of tests/ops/test_gemm_gpu.cpp (any-order FP32 sum) covers it. No host
// synchronization.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

namespace fp4kv::ops {

inline constexpr int kGemvMaxRows = 8;
inline constexpr int kGemvKMultiple = 8;  // one 16-byte load of BF16

bool gemv_supports(int m, int k);
// Warps per row of W: the fewest (1, 2, 4 or 8) that leave a warp at most 160 16-byte chunks
// (k <= 1280: 1; the Qwen3-4B shapes: 2 for k = 2560, 4 for 4096, 8 for 9728).
int gemv_slices(int k);
// y is __nv_bfloat16* or float* as `f32_out` says.
void gemv(const __nv_bfloat16* x, const __nv_bfloat16* w, void* y, bool f32_out, int m, int n, int k,
          cudaStream_t stream);

// The GEMV with the SwiGLU as its epilogue: act[m][intermediate] = ops::swiglu of the BF16
// product X W^T for W = w_gate_up [gate rows][up rows] (2 intermediate rows of k), one
// kernel, the product never written. The same bits as gemv() into [m][2 intermediate] then
// ops::swiglu (both round g and u to BF16 and apply swiglu.cuh's swiglu_value). A CTA holds
// whole (gate, up) row pairs, so k must leave at least two rows per CTA (at most 4 k-slices:
// k <= 5120); gemv_swiglu_supports says where it applies, and gemv_swiglu throws
// fp4kv::Error elsewhere.
bool gemv_swiglu_supports(int m, int k);
void gemv_swiglu(const __nv_bfloat16* x, const __nv_bfloat16* w_gate_up, __nv_bfloat16* act, int m, int intermediate,
                 int k, cudaStream_t stream);

}  // namespace fp4kv::ops
