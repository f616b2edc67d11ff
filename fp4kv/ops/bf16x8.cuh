// Eight BF16 values of one 16-byte load widened to float, the step of the ops that stream BF16
// weights or activations (gemv.cu, moe.cu). BF16 is the high half of a float32, so widening is a
// shift or a mask, exact.
#pragma once

#include <cstdint>

namespace fp4kv::ops {

inline constexpr int kBf16PerLoad = 8;  // BF16 values per 16-byte load

__device__ __forceinline__ void bf16x8_to_float(const uint4& v, float (&f)[kBf16PerLoad]) {
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    f[2 * i] = __uint_as_float(w[i] << 16);
    f[2 * i + 1] = __uint_as_float(w[i] & 0xFFFF0000u);
  }
}

}  // namespace fp4kv::ops
