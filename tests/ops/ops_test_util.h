// Shared by the ops tests: random BF16 tensors, device BF16 views of bit vectors, and the
// GPU-skip guard.
#pragma once

#include <cuda_bf16.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

#include "fp4kv/core/half.h"
#include "fp4kv/testing/cuda_testing.h"

namespace fp4kv::ops::test {

using fp4kv::testing::DeviceBuffer;

// n BF16 values, normal(mean, stddev), as bits.
inline std::vector<uint16_t> random_bf16(size_t n, float mean, float stddev, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(mean, stddev);
  std::vector<uint16_t> out(n);
  for (auto& x : out) x = float_to_bf16_bits(dist(rng));
  return out;
}

inline __nv_bfloat16* as_bf16(const DeviceBuffer<uint16_t>& b) { return reinterpret_cast<__nv_bfloat16*>(b.get()); }

inline float bf16_ulp(float x) {  // spacing of BF16 at |x| (8 significant bits)
  const float a = std::fabs(x);
  if (a < 1e-30f) return 1e-30f;
  return std::ldexp(1.0f, std::ilogb(a) - 7);
}

}  // namespace fp4kv::ops::test
