// Embedding gather kernel: one CTA per token; 16-byte copies when the row allows them.
#include "fp4kv/ops/embedding.h"

#include <string>

#include "fp4kv/cache/cuda_check.h"
#include "fp4kv/core/error.h"
#include "fp4kv/ops/bf16x8.cuh"
#include "fp4kv/ops/common.h"

namespace fp4kv::ops {
namespace {

constexpr int kThreads = 256;

__global__ void __launch_bounds__(kThreads)
    embedding_kernel(const int32_t* ids, const __nv_bfloat16* table, int vocab, int table_first, int table_rows,
                     int hidden, bool vectorized, __nv_bfloat16* out, int32_t* error_flags) {
  const int t = blockIdx.x;
  const int id = ids[t];
  if ((id < 0 || id >= vocab) && threadIdx.x == 0) atomicOr(error_flags, kErrorTokenOutOfRange);
  const bool valid = id >= table_first && id - table_first < table_rows;  // inside [0, vocab) too
  __nv_bfloat16* dst = out + size_t(t) * hidden;
  const __nv_bfloat16* src = table + size_t(valid ? id - table_first : 0) * hidden;
  if (vectorized) {
    const int vectors = hidden / kBf16PerLoad;
    for (int i = threadIdx.x; i < vectors; i += kThreads) {
      const uint4 x = valid ? reinterpret_cast<const uint4*>(src)[i] : make_uint4(0, 0, 0, 0);
      reinterpret_cast<uint4*>(dst)[i] = x;
    }
    return;
  }
  for (int i = threadIdx.x; i < hidden; i += kThreads) dst[i] = valid ? src[i] : __float2bfloat16_rn(0.0f);
}

}  // namespace

void embedding_gather(const EmbeddingArgs& a, cudaStream_t stream) {
  require(a.tokens >= 0, "embedding_gather: tokens " + std::to_string(a.tokens) + " is negative");
  require(a.vocab > 0, "embedding_gather: vocab " + std::to_string(a.vocab) + " must be positive");
  require(a.hidden > 0, "embedding_gather: hidden " + std::to_string(a.hidden) + " must be positive");
  const int table_rows = a.table_rows == 0 ? a.vocab : a.table_rows;
  if (a.table_first < 0 || table_rows < 1 || a.table_first + table_rows > a.vocab)  // every step: message on failure
    throw Error("embedding_gather: the table's rows [" + std::to_string(a.table_first) + ", " +
                std::to_string(a.table_first + table_rows) + ") are not inside the vocabulary of " +
                std::to_string(a.vocab));
  if (a.tokens == 0) return;
  require(a.token_ids && a.table && a.out && a.error_flags, "embedding_gather: a device pointer is null");
  const bool vectorized = a.hidden % kBf16PerLoad == 0 && aligned16(a.table) && aligned16(a.out);
  embedding_kernel<<<a.tokens, kThreads, 0, stream>>>(a.token_ids, a.table, a.vocab, a.table_first, table_rows,
                                                       a.hidden, vectorized, a.out, a.error_flags);
  cache::cuda_check_launch("embedding_gather");
}

}  // namespace fp4kv::ops
