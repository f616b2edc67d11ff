// Tensor parallelism (Megatron-LM's split of a transformer layer) for the Qwen3 family: which
// part of the model rank r of N holds, and the slicing of each weight into it.
//
//   attention  query heads and KV heads divided evenly: rank r holds heads
//              [r H/N, (r+1) H/N) and the KV heads they read, [r K/N, (r+1) K/N) (so a query
//              head's KV head is on its rank). QKV is column-parallel (its output rows), O
//              row-parallel (its input columns): each rank's O product is a partial sum,
//              all-reduced. Each rank caches only its KV heads.
//   dense MLP  gate/up column-parallel, down row-parallel over the intermediate dimension:
//              partial sums, all-reduced.
//   MoE block  expert parallel: rank r holds experts [r E/N, (r+1) E/N) whole; the router is
//              replicated, every rank routes every token, computes its own experts'
//              contributions, and the block's output is all-reduced.
//   embedding  vocabulary-parallel: rank r holds rows [r V/N, (r+1) V/N); a token outside
//   LM head    the slice embeds as zeros and the all-reduce fills it in; the LM head's
//              logits are the rank's vocabulary slice, all-gathered.
//   norms      replicated (QK-norm is per head, RMSNorm over the full hidden state that every
//              rank holds after each all-reduce).
//
// Every count must divide by N: a model that does not is refused with the list of what does
// not divide (no padding, no replicated KV heads).
#pragma once

#include <string>
#include <vector>

#include "fp4kv/model/qwen3_config.h"

namespace fp4kv::model {

// What rank `rank` of `ranks` holds: [first, first + count) of each divided dimension.
struct TpSlice {
  int rank = 0, ranks = 1;
  int first_head = 0, heads = 0;        // query heads
  int first_kv_head = 0, kv_heads = 0;
  int first_inter = 0, inter = 0;       // dense MLP intermediate channels
  int first_expert = 0, experts = 0;    // MoE experts (0 for a dense model)
  int first_vocab = 0, vocab = 0;
};

// Throws fp4kv::Error when ranks < 1, rank is outside [0, ranks) or a count does not divide.
TpSlice tp_slice(const Qwen3Config& c, int rank, int ranks);

// `c` as one rank of `ranks` sees its attention: its query heads and KV heads (the heads its
// cache holds; every rank's count is the same). Throws as tp_slice does.
Qwen3Config rank_attention_config(const Qwen3Config& c, int ranks);

// Rows [first, first + count) of a row-major [rows][cols] matrix.
std::vector<float> slice_rows(const std::vector<float>& m, int cols, int first, int count);
// Columns [first, first + count) of a row-major [rows][cols] matrix: [rows][count].
std::vector<float> slice_cols(const std::vector<float>& m, int cols, int first, int count);

}  // namespace fp4kv::model
