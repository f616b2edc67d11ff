// Float32 functions that give bit-identical results on the host and the device, so CPU
// twins reproduce the kernels exactly where the op's definition allows it: every
// operation is one IEEE round-to-nearest op (core/host_device.h), never contracted into an
// FMA, never a fast-math intrinsic.
//
// Invariants: exp_nonpositive(x) for x <= 0 is within 2 ulp of exp(x) (Cephes polynomial,
// the CPU Qwen3 runner's form) and exactly 1 at 0; below -87 it returns 0. silu uses
// exp_nonpositive only (the argument -|g|), so it is also bit-identical host/device.
#pragma once

#include "fp4kv/core/host_device.h"

namespace fp4kv {

FP4KV_HD float exp_nonpositive(float x) {
  constexpr float kLowest = -87.0f;  // exp(-87) is still a normal float; below, the result is 0
  if (!(x >= kLowest)) return 0.0f;
  constexpr float kLog2e = 1.44269504088896341f;
  constexpr float kRoundShift = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  constexpr float kLn2Hi = 0.693359375f, kLn2Lo = -2.12194440e-4f;  // ln 2 in two parts
  const float t = add_rn(mul_rn(x, kLog2e), kRoundShift);
  const float k = sub_rn(t, kRoundShift);
  const float r = sub_rn(sub_rn(x, mul_rn(k, kLn2Hi)), mul_rn(k, kLn2Lo));
  float p = 1.9875691500e-4f;
  p = add_rn(mul_rn(p, r), 1.3981999507e-3f);
  p = add_rn(mul_rn(p, r), 8.3334519073e-3f);
  p = add_rn(mul_rn(p, r), 4.1665795894e-2f);
  p = add_rn(mul_rn(p, r), 1.6666665459e-1f);
  p = add_rn(mul_rn(p, r), 5.0000001201e-1f);
  const float y = add_rn(add_rn(mul_rn(p, mul_rn(r, r)), r), 1.0f);
  return mul_rn(y, pow2f(int(k)));
}

// silu(g) = g / (1 + exp(-g)), written with exp(-|g|) so the exponential never overflows:
// for g < 0 it is g e / (1 + e) with e = exp(g).
FP4KV_HD float silu(float g) {
  const float e = exp_nonpositive(-abs_f(g));
  const float denom = add_rn(1.0f, e);
  return g >= 0.0f ? div_rn(g, denom) : div_rn(mul_rn(g, e), denom);
}

// 1 / sqrt(mean_square + eps), correctly rounded at each step on both sides (sqrt and the
// division are IEEE operations; the device's rsqrtf would not be).
FP4KV_HD float rms_scale(float mean_square, float eps) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(mean_square, eps)));
#else
  return 1.0f / __builtin_sqrtf(mean_square + eps);
#endif
}

}  // namespace fp4kv
