// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC'11), the
// counter-based generator of Random123, as one __host__ __device__ function, so that the
// host and the device draw identical numbers for the same (counter, key): the GPU sampler
// and its CPU twin pick the same token.
//
// Invariants: philox4x32_10 is a pure function of (counter, key) and matches Random123's
// published known-answer vectors (tests/core/test_philox.cpp); uniform_from_bits maps a
// 32-bit word to a float in [0, 1) exactly (24 high bits times 2^-24), with no rounding.
#pragma once

#include <cstdint>

#include "fp4kv/core/host_device.h"

namespace fp4kv {

struct Philox4x32 {
  uint32_t v[4];
};
struct PhiloxKey {
  uint32_t v[2];
};

namespace detail {
inline constexpr uint32_t kPhiloxM0 = 0xD2511F53u;  // multipliers of the two S-boxes
inline constexpr uint32_t kPhiloxM1 = 0xCD9E8D57u;
inline constexpr uint32_t kPhiloxW0 = 0x9E3779B9u;  // Weyl key increments (golden ratio, sqrt(3) - 1)
inline constexpr uint32_t kPhiloxW1 = 0xBB67AE85u;
inline constexpr int kPhiloxRounds = 10;

FP4KV_HD void mulhilo32(uint32_t a, uint32_t b, uint32_t* hi, uint32_t* lo) {
  const uint64_t p = uint64_t(a) * uint64_t(b);
  *hi = uint32_t(p >> 32);
  *lo = uint32_t(p);
}

FP4KV_HD Philox4x32 philox_round(Philox4x32 c, PhiloxKey k) {
  uint32_t hi0, lo0, hi1, lo1;
  mulhilo32(kPhiloxM0, c.v[0], &hi0, &lo0);
  mulhilo32(kPhiloxM1, c.v[2], &hi1, &lo1);
  return Philox4x32{{hi1 ^ c.v[1] ^ k.v[0], lo1, hi0 ^ c.v[3] ^ k.v[1], lo0}};
}
}  // namespace detail

// Ten rounds; the key advances by the Weyl increments between rounds.
FP4KV_HD Philox4x32 philox4x32_10(Philox4x32 counter, PhiloxKey key) {
  FP4KV_UNROLL
  for (int r = 0; r < detail::kPhiloxRounds; ++r) {
    if (r > 0) {
      key.v[0] += detail::kPhiloxW0;
      key.v[1] += detail::kPhiloxW1;
    }
    counter = detail::philox_round(counter, key);
  }
  return counter;
}

// A uniform float in [0, 1): the 24 high bits of `bits` times 2^-24 (exact in float32).
FP4KV_HD float uniform_from_bits(uint32_t bits) {
  constexpr float kTwoPowMinus24 = 1.0f / 16777216.0f;
  return float(bits >> 8) * kTwoPowMinus24;
}

}  // namespace fp4kv
