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
std::vector<uint16_t> ref_embedding_gather(const std::vector<int32_t>& token_ids, const std::vector<uint16_t>& table,
                                           int vocab, int hidden, int32_t* error_flags);

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

// Y = X W^T in double from the BF16 inputs, and sum_k |x w| per output (the error scale).
struct GemmReference {
  std::vector<double> y;        // [m][n]
  std::vector<double> abs_sum;  // [m][n]
};
GemmReference ref_gemm(const std::vector<uint16_t>& x, const std::vector<uint16_t>& w, int m, int n, int k);

}  // namespace fp4kv::ops
