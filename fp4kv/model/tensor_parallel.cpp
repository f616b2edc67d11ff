#include "fp4kv/model/tensor_parallel.h"

#include <algorithm>

#include "fp4kv/core/error.h"

namespace fp4kv::model {

TpSlice tp_slice(const Qwen3Config& c, int rank, int ranks) {
  if (ranks < 1) throw Error("tensor parallelism: " + std::to_string(ranks) + " ranks (at least 1)");
  if (rank < 0 || rank >= ranks)
    throw Error("tensor parallelism: rank " + std::to_string(rank) + " outside [0, " + std::to_string(ranks) + ")");
  std::vector<std::string> bad;
  auto check = [&](const char* what, int count) {
    if (count % ranks != 0) bad.push_back(std::string(what) + " " + std::to_string(count));
  };
  check("num_attention_heads", c.num_attention_heads);
  check("num_key_value_heads", c.num_key_value_heads);
  if (c.has_dense_layer()) check("intermediate_size", c.intermediate_size);
  if (c.is_moe()) check("num_experts", c.num_experts);
  check("vocab_size", c.vocab_size);
  if (!bad.empty()) {
    std::string msg = "tensor parallelism over " + std::to_string(ranks) + " ranks needs counts that divide by " +
                      std::to_string(ranks) + "; this model has";
    for (size_t i = 0; i < bad.size(); ++i) msg += (i ? ", " : " ") + bad[i];
    throw Error(msg);
  }
  TpSlice s;
  s.rank = rank;
  s.ranks = ranks;
  s.heads = c.num_attention_heads / ranks;
  s.first_head = rank * s.heads;
  s.kv_heads = c.num_key_value_heads / ranks;
  s.first_kv_head = rank * s.kv_heads;
  s.inter = c.intermediate_size / ranks;
  s.first_inter = rank * s.inter;
  s.experts = c.num_experts / ranks;
  s.first_expert = rank * s.experts;
  s.vocab = c.vocab_size / ranks;
  s.first_vocab = rank * s.vocab;
  return s;
}

Qwen3Config rank_attention_config(const Qwen3Config& c, int ranks) {
  const TpSlice s = tp_slice(c, 0, ranks);
  Qwen3Config r = c;
  r.num_attention_heads = s.heads;
  r.num_key_value_heads = s.kv_heads;
  return r;
}

std::vector<float> slice_rows(const std::vector<float>& m, int cols, int first, int count) {
  const size_t begin = size_t(first) * cols, n = size_t(count) * cols;
  if (first < 0 || count < 0 || begin + n > m.size()) throw Error("slice_rows: rows outside the matrix");
  return std::vector<float>(m.begin() + long(begin), m.begin() + long(begin + n));
}

std::vector<float> slice_cols(const std::vector<float>& m, int cols, int first, int count) {
  if (cols <= 0 || m.size() % size_t(cols) != 0 || first < 0 || count < 0 || first + count > cols)
    throw Error("slice_cols: columns outside the matrix");
  const size_t rows = m.size() / size_t(cols);
  std::vector<float> out(rows * size_t(count));
  for (size_t r = 0; r < rows; ++r) std::copy_n(m.begin() + long(r * cols + first), count, out.begin() + long(r * count));
  return out;
}

}  // namespace fp4kv::model
