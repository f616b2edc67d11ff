// Quantization of the attention operands that native mode computes on the fly (SPEC
// section 4): the query (single or dual-residual FP4) and the probability blocks
// (underflow-aware scaling). Block level, host and device, so the CPU reference and the
// decode kernel follow the same float32 steps.
#pragma once

#include <cstdint>

#include "fp4kv/core/block_quant.h"
#include "fp4kv/core/host_device.h"
#include "fp4kv/core/minifloat.h"

namespace fp4kv {

// ---- Query -----------------------------------------------------------------------------
// A query vector is quantized with its own g = amax / (6 * 448) (NVFP4) and the standard
// rule; the residual term r = q - deq(q1) gets its own g, so it does not sink into E4M3
// subnormals. MXFP4 terms have no g.

// Residual of one NVFP4 block: out[i] = x[i] - value(code_i) * (decode(s) * g).
FP4KV_HD void nvfp4_block_residual(const float* x, const uint8_t* codes, uint8_t s, float g, float* out, int n = kNvfp4Block) {
  const float sg = mul_rn(e4m3_value(s), g);
  for (int i = 0; i < n; ++i) out[i] = sub_rn(x[i], mul_rn(e2m1_value(codes[i]), sg));
}
FP4KV_HD void mxfp4_block_residual(const float* x, const uint8_t* codes, uint8_t s, float* out, int n = kMxfp4Block) {
  const float sc = e8m0_value(s);
  for (int i = 0; i < n; ++i) out[i] = sub_rn(x[i], mul_rn(e2m1_value(codes[i]), sc));
}

// ---- Probabilities ---------------------------------------------------------------------
// A P block holds 16 (NVFP4) or 32 (MXFP4) consecutive keys of one query head, with values
// p = exp2(S - m + log2 c) relative to the running maximum m of the current tile; pmax is
// the largest of them (c * max(p_b) in the paper's notation). P has no g.

// NVFP4: kappa = 2 when underflow-aware and pmax <= tau, else 6; s = E4M3(pmax / kappa).
FP4KV_HD uint8_t nvfp4_prob_scale(float pmax, bool underflow_aware, float tau) {
  const float kappa = (underflow_aware && pmax <= tau) ? 2.0f : 6.0f;
  return nvfp4_block_scale(pmax, kappa, 1.0f);
}
FP4KV_HD uint8_t nvfp4_prob_code(float p, float scale_value) {
  return scale_value > 0.0f ? e2m1_encode(div_rn(p, scale_value)) : uint8_t(0);
}

// MXFP4: the OCP exponent of pmax (E8M0 reaches 2^-127, so there is no underflow to avoid;
// c still folds into exp2).
FP4KV_HD uint8_t mxfp4_prob_scale(float pmax) { return uint8_t(mxfp4_ocp_exponent(pmax) + kE8M0Bias); }
FP4KV_HD uint8_t mxfp4_prob_code(float p, uint8_t scale) {
  return e2m1_encode(mul_rn(p, pow2f(kE8M0Bias - int(scale))));
}

}  // namespace fp4kv
