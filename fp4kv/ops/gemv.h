// Y[m][n] = X[m][k] W[n][k]^T for a few rows (m <= kGemvMaxRows): the decode step's GEMMs at
// small batch, where the cost is reading W once. A CTA owns gemv_cta_rows(m, k) rows of W, each
// cut into k-slices of 16-byte chunks, one warp each, multiplied by every X row in FP32,
// reduced across the warp and then across the row's slices; BF16 or FP32 output. W waits for
// X in one of two places: for m <= 3 (where k leaves a row at most 96 KiB) the CTA's rows are
// bulk-copied into shared memory (up to 4 rows, 40 KiB a CTA), else each lane holds up to 8
// 16-byte loads in registers (the fewest slices of at most 5 loads a lane). A candidate of
// ops::Gemm::tune, kept only where it measures faster than cuBLASLt's algorithms. Launched as
// a programmatic dependent (cache/dependent_launch.cuh): every weight load of a resident CTA
// is issued before it waits for the op that produces X (the norms and SwiGLU allow their
// dependents to start at once), so W streams while that op and the ones before it finish.
//
// Invariants: k is a multiple of 8 and x, w are 16-byte aligned (checked by the caller);
// accumulation is FP32 in a fixed order (per lane in k order, a butterfly over lanes, the
// slices in order), so the tolerance of tests/ops/test_gemm_gpu.cpp (any-order FP32 sum)
// covers it. No host synchronization.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

namespace fp4kv::ops {

inline constexpr int kGemvMaxRows = 8;
inline constexpr int kGemvKMultiple = 8;  // one 16-byte load of BF16

bool gemv_supports(int m, int k);
// Rows of W a CTA owns (8 warps: 8 / rows k-slices a row). Staged (m <= 3): 4, halved while
// 4 rows exceed 40 KiB (Qwen3-4B: 4 for k = 2560 and 4096, 2 for 9728). In registers: 8 / the
// fewest slices (1, 2, 4 or 8) that leave a warp at most 160 chunks (k <= 1280: 8; Qwen3-4B:
// 4 for k = 2560, 2 for 4096, 1 for 9728).
int gemv_cta_rows(int m, int k);
// Whether the CTAs stage their W rows in shared memory (m <= 3 and a row of at most 96 KiB).
bool gemv_stages_weights(int m, int k);
// Reserves on the current device the shared memory the GEMV of m rows and k columns needs
// past the default 48 KiB (a staged row of over 48 KiB: k > 24576): a kernel attribute, which
// a stream capture cannot set. Call it outside any capture before capturing such a launch
// (Gemm::use_gemv and Gemm::tune do); an eager launch sets it on first use. Throws
// fp4kv::Error if the device refuses.
void gemv_prepare(int m, int k);
// y is __nv_bfloat16* or float* as `f32_out` says.
void gemv(const __nv_bfloat16* x, const __nv_bfloat16* w, void* y, bool f32_out, int m, int n, int k,
          cudaStream_t stream);

// The GEMV with the SwiGLU as its epilogue: act[m][intermediate] = ops::swiglu of the BF16
// product X W^T for W = w_gate_up [gate rows][up rows] (2 intermediate rows of k), one
// kernel, the product never written. The same bits as gemv() into [m][2 intermediate] then
// ops::swiglu (both round g and u to BF16 and apply swiglu.cuh's swiglu_value). A CTA holds
// whole (gate, up) row pairs, so k must leave an even number of rows per CTA
// (gemv_cta_rows: k <= 10240 staged, k <= 5120 in registers); gemv_swiglu_supports says where
// it applies, and gemv_swiglu throws fp4kv::Error elsewhere.
bool gemv_swiglu_supports(int m, int k);
void gemv_swiglu(const __nv_bfloat16* x, const __nv_bfloat16* w_gate_up, __nv_bfloat16* act, int m, int intermediate,
                 int k, cudaStream_t stream);

}  // namespace fp4kv::ops
