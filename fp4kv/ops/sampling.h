// Token sampling on the GPU, one row of FP32 logits [rows][vocab] per CTA, with a CPU twin
// (reference.h) that picks the same token for the same inputs.
//
// The rule, per row with parameters p (SamplingRow):
//  * Greedy when p.temperature <= 0: the index of the largest logit, ties to the lowest
//    index; NaN logits are never picked (all NaN or -inf: token 0).
//  * Otherwise, all in FP32 with IEEE round-to-nearest operations (hd_math.h):
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
// Invariants: no host synchronization in run (graph-capturable); the weights workspace is
// owned by the Sampler, allocated once for max_rows x vocab.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace fp4kv::ops {

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

class Sampler {
 public:
  // Throws fp4kv::Error for max_rows < 1 or vocab < 1, or when the allocation fails.
  Sampler(int max_rows, int vocab);
  ~Sampler();
  Sampler(const Sampler&) = delete;
  Sampler& operator=(const Sampler&) = delete;

  // logits: device [rows][vocab] FP32; params: device [rows]; tokens: device [rows] int32.
  // Throws fp4kv::Error for rows outside [0, max_rows] or null pointers.
  void run(const float* logits, int rows, const SamplingRow* params, int32_t* tokens, cudaStream_t stream) const;

  int max_rows() const { return max_rows_; }
  int vocab() const { return vocab_; }

 private:
  int max_rows_ = 0;
  int vocab_ = 0;
  float* weights_ = nullptr;  // [max_rows][vocab]
};

}  // namespace fp4kv::ops
