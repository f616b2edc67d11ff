// Chunked-prefill attention reference (prefill_attention.h).
#include "fp4kv/ref/prefill_attention.h"

#include <cmath>
#include <limits>
#include <string>

#include "fp4kv/core/error.h"
#include "fp4kv/core/half.h"

namespace fp4kv::ref {

namespace {

// The view of the prefix [0, start) after the earlier chunks were prefilled: the decode view
// of start + 1 tokens (whose full pages are exactly the prefix's full pages) without its last
// BF16 row; without BF16 recent tokens the unfinished page is quantized as it stands, which
// is the decode view of `start` tokens.
void prefix_view(const HeadSequence& seq, int start, HeadSequence::View& out) {
  if (seq.recipe().bf16_recent || !(seq.recipe().fp4() || seq.recipe().kv == KvFormat::fp8)) {
    seq.view(start + 1, out);
    out.view.layout.recent_end -= 1;  // token `start` belongs to the chunk
  } else {
    seq.view(start, out);
  }
}

// Merges two partial attentions (output, natural-log LSE) of disjoint key sets.
void merge(const float* o1, float lse1, const float* o2, float lse2, int d, float* out, float* lse) {
  const float m = std::fmax(lse1, lse2);
  const double w1 = std::exp(double(lse1) - m), w2 = std::exp(double(lse2) - m);
  for (int c = 0; c < d; ++c) out[c] = float((w1 * o1[c] + w2 * o2[c]) / (w1 + w2));
  *lse = float(m + std::log(w1 + w2));
}

}  // namespace

PrefillChunkOutput prefill_chunk_attention(const float* q, int T, int G, const HeadSequence& seq, const float* k,
                                           const float* v, int start) {
  const int d = seq.d();
  require(T >= 1 && G >= 1, "prefill chunk attention needs T >= 1 tokens and G >= 1 query heads");
  require(start >= 0 && start + T <= seq.size(), "prefill chunk [" + std::to_string(start) + ", " +
                                                     std::to_string(start + T) + ") outside the sequence of " +
                                                     std::to_string(seq.size()) + " tokens");
  // The chunk's own keys and values in BF16, raw.
  std::vector<float> kb(size_t(T) * d), vb(size_t(T) * d);
  for (size_t i = 0; i < kb.size(); ++i) {
    kb[i] = round_bf16(k[size_t(start) * d + i]);
    vb[i] = round_bf16(v[size_t(start) * d + i]);
  }
  HeadSequence::View prefix;
  if (start > 0) prefix_view(seq, start, prefix);
  PrefillChunkOutput res;
  res.out.assign(size_t(T) * G * d, 0.0f);
  res.lse.assign(size_t(T) * G, 0.0f);
  for (int t = 0; t < T; ++t) {
    const float* qt = q + size_t(t) * G * d;
    const AttentionOutput own = exact_attention(qt, G, kb.data(), vb.data(), t + 1, d);
    float* out = &res.out[size_t(t) * G * d];
    float* lse = &res.lse[size_t(t) * G];
    if (start == 0) {
      std::copy(own.out.begin(), own.out.end(), out);
      std::copy(own.lse.begin(), own.lse.end(), lse);
      continue;
    }
    const AttentionOutput before = quantized_attention(qt, G, prefix.view, seq.recipe());
    for (int h = 0; h < G; ++h) {
      merge(&before.out[size_t(h) * d], before.lse[h], &own.out[size_t(h) * d], own.lse[h], d, out + size_t(h) * d,
            lse + h);
    }
  }
  return res;
}

}  // namespace fp4kv::ref
