// CPU reference of FP4 Multi-Head Latent Attention decode (paper appendix G, Algorithm 2):
// DeepSeek-V2/V3-style attention where every token caches one latent c (d_c = 512) and one
// decoupled positional key r (d_r = 64), shared by all H query heads; the per-head key up-
// projection W_K is absorbed into the content query (q_c = W_K^T q_nope, [d_c]) and the value
// up-projection W_V is applied by the caller to the latent output this computes.
//
// Per head, with gamma = log2(e) / sqrt(d_nope + d_r) (base-2 logits):
//   s_t = gamma (q_c . c_t + q_r . r_t),   u = sum_t softmax(s)_t c_t   ([d_c], then W_V u).
//
// Quantized (the recipe's switches): the latent is the key of the recipe's key path (k' =
// H (c - mu_c) when smoothing/rotating, BF16-rounded, pages of 128 tokens quantized with
// blocks along d_c, scale search), kept as the GQA keys are (BF16 sink and recent rows,
// promotion of full pages; ref/attention.h HeadSequence); the content query is H q_c as a
// 16-bit operand (mixed) or dual-residual FP4 (native); the positional part is FP32 against
// BF16-stored r rows. The latent is also the value: the context product multiplies P, rounded
// to FP16 (never FP4: its blocks would have to run along tokens), by the page's expanded
// latent (code x block scale, exact in FP16) and applies the page factor g to the FP32
// partial; the output is rotated back and mu_c restored: u = H^T (u' / l) + mu_c.
#pragma once

#include <vector>

#include "fp4kv/core/recipe.h"
#include "fp4kv/ref/attention.h"

namespace fp4kv::ref {

struct MlaShape {
  int latent_dim = 512;  // d_c
  int rope_dim = 64;     // d_r
  int nope_dim = 128;    // d_k of the content query before absorption: only sets the scale
};

struct MlaOutput {
  std::vector<float> out;  // [H][latent_dim]: the latent output u (W_V is the caller's)
  std::vector<float> lse;  // [H]: natural-log log-sum-exp of the logits (q_c.c + q_r.r) / sqrt(d_nope + d_r)
};

// Ground truth in double. q_c: [H][d_c] absorbed content queries, q_r: [H][d_r] positional
// queries (post-RoPE); c: [n][d_c] latents, r: [n][d_r] positional keys (post-RoPE).
MlaOutput exact_mla(const float* q_c, const float* q_r, int H, const float* c, const float* r, int n,
                    const MlaShape& shape);

// The latent cache of one request over a whole sequence, as stored: the latent through the
// recipe's key path (pages and BF16 rows) and the positional keys in BF16.
class MlaSequence {
 public:
  // mu_c: [d_c] latent mean of the key smoothing, or null (zero). Throws Error for a recipe
  // without an MLA form (fp32 is the exact path; the CPU-only comparison variants smoothq and
  // twolevel) or a latent size the recipe cannot use.
  MlaSequence(const float* c, const float* r, int n, const MlaShape& shape, const Recipe& recipe,
              const float* mu_c = nullptr);

  // Decode step of H heads attending to the first n_tokens tokens.
  MlaOutput decode(const float* q_c, const float* q_r, int H, int n_tokens) const;

  int size() const { return latent_.size(); }
  // The cache as stored (what tests pack into GPU pages and slot rows): the latent as a key
  // sequence (pages, BF16 rows) and the BF16 positional keys [n][d_r].
  const HeadSequence& latent() const { return latent_; }
  const std::vector<float>& rope_keys() const { return r_bf16_; }
  const MlaShape& shape() const { return shape_; }

 private:
  MlaShape shape_;
  Recipe recipe_;
  HeadSequence latent_;         // keys = the latent; its value side is unused
  std::vector<float> r_bf16_;   // [n][d_r] as stored
  std::vector<float> mu_;       // empty when not smoothing
};

}  // namespace fp4kv::ref
