// The argument blocks the host fills for the decode and combine kernels, and the kernel
// selection keys (operand mode, query/probability rules). Plain data: one struct per
// launch, passed by value as the kernel parameter.
#pragma once

#include <cstdint>

namespace fp4kv::attention::detail {

inline constexpr int kThreads = 256;  // 8 warps per CTA
inline constexpr int kWarps = 8;
inline constexpr int kMaxG = 16;  // query heads per KV head

// Element type of the queries the kernels read and of the output the combine writes.
enum class IoType : int { f32 = 0, bf16 = 1 };

// Operand mode of a kernel instance (compile time): what Q and P are in the two products.
// kOm16: 16-bit Q and P (mixed FP4 pages, FP8, BF16); kOmFp4: one FP4 query term and FP4 P
// (vanilla native, native without dual-residual Q); kOmDual: two FP4 query terms (T = 2)
// and FP4 P. The exact query/P rules within a mode are the run-time qmode/pmode below.
enum OperandMode : int { kOm16 = 0, kOmFp4 = 1, kOmDual = 2 };
constexpr int query_terms(int om) { return om == kOmDual ? 2 : 1; }

// Query/probability handling, chosen at run time (uniform per launch).
enum QMode : int { kQHalf = 0, kQFp4 = 1, kQDual = 2, kQBf16 = 3 };
enum PMode : int { kPHalf = 0, kPNvMax6 = 1, kPNvUnderflow = 2, kPMx = 3, kPBf16 = 4 };

struct KernelArgs {
  const uint8_t* pool;
  long long block_stride;
  int head_bytes;  // layout.bytes
  int kv_heads, q_heads, G;
  const uint16_t* slot_buffer;
  int slots;
  const void* q;  // [batch][q_heads][d] of q_type
  IoType q_type;
  const int32_t* block_tables;
  const int32_t* seq_lens;
  int batch, max_pages;
  const int32_t* row_slot;
  const int32_t* row_splits;
  const int32_t* row_pps;
  const int32_t* error_flags;
  const int32_t* num_rows;  // [1] or null: rows >= *num_rows have no work
  int max_splits;
  float* part_o;    // [batch][q_heads][max_splits + 1][d]
  float* part_lse;  // [batch][q_heads][max_splits + 1]
  int qmode, pmode;
  int rotate, sink, recent;  // recipe switches (bf16_sink, bf16_recent)
  float log2c, tau, gamma;
};

struct CombineArgs {
  int batch, q_heads, G, kv_format, sink, recent;
  const int32_t* seq_lens;
  const int32_t* row_splits;
  const int32_t* row_pps;
  const int32_t* error_flags;
  const int32_t* num_rows;
  int max_splits;
  const float* part_o;
  const float* part_lse;
  // q and out are of the combine instance's I/O type (its template argument, the run's).
  const void* q;      // read only for the LSE's mu_k shift
  const float* mu_k;  // [kv_heads][d] or null (only when the recipe smooths keys)
  void* out;          // [batch][q_heads][d]
  float* lse;
};

}  // namespace fp4kv::attention::detail
