// CPU twins of the GPU ops, for the tests: the same rounding points as each op's header,
// BF16 tensors as their bit patterns (uint16_t). Where an op's header leaves an order
// unspecified (a norm's sum of squares, the GEMM's accumulation), the twin computes in
// double, and the op's header derives the tolerance; elsewhere the twin is bit-identical
// (SwiGLU, embedding, sampling's choice of token).
#pragma once

#include <cstdint>
#include <vector>

#include "fp4kv/ops/qk_norm_rope.h"
#include "fp4kv/ops/sampling.h"

namespace fp4kv::ops {

// out [tokens][hidden]; ORs kErrorTokenOutOfRange into *error_flags for a bad id (its row zero).
// A shard table holds ids [table_first, table_first + table_rows) (0 rows: all of vocab); other
// ids embed as zeros (embedding.h).
std::vector<uint16_t> ref_embedding_gather(const std::vector<int32_t>& token_ids, const std::vector<uint16_t>& table,
                                           int vocab, int hidden, int32_t* error_flags, int table_first = 0,
                                           int table_rows = 0);

// y [rows][n] = rmsnorm(x) (rms_norm.h).
std::vector<uint16_t> ref_rms_norm(const std::vector<uint16_t>& x, const std::vector<uint16_t>& weight, int rows,
                                   int n, float eps);
// residual = bf16(residual + delta) in place; returns rmsnorm(residual).
std::vector<uint16_t> ref_add_rms_norm(std::vector<uint16_t>& residual, const std::vector<uint16_t>& delta,
                                       const std::vector<uint16_t>& weight, int rows, int n, float eps);

struct QkvShape {
  int tokens = 0;
  int q_heads = 0;
  int kv_heads = 0;
  int head_dim = 0;
  float eps = 1e-6f;
};
struct QkvOutputs {
  std::vector<uint16_t> q;  // [tokens][q_heads][head_dim] BF16 bits
  std::vector<float> k, v;  // [tokens][kv_heads][head_dim]
  int32_t error_flags = 0;
};
QkvOutputs ref_qk_norm_rope(const std::vector<uint16_t>& qkv, const std::vector<int32_t>& positions,
                            const std::vector<uint16_t>& q_norm, const std::vector<uint16_t>& k_norm,
                            const RopeTable& rope, const QkvShape& shape);

// out [rows][intermediate] from gate_up [rows][2 intermediate].
std::vector<uint16_t> ref_swiglu(const std::vector<uint16_t>& gate_up, int rows, int intermediate);

// moe.h's routing, bit for bit: experts ascending and BF16-valued weights, [rows][top_k];
// error_flags gets kErrorRouterLogit for a row with a non-finite logit (experts 0..k-1, weight 0).
struct MoeRouteReference {
  std::vector<int32_t> experts;
  std::vector<float> weights;
  int32_t error_flags = 0;
};
MoeRouteReference ref_moe_route(const std::vector<uint16_t>& logits, int rows, int num_experts, int top_k,
                                bool normalize_top_k);

// moe_experts' act [rows][top_k][intermediate] with the gate and up products in double (then
// rounded as the kernel rounds its FP32 sums), and those exact products and their error
// scales sum |x w| (for the tolerance of tests/ops), all [rows][top_k][intermediate].
struct MoeExpertsReference {
  std::vector<uint16_t> act;
  std::vector<double> gate, up, gate_abs, up_abs;
};
// `held`: the experts gate_up holds (moe.h's expert parallelism); pairs of other experts are
// left zero.
struct ExpertRange {
  int first = 0;
  int count = 0;  // 0: every expert an id names
  bool holds(int e) const { return count == 0 || (e >= first && e < first + count); }
};
MoeExpertsReference ref_moe_experts(const std::vector<uint16_t>& x, const std::vector<uint16_t>& gate_up,
                                    const std::vector<int32_t>& experts, int rows, int top_k, int hidden,
                                    int intermediate, ExpertRange held = {});

// moe_combine's out [rows][hidden] with the down products in double, and those products and
// their error scales, [rows][top_k][hidden]; only the `held` experts' pairs count (others' y 0).
struct MoeCombineReference {
  std::vector<uint16_t> out;
  std::vector<double> y, y_abs;
};
MoeCombineReference ref_moe_combine(const std::vector<uint16_t>& act, const std::vector<uint16_t>& down,
                                    const std::vector<int32_t>& experts, const std::vector<float>& weights, int rows,
                                    int top_k, int hidden, int intermediate, ExpertRange held = {});

// Y = X W^T in double from the BF16 inputs, and sum_k |x w| per output (the error scale).
struct GemmReference {
  std::vector<double> y;        // [m][n]
  std::vector<double> abs_sum;  // [m][n]
};
GemmReference ref_gemm(const std::vector<uint16_t>& x, const std::vector<uint16_t>& w, int m, int n, int k);
GemmReference ref_gemm(const uint16_t* x, const uint16_t* w, int m, int n, int k);  // x [m][k], w [n][k]

}  // namespace fp4kv::ops
