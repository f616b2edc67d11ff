// Embedding gather on the GPU: out[t] = table[token_ids[t]], BF16 rows of the (BF16)
// embedding table [vocab][hidden], or of a vocabulary-parallel shard of it (tensor
// parallelism): the table then holds rows [table_first, table_first + table_rows) and an id
// outside them embeds as zeros (the ranks' all-reduce fills the row in).
//
// Invariants: an id outside [0, vocab) is never read through; it ORs kErrorTokenOutOfRange
// into error_flags[0] (sticky, common.h) and its output row is zero. No host
// synchronization (graph-capturable). The CPU twin is ref_embedding_gather (reference.h).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

namespace fp4kv::ops {

struct EmbeddingArgs {
  const int32_t* token_ids = nullptr;    // device [tokens]
  int tokens = 0;
  const __nv_bfloat16* table = nullptr;  // device [vocab][hidden]
  int vocab = 0;
  int hidden = 0;
  __nv_bfloat16* out = nullptr;          // device [tokens][hidden]
  int32_t* error_flags = nullptr;        // device [1], sticky
  int table_first = 0;                   // the shard's first id
  int table_rows = 0;                    // rows the table holds (0: all `vocab`)
};

// Throws fp4kv::Error naming the bad argument (sizes, null pointers) before launching.
void embedding_gather(const EmbeddingArgs& args, cudaStream_t stream);

}  // namespace fp4kv::ops
