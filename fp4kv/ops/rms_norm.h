// RMSNorm of BF16 activations on the GPU, FP32 math, BF16 weight, as transformers'
// Qwen3RMSNorm runs on a BF16 model, and the fused residual variant of the decoder layer
// (hidden = residual + sublayer output, then the next norm).
//
// Rounding points (bf16(.) = round to nearest even to BF16; everything else FP32):
//   add_rms_norm only:  s_i = bf16(residual_i + delta_i), stored back into residual
//                       (transformers adds two BF16 tensors); the norm reads s.
//   ss = sum_i x_i^2 (FP32; the kernel's order: strided per-thread sums, then a tree)
//   r  = 1 / sqrt(ss / n + eps)         (IEEE sqrt and division, core/hd_math.h rms_scale)
//   h_i = bf16(x_i * r)                 (hidden_states.to(input_dtype))
//   y_i = bf16(weight_i * h_i)          (weight * h in BF16)
// Only the order of the sum of squares is not specified; the CPU twin sums in double.
// Tolerance between them (derivation): a sum of n non-negative FP32 terms in any order has
// relative error <= (n - 1) 2^-24 (+ the twin's 2^-24 when it rounds to float), so r differs
// by a relative delta <= n 2^-25 + 2^-23 (~8e-5 for n = 2560), x_i r by the same; h_i can
// then round to the neighbouring BF16 value only when x_i r lies within delta of a rounding
// midpoint, which moves h_i by 1 BF16 ulp and y_i by at most 2 BF16 ulps (2^-6 |y_i|
// relative, one for h, one for the product's rounding). So: every |y - y_twin| <=
// 2^-6 |y_twin|, and equality almost everywhere (a midpoint hit has probability ~2^8 delta).
//
// No host synchronization (graph-capturable). Rows run one CTA each.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

namespace fp4kv::ops {

struct RmsNormArgs {
  const __nv_bfloat16* x = nullptr;       // device [rows][n]
  const __nv_bfloat16* weight = nullptr;  // device [n]
  __nv_bfloat16* y = nullptr;             // device [rows][n]; may alias x
  int rows = 0;
  int n = 0;
  float eps = 1e-6f;
};

struct AddRmsNormArgs {
  __nv_bfloat16* residual = nullptr;      // device [rows][n]: in, the running hidden state; out, residual + delta
  const __nv_bfloat16* delta = nullptr;   // device [rows][n]: the sublayer's output
  const __nv_bfloat16* weight = nullptr;  // device [n]
  __nv_bfloat16* y = nullptr;             // device [rows][n]: rmsnorm(residual + delta); must not alias residual
  int rows = 0;
  int n = 0;
  float eps = 1e-6f;
};

// Both throw fp4kv::Error naming the bad argument before launching.
void rms_norm(const RmsNormArgs& args, cudaStream_t stream);
void add_rms_norm(const AddRmsNormArgs& args, cudaStream_t stream);

}  // namespace fp4kv::ops
