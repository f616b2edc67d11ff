// Qwen3's per-head QK-norm and rotate-half RoPE, fused, on the GPU. Input: the fused QKV
// GEMM output [tokens][(q_heads + 2 kv_heads) head_dim] BF16 (q heads, then k heads, then v
// heads, the row order of model/qwen3.cpp's stacked wqkv). Outputs, in the layouts of their
// consumers:
//   q: BF16  [tokens][q_heads][head_dim]   (DecodeAttention::run's query, one row per token)
//   k: float [tokens][kv_heads][head_dim]  (KvCache::prefill/append take float32 post-RoPE
//   v: float [tokens][kv_heads][head_dim]   keys and values; the values are BF16-exact)
//   k_bf16, v_bf16 (optional): the same values in BF16 (PrefillAttention::run's own K/V)
//
// Rounding points per head (bf16(.) = round to nearest even; FP32 otherwise), transformers
// on a BF16 model: the norm exactly as rms_norm.h (ss over head_dim, r, h_i = bf16(x_i r),
// n_i = bf16(w_i h_i)); then with c_i, s_i the BF16 cos/sin of the table (transformers
// casts cos/sin to the activation dtype) and half = head_dim / 2, for i < half:
//   out_i        = bf16(bf16(n_i c_i) - bf16(n_{i+half} s_i))
//   out_{i+half} = bf16(bf16(n_{i+half} c_i) + bf16(n_i s_i))
// The twin agrees bit for bit except through the norm's sum order (rms_norm.h's bound: one
// BF16 ulp on n, so a few BF16 ulps of the head's largest |n| on the rotated outputs).
//
// Invariants: positions index the RoPE table; one outside [0, table rows) raises
// kErrorPositionOutOfRange (common.h) and zeroes that token's q and k. Launched as a
// programmatic dependent of the op before it on the stream (the QKV GEMM), it reads
// positions, the norm weights and the table before waiting for that op: they must be
// written before it (uploaded before the step), never by it. No host synchronization
// (graph-capturable).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <vector>

#include "fp4kv/cache/append_target.h"

namespace fp4kv::ops {

// BF16 cos/sin of RoPE as transformers computes them in float32 and casts to BF16:
// inv_freq_i = 1 / theta^(2i / head_dim), angle = float(position) * inv_freq_i.
struct RopeTable {
  int head_dim = 0;
  int positions = 0;
  std::vector<uint16_t> cos_bits, sin_bits;  // BF16 bits [positions][head_dim / 2]
};
// Throws fp4kv::Error for an odd or non-positive head_dim, theta <= 0, positions <= 0.
RopeTable make_rope_table(int head_dim, double rope_theta, int positions);

struct QkNormRopeArgs {
  const __nv_bfloat16* qkv = nullptr;       // device [tokens][(q_heads + 2 kv_heads) head_dim]
  const int32_t* positions = nullptr;       // device [tokens]
  const __nv_bfloat16* q_norm = nullptr;    // device [head_dim]
  const __nv_bfloat16* k_norm = nullptr;    // device [head_dim]
  const __nv_bfloat16* rope_cos = nullptr;  // device [rope_positions][head_dim / 2] (RopeTable::cos_bits)
  const __nv_bfloat16* rope_sin = nullptr;  // device [rope_positions][head_dim / 2]
  int rope_positions = 0;
  int tokens = 0;
  int q_heads = 0;
  int kv_heads = 0;
  int head_dim = 0;
  float eps = 1e-6f;
  __nv_bfloat16* q = nullptr;               // device [tokens][q_heads][head_dim]
  float* k = nullptr;                       // device [tokens][kv_heads][head_dim]
  float* v = nullptr;                       // device [tokens][kv_heads][head_dim]
  int32_t* error_flags = nullptr;           // device [1], sticky
  // Optional BF16 copies of k and v (the prefill attention's own keys and values; both are
  // BF16-exact, so the copies equal k and v), or null.
  __nv_bfloat16* k_bf16 = nullptr;          // device [tokens][kv_heads][head_dim]
  __nv_bfloat16* v_bf16 = nullptr;
};

// Throws fp4kv::Error naming the bad argument (head_dim up to 256) before launching.
void qk_norm_rope(const QkNormRopeArgs& args, cudaStream_t stream);

// The decode step's form with the cache's append fused in: q as qk_norm_rope writes it, and
// the token's k and v heads written straight into the cache's rows of this step (args.k,
// args.v, k_bf16 and v_bf16 are not used), the bits of qk_norm_rope followed by
// KvCache::append(layer, k, v). `target` is KvCache::append_target(layer) of the step begun
// for these `tokens` rows; enqueue KvCache::finish_append(layer) after it. head_dim 64, 128
// or 256; throws fp4kv::Error naming the bad argument or a cache that does not fit.
void qk_norm_rope_append(const QkNormRopeArgs& args, const cache::AppendTarget& target, cudaStream_t stream);

}  // namespace fp4kv::ops
