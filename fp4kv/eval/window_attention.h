// Quantized attention of a whole window for the CPU model runner: every query is a decode
// step at its position (query at position t sees keys 0..t: full pages promoted before it
// are quantized, the sink and the unfinished page are BF16 — ref::quantized_attention's
// semantics with one split over the quantized pages). Same results as calling the
// reference per query (up to float summation order), but with matrix products (BLAS) so a
// 4096-token window takes seconds.
#pragma once

#include "fp4kv/core/recipe.h"
#include "fp4kv/ref/attention.h"

namespace fp4kv::eval {

// One KV head group: q [G][nq][d] are the queries at positions n - nq .. n - 1, k and v
// [n][d] the post-RoPE keys and values of positions 0 .. n - 1, mu_k [d] or null.
// Writes out [G][nq][d]. P-block statistics are accumulated into *stats when given.
void window_attention(const float* q, int G, int nq, const float* k, const float* v, int n, int d,
                      const Recipe& recipe, const float* mu_k, float* out, ref::PBlockStats* stats = nullptr);

}  // namespace fp4kv::eval
