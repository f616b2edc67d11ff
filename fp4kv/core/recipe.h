// The accuracy recipe (SPEC sections 2 and 4): how K/V are stored, how Q and P enter the
// two products, and which parts of the recipe are on. Named presets are part of the CLI.
#pragma once

#include <string>
#include <vector>

namespace fp4kv {

inline constexpr int kPageTokens = 128;  // tokens per cache page (= attention tile)
inline constexpr int kSinkTokens = 16;   // permanent BF16 attention sink

// What the cache stores for K and V.
enum class KvFormat {
  fp32,   // no rounding at all: the exact-arithmetic oracle (not a cache format on the GPU)
  bf16,
  fp8,    // E4M3, one FP32 scale per (page, KV head, K or V) = amax / 448
  nvfp4,  // E2M1 + E4M3 block scale per 16 + FP32 g per (page, KV head, K or V)
  mxfp4,  // E2M1 + E8M0 block scale per 32
};

// How the query enters Q.K.
enum class QueryFormat {
  full,        // FP16 against quantized pages; exact float against BF16 tokens
  fp4,         // one microscaling FP4 vector, standard rule
  dual_fp4,    // dual-residual: q1 = Q(q), q2 = Q(q - q1)
  smooth_fp4,  // comparison variant (paper appendix D): FP4(q - mean over the GQA group)
  fp8,         // comparison variant (mixed mode on FP8 tensor cores, as TensorRT-LLM's XQA
               // runs FP8 caches): E4M3 with one FP32 scale per head, amax / 448
};

// How the probabilities enter P.V.
enum class ProbFormat {
  full,             // FP16 on quantized pages; exact float on BF16 tokens
  fp4_max6,         // standard max/6 block scale
  fp4_underflow,    // underflow-aware: c folded into exp2, kappa 2 below tau, else 6
  fp4_two_level,    // comparison variant (SageAttention3): per-tile FP32 scale to 448*6, then max/6
  fp8,              // comparison variant with QueryFormat::fp8: E4M3 of p x 2^8 (p <= 1; a fixed
                    // power-of-two scale), on quantized pages; exact float on BF16 tokens
};

struct Recipe {
  std::string name;  // canonical name, e.g. "nvfp4-native:no-dualq"
  KvFormat kv = KvFormat::nvfp4;
  QueryFormat query = QueryFormat::full;
  ProbFormat prob = ProbFormat::full;
  bool smooth_keys = false;   // subtract the calibrated mu_k before caching
  bool rotate_keys = false;   // Hadamard on K (and Q)
  bool key_search = false;    // block-scale search for K
  bool bf16_sink = false;     // the first 16 tokens stay BF16 (their copy in page 0 is masked)
  bool bf16_recent = true;    // the unfinished page stays BF16 until it is promoted; off: every
                              // token is quantized on write (the open page re-quantized each step)
  float c = 8.0f;             // underflow-aware P: factor folded into exp2 (power of two)
  float tau = 21.0f / 1024.0f;  // underflow-aware P: kappa = 2 when c * max(p_b) <= tau

  bool fp4() const { return kv == KvFormat::nvfp4 || kv == KvFormat::mxfp4; }
  // native: Q and P are FP4 (both products are FP4 x FP4); mixed: they stay 16-bit (or 8-bit
  // with the fp8qp comparison variant).
  bool native() const {
    return query == QueryFormat::fp4 || query == QueryFormat::dual_fp4 || query == QueryFormat::smooth_fp4;
  }
  bool key_transform() const { return smooth_keys || rotate_keys; }
  int block() const;  // microscaling block size: 16 (NVFP4), 32 (MXFP4), 0 otherwise
};

// A preset name optionally followed by ":switch,switch,...". Switches turn one part off:
// no-dualq, no-pscale, no-smooth, no-rotate, no-search, no-sink, no-recent; and three
// reference-only comparison variants: smoothq (smoothing-Q with the GQA mean instead of
// dual-residual Q), twolevel (SageAttention3 two-level P scaling) and fp8qp (a mixed preset's
// Q and P in E4M3). Throws Error on unknown names or a switch that does not apply to the preset.
Recipe parse_recipe(const std::string& spec);

// Comma-separated recipe specs. A token that is a switch belongs to the spec before it, so
// "bf16,nvfp4-native:no-dualq,no-pscale" is two recipes.
std::vector<Recipe> parse_recipe_list(const std::string& list);

const std::vector<std::string>& preset_names();
std::string to_string(KvFormat f);

}  // namespace fp4kv
