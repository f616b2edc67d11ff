// The sampling rule of fp4kv: which token a row of logits gives, deterministically for
// (logits, T, top_k, top_p, seed, request, step). One definition, in __host__ __device__
// code: the GPU sampler (ops/sampling.h) and the CPU one (ref/sampling.h) share the
// parameters, the fixed summation order, the prefix search and the uniform, so they pick the
// same token; the CPU engine draws with the same rule.
//
// The rule, per row with parameters p (SamplingRow):
//  * Greedy when p.temperature <= 0: the index of the largest logit, ties to the lowest
//    index; NaN logits are never picked (all NaN or -inf: token 0).
//  * Otherwise, all in FP32 with IEEE round-to-nearest operations (core/hd_math.h):
//    z_i = l_i / T; m = z at the greedy index; weights w_i = exp_nonpositive(z_i - m), so the
//    softmax probabilities are w_i / S (S = sum of all w_i). Division by S is monotone, so
//    the rule works on the weights and never divides.
//    Sorted order: w descending, ties to the lower index. A "prefix" is a leading part of
//    that order; a sum over a set of tokens ("fixed sum") is computed in this order: thread
//    t of kSampleThreads sums w_i for i = t, t + 1024, ... ascending (members only), then
//    the 1024 partials reduce as a tree: within each warp of 32, for off = 16, 8, 4, 2, 1,
//    p[l] = p[l] + p[l + off]; the 32 warp results reduce with the same tree.
//    1. top-k (when 0 < top_k < vocab): the prefix of length top_k. Else every token.
//    2. nucleus (when top_p < 1): the shortest prefix of the top-k set whose fixed sum is
//       >= top_p * (fixed sum of the top-k set) (renormalization after top-k); at least
//       one token (top_p <= 0 keeps the first).
//    3. pick: u = uniform_from_bits(philox4x32_10({step lo, step hi, request lo,
//       request hi}, {seed lo, seed hi}).v[0]) in [0, 1); total = fixed sum of the kept
//       set; the token is the last one of the shortest prefix of the kept set whose fixed
//       sum exceeds u * total: the first token whose cumulative weight exceeds u * total,
//       with the cumulative sums taken as fixed sums of prefixes (monotone in the prefix,
//       since FP32 addition of non-negative terms is monotone).
//    Deterministic in (logits, T, top_k, top_p, seed, request_id, step).
// The kernel finds each prefix by binary search over (weight bits, index) with one fixed
// sum (or count) per probe, which the twin follows probe for probe; bit-identical
// arithmetic makes the two pick the same token.
//
// Invariants: weights are non-negative floats, so their bit patterns order like their
// values; a Prefix {bits, index} holds the tokens with weight bits > bits, and those with
// weight bits == bits and index <= index: every leading part of the order (w descending,
// ties to the lower index) is one such Prefix.
#pragma once

#include <cstdint>

#include "fp4kv/core/host_device.h"
#include "fp4kv/core/philox.h"

namespace fp4kv {

inline constexpr int kSampleThreads = 1024;  // threads of a row's CTA; part of the sum order above
inline constexpr int kSampleWarp = 32;

struct SamplingRow {
  float temperature = 0.0f;  // <= 0: greedy
  int32_t top_k = 0;         // <= 0 or >= vocab: no top-k
  float top_p = 1.0f;        // >= 1: no nucleus
  uint32_t reserved = 0;
  uint64_t seed = 0;
  uint64_t request_id = 0;
  uint64_t step = 0;
};

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

}  // namespace fp4kv
