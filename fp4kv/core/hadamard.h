// Normalized Sylvester Walsh-Hadamard transform (H H^T = I, H symmetric, so H is its own
// inverse), in place, in float32. The butterfly order is fixed so every implementation
// that performs the same stages (CPU loop, GPU shuffles) gets identical bits.
#pragma once

#include "fp4kv/core/host_device.h"

namespace fp4kv {

FP4KV_HD bool hadamard_supported(int d) { return d == 64 || d == 128 || d == 256 || d == 512; }

// 1/sqrt(d) rounded once to float.
FP4KV_HD float hadamard_scale(int d) {
  switch (d) {
    case 64: return 0.125f;
    case 128: return 0.0883883461356163025f;
    case 256: return 0.0625f;
    case 512: return 0.0441941730678081512f;
    default: return 0.0f;
  }
}

// x <- H x for d in {64, 128, 256, 512}. Stage h pairs (j, j + h) within blocks of 2h:
// (a, b) -> (a + b, a - b); the normalization is one multiply at the end.
FP4KV_HD void fwht_inplace(float* x, int d) {
  for (int h = 1; h < d; h *= 2) {
    for (int i = 0; i < d; i += 2 * h) {
      for (int j = i; j < i + h; ++j) {
        const float a = x[j], b = x[j + h];
        x[j] = add_rn(a, b);
        x[j + h] = sub_rn(a, b);
      }
    }
  }
  const float s = hadamard_scale(d);
  for (int j = 0; j < d; ++j) x[j] = mul_rn(x[j], s);
}

}  // namespace fp4kv
