// The query side of the CPU reference, shared by GQA decode attention (attention.h) and MLA
// (mla.h): the transformed query q' = H q, the operand each product sees (a 16-bit vector in
// mixed mode; one FP4 term or the dual-residual pair in native mode; the smoothing-Q
// variant's mean), and the logit of one quantized key against it.
#pragma once

#include <vector>

#include "fp4kv/core/recipe.h"
#include "fp4kv/ref/quant_page.h"

namespace fp4kv::ref {

// The 16-bit operand type of mixed mode: FP16 for every format (MXFP4 pages expand to FP16
// after a power-of-two shift per page; see docs/DESIGN.md).
float round_operand(float x);

// Throws Error unless the recipe can run at head size d (Hadamard sizes, block multiples).
void check_head_dim(int d, const Recipe& r);

// q' for one head: non-finite elements become 0 (they must not poison anything), then the
// recipe's rotation.
std::vector<float> transformed_query(const float* q, int d, const Recipe& r);

// One FP4 vector: the expanded MMA operand (code * block scale) and its FP32 multiplier.
struct Fp4Term {
  std::vector<float> expanded;
  std::vector<float> dequant;  // expanded * g, what the term contributes
  float g = 1.0f;
};

// Quantizes x (standard rule, no search) and returns the term; with `residual`, also x - deq.
Fp4Term quantize_term(const std::vector<float>& x, KvFormat f, std::vector<float>* residual);

// The query of one head as both products see it.
struct QueryOperand {
  std::vector<float> full;     // q' in float: used against BF16 tokens
  std::vector<Fp4Term> terms;  // against quantized pages: 1 or 2 terms (16-bit q' is one term with g = 1)
  std::vector<float> qbar;     // smoothing-Q variant: high-precision mean, added back exactly
};

// The operands of G heads (q: [G][d] post-RoPE, not transformed).
std::vector<QueryOperand> make_query_operands(const float* q, int G, int d, const Recipe& r);

// Logit of quantized key `i` of `page`: ((sum_t dot_t * g_t) * g_K) * gamma, products in
// double (FP32 accumulation of exact products, rounded once per term).
float page_logit(const QueryOperand& op, const QuantPage& page, int i, float gamma);

}  // namespace fp4kv::ref
