// The parts of the sampling rule (sampling.h) that the kernel and its CPU twin share as
// __host__ __device__ code: prefixes of the sorted order, the binary search that finds the
// shortest prefix meeting a condition, and the row's uniform. Sharing the search itself
// makes the twin probe exactly the prefixes the kernel probes.
//
// Invariants: weights are non-negative floats, so their bit patterns order like their
// values; a Prefix {bits, index} holds the tokens with weight bits > bits, and those with
// weight bits == bits and index <= index: every leading part of the order (w descending,
// ties to the lower index) is one such Prefix.
#pragma once

#include <cstdint>

#include "fp4kv/core/host_device.h"
#include "fp4kv/core/philox.h"
#include "fp4kv/ops/sampling.h"

namespace fp4kv::ops {

inline constexpr uint32_t kWeightOneBits = 0x3f800000u;  // 1.0f: no weight exceeds exp(0)

struct Prefix {
  uint32_t bits = 0;
  int32_t index = 0;
};

FP4KV_HD bool in_prefix(uint32_t weight_bits, int32_t i, Prefix p) {
  return weight_bits > p.bits || (weight_bits == p.bits && i <= p.index);
}

// The whole vocabulary as a Prefix.
FP4KV_HD Prefix all_tokens(int vocab) { return Prefix{0u, vocab - 1}; }

// The shortest prefix P with satisfies(P) true, for a condition monotone in the prefix
// (true for the whole vocabulary by the caller's construction). Phase 1 finds the largest
// weight bits b whose {w >= b} still satisfies; phase 2 the smallest index cut among the
// tokens of weight b. The result's index is then the prefix's last token.
template <class Satisfies>
FP4KV_HD Prefix shortest_prefix(int vocab, const Satisfies& satisfies) {
  uint32_t lo = 0, hi = kWeightOneBits;
  while (lo < hi) {
    const uint32_t mid = lo + (hi - lo + 1) / 2;
    if (satisfies(Prefix{mid, vocab - 1})) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  const uint32_t bits = lo;
  int32_t first = 0, last = vocab - 1;
  while (first < last) {
    const int32_t mid = first + (last - first) / 2;
    if (satisfies(Prefix{bits, mid})) {
      last = mid;
    } else {
      first = mid + 1;
    }
  }
  return Prefix{bits, first};
}

// The row's uniform in [0, 1): Philox4x32-10 of counter (step, request id), key seed.
FP4KV_HD float sampling_uniform(const SamplingRow& p) {
  const Philox4x32 counter{{uint32_t(p.step), uint32_t(p.step >> 32), uint32_t(p.request_id),
                            uint32_t(p.request_id >> 32)}};
  const PhiloxKey key{{uint32_t(p.seed), uint32_t(p.seed >> 32)}};
  return uniform_from_bits(philox4x32_10(counter, key).v[0]);
}

FP4KV_HD bool uses_top_k(const SamplingRow& p, int vocab) { return p.top_k > 0 && p.top_k < vocab; }
FP4KV_HD bool uses_top_p(const SamplingRow& p) { return p.top_p < 1.0f; }

}  // namespace fp4kv::ops
