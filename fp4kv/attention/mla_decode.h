// Multi-head latent attention (DeepSeek-V2/V3 MLA) decode over a paged latent cache, in the
// plan/run shape of decode.h: MlaDecodeAttention is built once per (geometry, recipe,
// capacity) and run once per layer of a step. Semantics: ref/mla.h (exact_mla for the BF16
// cache, MlaSequence::decode for the FP4 recipes): per head h of a row, with gamma = log2(e) /
// sqrt(d_nope + d_r),
//   s_t = gamma (q_c[h] . c_t + q_r[h] . r_t),   u[h] = sum_t softmax(s)_t c_t,
// the latent output u (W_V is the caller's) and the natural-log LSE of (q_c.c + q_r.r) /
// sqrt(d_nope + d_r).
//
// Formats (cache/layout.h LatentPageLayout): `bf16` (every token in the pool pages: the speed
// baseline) and the mixed-mode NVFP4 and MXFP4 recipes (`nvfp4`, `mxfp4` and their vanilla
// and ablation variants), whose pages hold the transformed latent c' = H (c - mu_c) and whose
// BF16 sink and recent rows live in the slot rows (layout.h latent_slot_row_offset).
// One CTA per (row, 16-head tile, split) streams its split's 64-token tiles (half pages)
// through shared memory with cp.async, the next tile's copy in flight while this one is
// computed (BF16: two stages, one CTA per SM; FP4: two CTAs per SM); per tile S = Q [C R]^T
// on mma.sync by eight warps of 8 tokens each, the online softmax over the CTA's 16 heads,
// P into shared memory, and O += P C by the same warps over 64 latent channels each, C read a second time
// from the same shared tile (transposed by ldmatrix). FP4 pages are expanded once per tile
// into an FP16 C tile (code x block scale, exact; MXFP4 relative to the page's largest block)
// and run on FP16 MMAs against the FP16 rotated query, the page factor on the FP32 partials;
// the BF16 rows (pool pages or slot rows) run on BF16 MMAs. FP4 caches add one CTA per
// (row, head tile) for the slot rows. A combine kernel merges the splits by LSE, rotates the
// output back and restores mu_c. Each head tile reads the latent once: a row with H heads
// reads it H / 16 times (mostly from L2, the tiles of one row running together).
//
// Invariants: latent_dim 512, rope_dim 64 (DeepSeek-V2/V3); heads a multiple of 16; q_c,
// q_r, out BF16 (out FP32 allowed), 16-byte aligned; runs of one object ordered on one
// stream (they share its workspace). A row with no tokens gets output 0 and LSE -inf.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "fp4kv/cache/layout.h"
#include "fp4kv/core/recipe.h"

namespace fp4kv::attention {

inline constexpr int kMlaHeadsPerCta = 16;  // one MMA m-tile: a CTA's heads
inline constexpr int kMlaTileTokens = 64;   // tokens per shared-memory tile (half a page)
inline constexpr int kMlaMaxHeads = 2048;   // far above any MLA model (DeepSeek-V3: 128 heads)

struct MlaGeometry {
  int heads = 0;          // query heads sharing the latent (a multiple of 16)
  int latent_dim = 512;   // d_c
  int rope_dim = 64;      // d_r
  int nope_dim = 128;     // d_nope of the content query before absorption: only the scale
};

struct MlaCapacity {
  int max_batch = 0;   // rows per step
  int max_pages = 0;   // pages per row: the row stride of the block tables
  int max_splits = 0;  // splits per row
};

// One layer of the latent cache and one step's rows. Device pointers.
struct MlaStep {
  const uint8_t* pool = nullptr;          // cache block 0 of this layer (16-byte aligned)
  long long block_stride = 0;             // bytes between blocks (>= the page's bytes, multiple of 16)
  const int32_t* block_tables = nullptr;  // [batch][capacity.max_pages]
  // [batch]: tokens each row attends (< 1: output 0, LSE -inf; at most capacity.max_pages x
  // 128: a longer row ends at its table's last page)
  const int32_t* seq_lens = nullptr;
  int batch = 0;
  int splits = 1;                         // 1 .. capacity.max_splits: each row's pages cut into this many parts
  // FP4 caches only (ignored for bf16):
  const uint16_t* slot_rows = nullptr;    // this layer's BF16 slot rows [slots][144][latent_dim + rope_dim]
  const int32_t* row_slot = nullptr;      // [batch] slot of each row (< 0: the row has no BF16 rows)
  const float* mu_c = nullptr;            // [latent_dim] the layer's latent mean (smoothing recipes), or null (zero)
};

class MlaDecodeAttention {
 public:
  // Validates (fp4kv::Error naming the bad value, before any CUDA call), allocates the
  // workspace and configures the kernel. Call outside graph capture.
  MlaDecodeAttention(const MlaGeometry& geometry, const Recipe& recipe, const MlaCapacity& capacity);
  ~MlaDecodeAttention();
  MlaDecodeAttention(const MlaDecodeAttention&) = delete;
  MlaDecodeAttention& operator=(const MlaDecodeAttention&) = delete;

  // The constructor's checks alone (no CUDA call).
  static void check_supported(const MlaGeometry& geometry, const Recipe& recipe, const MlaCapacity& capacity);

  // q_c: [batch][heads][latent_dim], q_r: [batch][heads][rope_dim] (post-RoPE); out:
  // [batch][heads][latent_dim]; lse: [batch][heads] (may be null). Graph-safe; throws
  // fp4kv::Error for a step outside the capacity or null pointers.
  void run(const MlaStep& step, const __nv_bfloat16* q_c, const __nv_bfloat16* q_r, float* out, float* lse,
           cudaStream_t stream = nullptr);
  void run(const MlaStep& step, const __nv_bfloat16* q_c, const __nv_bfloat16* q_r, __nv_bfloat16* out, float* lse,
           cudaStream_t stream = nullptr);

  const cache::LatentPageLayout& layout() const { return layout_; }

 private:
  void run_typed(const MlaStep& step, const __nv_bfloat16* q_c, const __nv_bfloat16* q_r, void* out, bool bf16_out,
                 float* lse, cudaStream_t stream);

  MlaGeometry geometry_;
  Recipe recipe_;
  MlaCapacity capacity_;
  cache::LatentPageLayout layout_;
  float* partial_out_ = nullptr;  // [max_batch][heads][max_splits + 1][latent_dim], normalized
  float* partial_lse_ = nullptr;  // [max_batch][heads][max_splits + 1], log2 units
  float* lse_shift_ = nullptr;    // [max_batch][heads]: q_c . mu_c / sqrt(d_nope + d_r), nats
};

}  // namespace fp4kv::attention
