// The key transform of the recipe (SPEC section 4): k' = H (k - mu_k) before caching and
// q' = H q at decode, so q'.k' = q.(k - mu_k): the logits shift by q.mu_k for every key,
// which softmax ignores. Host and device; identical bits everywhere.
#pragma once

#include <cmath>

#include "fp4kv/core/hadamard.h"
#include "fp4kv/core/host_device.h"

namespace fp4kv {

inline constexpr int kMaxHeadDim = 512;

// out = H (k - mu) with the parts that are switched on; mu may be null (zero).
FP4KV_HD void transform_key(const float* k, const float* mu, int d, bool smooth, bool rotate, float* out) {
  for (int i = 0; i < d; ++i) out[i] = (smooth && mu) ? sub_rn(k[i], mu[i]) : k[i];
  if (rotate) fwht_inplace(out, d);
}

FP4KV_HD void transform_query(const float* q, int d, bool rotate, float* out) {
  for (int i = 0; i < d; ++i) out[i] = q[i];
  if (rotate) fwht_inplace(out, d);
}

// gamma = log2(e) / sqrt(d): logits in base 2, so softmax uses exp2.
FP4KV_HD float log2e_over_sqrt_d(int d) {
  switch (d) {
    case 64: return 0.180336880111120426f;
    case 128: return 0.127517430824598682f;
    case 256: return 0.0901684400555602131f;
    case 512: return 0.063758715412299341f;
    default: return 0.0f;
  }
}

// The same for any head size, on the host (the CPU reference accepts any d without the
// rotation); equal to the table above for the supported sizes.
inline float log2e_over_sqrt_d_any(int d) { return float(1.4426950408889634 / std::sqrt(double(d))); }

}  // namespace fp4kv
