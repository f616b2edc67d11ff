// Chunked-prefill attention on tensor cores over the fp4kv cache (semantics:
// ref/prefill_attention.h, docs/DESIGN.md "Prefill attention").
//
// A prompt chunk of T tokens at positions start .. start + T - 1 attends
//   (a) to the `start` tokens before it as the cache holds them (quantized pages in the
//       cache's own format, the BF16 sink and recent rows): each window of up to
//       `prefix_window` prefix tokens is expanded exactly into a BF16 workspace (code x
//       block scale; the page scales stay FP32 factors of the tile) and attended with the
//       recipe-transformed query H q (rounded to BF16) plus the logit shift q . mu_k, and
//   (b) causally to its own keys and values, given in BF16,
// as one softmax: every pass continues the previous pass's state. Long prompts never need a
// BF16 copy of their whole prefix, only of one window.
//
// Call order per layer: KvCache::begin_prefill(block_row, start, T) once per chunk (it claims
// the request's slot), then run() for the layer, then KvCache::prefill(layer, k, v): run()
// reads the prefix as it was before this chunk was written.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "fp4kv/cache/kv_cache.h"

namespace fp4kv::attention {

namespace detail {
struct FlashArgs;  // prefill_flash.cuh
}

// The tensor-core instruction of the attention passes: mma.sync (head_dim 64 and 128, cta_rows
// 64 or 128) or Hopper's warpgroup MMA (head_dim 128: three warpgroups of 64 rows per CTA,
// cta_rows not used; head_dim 64 runs mma.sync). Both compute the same softmax with FP32
// accumulation; they may differ in the order of the FP32 sums. The default is the warpgroup
// kernel: on the H200 it is the faster one for every chunk measured, from 128 tokens (32 CTAs
// for 32 heads) up (docs/PERF.md).
enum class PrefillMma { sync, warpgroup };

struct PrefillConfig {
  int q_heads = 0;
  int max_chunk_tokens = 2048;  // T of one run
  int prefix_window = 16384;    // prefix tokens expanded per pass (multiple of 128)
  // Query rows per CTA of the attention kernel: 64 (16 per warp) or 128 (32 per warp: half
  // the shared-memory reads per MMA, more registers); a speed choice, the same numbers.
  int cta_rows = 64;
  PrefillMma mma = PrefillMma::warpgroup;
};

class PrefillAttention {
 public:
  // Validates the geometry against the cache (head_dim 64 or 128, q_heads a multiple of
  // kv_heads) and allocates the workspace. Throws fp4kv::Error naming the bad value.
  PrefillAttention(const cache::KvCache& cache, const PrefillConfig& config);
  static constexpr int kNarrowCtaRows = 64, kWideCtaRows = 128;
  static constexpr int kWarpgroupHeadDim = 128;  // the head size the wgmma kernel takes
  // Whether the prefill kernel has a variant for this head size (64, 128).
  static bool supports_head_dim(int head_dim) { return head_dim == 64 || head_dim == 128; }
  ~PrefillAttention();
  PrefillAttention(const PrefillAttention&) = delete;
  PrefillAttention& operator=(const PrefillAttention&) = delete;

  // q: [T][q_heads][head_dim], k, v: [T][kv_heads][head_dim] (post-RoPE, not transformed),
  // out: [T][q_heads][head_dim], all BF16 bits on the device; lse: [T][q_heads] natural-log
  // LSE of the logits q.k / sqrt(d), or null. block_row: the request's block table row.
  void run(int layer, const int32_t* block_row, int start, int T, const uint16_t* q, const uint16_t* k,
           const uint16_t* v, uint16_t* out, float* lse, cudaStream_t stream) const;

  const PrefillConfig& config() const { return config_; }
  size_t workspace_bytes() const { return workspace_bytes_; }

 private:
  detail::FlashArgs pass_args(const uint16_t* q, int T) const;
  bool uses_warpgroup_mma() const;
  void transform_queries(int layer, int T, const uint16_t* q, cudaStream_t stream) const;
  void attend_prefix(int layer, const int32_t* block_row, int start, int T, cudaStream_t stream) const;

  const cache::KvCache& cache_;
  PrefillConfig config_;
  int group_ = 1;
  size_t workspace_bytes_ = 0;
  void* workspace_ = nullptr;
  // Pieces of the workspace.
  uint16_t* query_t_ = nullptr;      // [T][q_heads][d] BF16 transformed queries
  float* query_offset_ = nullptr;    // [T][q_heads] log2-unit logit shift q . mu_k
  float* state_o_ = nullptr;         // [T][q_heads][d]
  float* state_lse_ = nullptr;       // [T][q_heads]
  uint16_t* prefix_k_ = nullptr;     // [kv_heads][window rows][d] BF16
  uint16_t* prefix_v_ = nullptr;
  float* tile_k_factor_ = nullptr;   // [kv_heads][window rows / 64]
  float* tile_v_factor_ = nullptr;
  uint32_t* key_mask_ = nullptr;     // [kv_heads][window rows / 32]
  int window_rows_ = 0;              // prefix_window + the BF16 rows' tiles
};

}  // namespace fp4kv::attention
