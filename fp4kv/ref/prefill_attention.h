// CPU reference of chunked-prefill attention over the fp4kv cache: the oracle of a prefill
// attention kernel. A prompt chunk of T tokens at positions start .. start + T - 1 attends
//   (a) to the `start` tokens before it as the cache holds them once the earlier chunks were
//       prefilled: full pages quantized (prefill promotes a page when its 128th token
//       arrives), the unfinished page in the BF16 recent rows, the BF16 sink, read with the
//       recipe's operands exactly as a decode step reads them (quantized_attention), and
//   (b) causally to its own tokens, as BF16 values of the raw (not transformed) keys and the
//       values, in double (what a BF16 tensor-core kernel computes up to its FP32 sums),
// the two merged by log-sum-exp. With start = 0 this is exact causal attention over BF16 K/V;
// with T = 1 and a recipe that keeps BF16 recent tokens it is the decode step over start + 1
// tokens, up to the BF16 rounding of the new key before or after the recipe's key transform
// (without BF16 recent tokens the decode step reads the new token quantized; the chunk, in
// BF16).
#pragma once

#include <vector>

#include "fp4kv/core/recipe.h"
#include "fp4kv/ref/attention.h"

namespace fp4kv::ref {

struct PrefillChunkOutput {
  std::vector<float> out;  // [T][G][d]
  std::vector<float> lse;  // [T][G], natural log of the true logits q.k / sqrt(d)
};

// q: [T][G][d] post-RoPE queries of the chunk (query head group of one KV head); seq: the
// KV head's whole sequence (at least start + T tokens, built from the raw keys k and values
// v [n][d] given here too). Throws fp4kv::Error for a chunk outside the sequence.
PrefillChunkOutput prefill_chunk_attention(const float* q, int T, int G, const HeadSequence& seq, const float* k,
                                           const float* v, int start);

}  // namespace fp4kv::ref
