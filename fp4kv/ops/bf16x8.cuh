// Eight BF16 values of one 16-byte load widened to float, and eight floats rounded back into
// one 16-byte store: the steps of the ops that stream BF16 weights or activations (gemv.cu,
// moe.cu, rms_norm.cu, embedding.cu). BF16 is the high half of a float32, so widening is a
// shift or a mask, exact.
#pragma once

#include <cuda_bf16.h>

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

// Each of f rounded to BF16 (nearest even), packed in order.
__device__ __forceinline__ uint4 float_to_bf16x8(const float (&f)[kBf16PerLoad]) {
  uint32_t w[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    w[i] = uint32_t(__bfloat16_as_ushort(__float2bfloat16_rn(f[2 * i]))) |
           (uint32_t(__bfloat16_as_ushort(__float2bfloat16_rn(f[2 * i + 1]))) << 16);
  }
  return make_uint4(w[0], w[1], w[2], w[3]);
}

// Whether p may be read or written with 16-byte loads and stores.
inline bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace fp4kv::ops
