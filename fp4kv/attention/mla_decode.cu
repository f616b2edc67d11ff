// MLA decode (mla_decode.h): the split kernel per cache format and the combine.
//
// A split CTA: one batch row, 16 heads (one MMA m-tile), one split of the row's 64-token page
// tiles, or (FP4 caches, z == splits) the row's BF16 slot rows. Per tile (barriers in
// brackets): [0] the tile has landed and every warp is past the stage the next copy reuses;
// FP4: the codes expand into the FP16 C tile [expanded]; S for warp w's 8 tokens, its row
// maxima to shared memory [A] the tile maxima, new running maxima, P into shared memory, row
// sums [B] O[16][64 channels of warp w] = rescale O + P C. O stays in units of the current
// page factor f (FP4: g x 2^14; 1 for BF16 rows): a new page rescales it by alpha f_old / f.
#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>

#include "fp4kv/attention/lse_merge.cuh"
#include "fp4kv/attention/mla_decode.h"
#include "fp4kv/attention/mla_tiles.cuh"
#include "fp4kv/cache/cuda_check.h"
#include "fp4kv/core/error.h"

namespace fp4kv::attention {
namespace detail {
namespace {

struct MlaArgs {
  const uint8_t* pool = nullptr;
  long long block_stride = 0;
  const int32_t* block_tables = nullptr;
  const int32_t* seq_lens = nullptr;
  int max_pages = 0, heads = 0, splits = 1;
  int parts = 1;                    // partials per head: splits (+ 1 for FP4 caches' slot rows)
  cache::LatentPageLayout layout;
  QueryArgs query;
  const uint16_t* slot_rows = nullptr;  // [slots][144][576] BF16 bits
  const int32_t* row_slot = nullptr;
  bool sink = false, recent = true;     // the recipe's BF16 rows (split_plan.h attended_layout)
  float scale_log2 = 0.0f;          // log2(e) / sqrt(d_nope + d_r)
  float scale = 0.0f;               // 1 / sqrt(d_nope + d_r)
  float* partial_out = nullptr;     // [batch][heads][parts][512]
  float* partial_lse = nullptr;     // [batch][heads][parts], log2 units
  float* lse_shift = nullptr;       // [batch][heads], nats
};

// One CTA's running state: the softmax of its two rows per thread, O in units of `units`.
struct MlaState {
  MlaSoftmax sm{{neg_inf(), neg_inf()}, {0.0f, 0.0f}};
  float o[8][4] = {};
  float units = 0.0f;  // page factor O is expressed in (0: nothing accumulated yet)
};

// The tiles [first, end) of split `split` out of `count`.
struct TileRange {
  int first = 0, end = 0;
};
__device__ __forceinline__ TileRange split_range(int count, int splits, int split) {
  const int per = (count + splits - 1) / splits;
  TileRange r;
  r.first = min(count, split * per);
  r.end = min(count, r.first + per);
  return r;
}

// Row length as attended: a row ends at its table's last page.
__device__ __forceinline__ int row_tokens(const MlaArgs& a, int row) {
  return min(max(a.seq_lens[row], 0), a.max_pages * kPageTokens);
}

__device__ __forceinline__ const uint8_t* page_base(const MlaArgs& a, int row, int page) {
  return a.pool + size_t(a.block_tables[size_t(row) * a.max_pages + page]) * size_t(a.block_stride);
}

// O = rescale O + P C with the page factor: O stays in units of the current tile's factor f.
template <class Mma>
__device__ __forceinline__ void context_in_units(uint32_t p_tile, uint32_t c_tile, const float (&alpha)[2], float f,
                                                 MlaState& st) {
  const float ratio = st.units == 0.0f || st.units == f ? 1.0f : __fdiv_rn(st.units, f);
  st.units = f;
  const float rescale[2] = {alpha[0] * ratio, alpha[1] * ratio};
  tile_context<Mma>(p_tile, c_tile, rescale, st.o);
}

// The tile's softmax with the reductions and P of shared-memory plan Plan (alpha returned).
template <class Mma, class Plan>
__device__ __forceinline__ void plan_softmax(const float (&s)[4], uint8_t* smem, MlaState& st, float (&alpha)[2]) {
  tile_softmax<Mma>(s, smem + Plan::kP, reinterpret_cast<float*>(smem + Plan::kMax),
                    reinterpret_cast<float*>(smem + Plan::kSum), st.sm, alpha);
}

// Softmax and context of a tile whose masked base-2 logits are `s` and whose C tile (of
// Mma's type) holds page factor f.
template <class Mma, class Plan>
__device__ __forceinline__ void softmax_context(const float (&s)[4], float f, uint8_t* smem, uint32_t c_tile,
                                                MlaState& st) {
  float alpha[2];
  plan_softmax<Mma, Plan>(s, smem, st, alpha);
  context_in_units<Mma>(smem_u32(smem + Plan::kP), c_tile, alpha, f, st);
}

// BF16 cache: shared memory of stage i % 2.
__device__ __forceinline__ uint8_t* bf16_stage(uint8_t* smem, int i) {
  return smem + MlaBf16Plan::kStage + (i % 2) * MlaBf16Plan::kStageBytes;
}

// BF16 cache: copies page tile `tile` of the row (C, then R after it) into a stage.
__device__ __forceinline__ void load_bf16_page_tile(const MlaArgs& a, int row, const PageTiles& pt, int tile,
                                                    uint32_t stage) {
  const uint8_t* base = page_base(a, row, tile / kMlaTilesPerPage);
  const int first_token = (tile % kMlaTilesPerPage) * kMlaTileTokens;
  load_bf16_rows(base + a.layout.c_codes + size_t(first_token) * kMlaLatent * 2,
                 base + a.layout.r_rows + size_t(first_token) * kMlaRope * 2, kMlaLatent * 2, kMlaRope * 2,
                 page_tile_rows(pt, tile), stage, stage + kCTileBytes);
}

// BF16 cache: the split's tiles straight from the pool pages, double-buffered.
__device__ void run_bf16_pages(const MlaArgs& a, int row, int split, uint8_t* smem, MlaState& st) {
  using Plan = MlaBf16Plan;
  const PageTiles pt = page_tiles(cache::attended_layout(row_tokens(a, row), KvFormat::bf16, false, true));
  const TileRange tr = split_range(pt.count, a.splits, split);
  if (tr.first >= tr.end) return;
  const uint32_t qb = smem_u32(smem + Plan::kQb);
  load_queries_bf16(a.query.q_c, a.query.q_r, size_t(row) * a.heads + blockIdx.y * kMlaHeadsPerCta, qb);
  load_bf16_page_tile(a, row, pt, tr.first, smem_u32(bf16_stage(smem, 0)));
  cp_async_commit();
  for (int tile = tr.first; tile < tr.end; ++tile) {
    const int i = tile - tr.first;
    const uint32_t stage = smem_u32(bf16_stage(smem, i));
    cp_async_wait<0>();
    __syncthreads();  // [0]
    if (tile + 1 < tr.end) {
      load_bf16_page_tile(a, row, pt, tile + 1, smem_u32(bf16_stage(smem, i + 1)));
      cp_async_commit();
    }
    float s[4] = {};
    tile_scores<MmaBf16, kLatentChunks, kQkChunks>(qb, 0, stage, s);
    tile_scores<MmaBf16, kRopeChunks, kQkChunks>(qb, kLatentChunks, stage + kCTileBytes, s);
#pragma unroll
    for (int e = 0; e < 4; ++e) s[e] *= a.scale_log2;
    mask_scores(page_tile_rows(pt, tile), s);
    softmax_context<MmaBf16, Plan>(s, 1.0f, smem, stage, st);
  }
}

// FP4 caches: the split's page tiles. Per tile: [0] codes and R landed, C free; expand;
// [expanded] the raw stage is free: the next tile's codes start; S; after the softmax's
// barriers every warp is past S: the next tile's R starts; P C.
template <KvFormat F>
__device__ void run_fp4_pages(const MlaArgs& a, int row, int split, const PageTiles& pt, uint8_t* smem,
                              MlaState& st) {
  using Plan = MlaFp4Plan<F>;
  using Raw = MlaFp4Raw<F>;
  const TileRange tr = split_range(pt.count, a.splits, split);
  if (tr.first >= tr.end) return;
  const uint32_t q16 = smem_u32(smem + Plan::kQ), qr = smem_u32(smem + Plan::kQr);
  const uint32_t c_tile = smem_u32(smem + Plan::kC), r_tile = smem_u32(smem + Plan::kR);
  const uint32_t raw = smem_u32(smem + Plan::kRaw), p_tile = smem_u32(smem + Plan::kP);
  const int half0 = tr.first % kMlaTilesPerPage;
  const uint8_t* page0 = page_base(a, row, tr.first / kMlaTilesPerPage);
  load_fp4_codes<F>(page0, a.layout, half0, raw);
  load_page_rope(page0, a.layout, half0, page_tile_rows(pt, tr.first), r_tile);
  cp_async_commit();
  for (int tile = tr.first; tile < tr.end; ++tile) {
    const TileRows rows = page_tile_rows(pt, tile);
    const bool next = tile + 1 < tr.end;
    const uint8_t* next_page = next ? page_base(a, row, (tile + 1) / kMlaTilesPerPage) : nullptr;
    cp_async_wait<0>();
    __syncthreads();  // [0]
    const float page_scale = *reinterpret_cast<const float*>(smem + Plan::kRaw + Raw::kPageScale);
    expand_fp4_tile<F>(smem + Plan::kRaw, page_scale, rows, smem + Plan::kC);
    __syncthreads();  // [expanded]
    if (next) {
      load_fp4_codes<F>(next_page, a.layout, (tile + 1) % kMlaTilesPerPage, raw);
      cp_async_commit();
    }
    const float f = fp4_tile_factor<F>(page_scale);
    float sc[4] = {}, sr[4] = {}, s[4];
    tile_scores<MmaF16, kLatentChunks, kLatentChunks>(q16, 0, c_tile, sc);
    tile_scores<MmaBf16, kRopeChunks, kRopeChunks>(qr, 0, r_tile, sr);
    // The reference's order: ((S_c x g) x gamma) + (S_r x gamma).
#pragma unroll
    for (int e = 0; e < 4; ++e)
      s[e] = __fadd_rn(__fmul_rn(__fmul_rn(sc[e], f), a.scale_log2), __fmul_rn(sr[e], a.scale_log2));
    mask_scores(rows, s);
    float alpha[2];
    plan_softmax<MmaF16, Plan>(s, smem, st, alpha);
    if (next) {  // every warp is past S (two barriers in the softmax)
      load_page_rope(next_page, a.layout, (tile + 1) % kMlaTilesPerPage, page_tile_rows(pt, tile + 1), r_tile);
      cp_async_commit();
    }
    context_in_units<MmaF16>(p_tile, c_tile, alpha, f, st);
  }
}

// FP4 caches: the row's BF16 sink and recent rows from its slot (at most three tiles).
template <KvFormat F>
__device__ void run_slot_rows(const MlaArgs& a, int row, const DecodeLayout& l, uint8_t* smem, MlaState& st) {
  using Plan = MlaFp4Plan<F>;
  const int slot = a.row_slot[row];
  if (slot < 0 || l.bf16_tokens() == 0) return;
  const uint32_t qb = smem_u32(smem + Plan::kQ), c_tile = smem_u32(smem + Plan::kC);
  const uint32_t r_tile = smem_u32(smem + Plan::kR);
  constexpr int kRowBytes = kMlaQk * 2;
  const uint8_t* rows0 = reinterpret_cast<const uint8_t*>(a.slot_rows) + size_t(slot) * cache::kSlotRows * kRowBytes;
  const int recent = l.recent_end - l.recent_begin;
  for (int tile = 0; tile < kSlotTiles; ++tile) {
    const TileRows rows = slot_tile_rows(l.sink_tokens, recent, tile);
    if (rows.empty()) continue;
    __syncthreads();  // every warp is past the previous tile's C and R
    const uint8_t* src = rows0 + size_t(tile) * kMlaTileTokens * kRowBytes;
    load_bf16_rows(src, src + kMlaLatent * 2, kRowBytes, kRowBytes, rows, c_tile, r_tile);
    cp_async_commit();
    cp_async_wait<0>();
    __syncthreads();  // [0]
    float s[4] = {};
    tile_scores<MmaBf16, kLatentChunks, kQkChunks>(qb, 0, c_tile, s);
    tile_scores<MmaBf16, kRopeChunks, kQkChunks>(qb, kLatentChunks, r_tile, s);
#pragma unroll
    for (int e = 0; e < 4; ++e) s[e] *= a.scale_log2;
    mask_scores(rows, s);
    softmax_context<MmaBf16, Plan>(s, 1.0f, smem, c_tile, st);
  }
}

// This CTA's normalized O and its LSE (log2 units; -inf and zeros when it saw no token).
__device__ __forceinline__ void store_partial(const MlaArgs& a, int row, const MlaState& st) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
#pragma unroll
  for (int rr = 0; rr < 2; ++rr) {
    const size_t head = size_t(row) * a.heads + blockIdx.y * kMlaHeadsPerCta + g + 8 * rr;
    const size_t part = head * a.parts + blockIdx.z;
    const float l = st.sm.l[rr];
    const float inv = l > 0.0f ? st.units / l : 0.0f;
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) {
      const int c = warp * 64 + nt * 8 + 2 * t;
      *reinterpret_cast<float2*>(a.partial_out + part * kMlaLatent + c) =
          make_float2(st.o[nt][2 * rr] * inv, st.o[nt][2 * rr + 1] * inv);
    }
    if (warp == 0 && t == 0) a.partial_lse[part] = l > 0.0f ? st.sm.m[rr] + __log2f(l) : neg_inf();
  }
}

// Grid (batch, heads / 16, parts). FP4 caches: two CTAs per SM (MlaFp4Plan).
template <KvFormat F>
__global__ void __launch_bounds__(kMlaThreads, F == KvFormat::bf16 ? 1 : kMlaFp4CtasPerSm)
    mla_split_kernel(const MlaArgs a) {
  extern __shared__ __align__(128) uint8_t smem[];
  const int row = blockIdx.x;
  MlaState st;
  if constexpr (F == KvFormat::bf16) {
    run_bf16_pages(a, row, blockIdx.z, smem, st);
  } else {
    const DecodeLayout l = cache::attended_layout(row_tokens(a, row), F, a.sink, a.recent);
    const PageTiles pt = page_tiles(l);
    const bool slot_cta = int(blockIdx.z) == a.splits;
    const TileRange tr = split_range(pt.count, a.splits, blockIdx.z);
    const bool has_work = slot_cta ? l.bf16_tokens() > 0 && a.row_slot[row] >= 0 : tr.first < tr.end;
    if (has_work || blockIdx.z == 0) {
      float shift[2];
      load_queries_fp4(a.query, size_t(row) * a.heads + blockIdx.y * kMlaHeadsPerCta, slot_cta,
                       smem + MlaFp4Plan<F>::kQ, shift);
      const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
      if (blockIdx.z == 0 && lane == 0) {
        for (int hh = 0; hh < 2; ++hh)
          a.lse_shift[size_t(row) * a.heads + blockIdx.y * kMlaHeadsPerCta + 2 * warp + hh] = shift[hh] * a.scale;
      }
    }
    if (slot_cta) run_slot_rows<F>(a, row, l, smem, st);
    else run_fp4_pages<F>(a, row, blockIdx.z, pt, smem, st);
  }
  store_partial(a, row, st);
}

constexpr int kCombineWarps = 4;
constexpr int kCombineChannels = kMlaLatent / 32;  // per lane: the warp_fwht layout

struct MlaCombineArgs {
  const float* partial_out = nullptr;
  const float* partial_lse = nullptr;
  const float* lse_shift = nullptr;  // null: no shift
  const float* mu_c = nullptr;       // null: nothing to restore
  bool rotate = false;
  int parts = 1, heads_total = 0;
  void* out = nullptr;
  float* lse = nullptr;
};

// A warp per head: the parts merged by LSE (lse_merge.cuh's weights), then (FP4 recipes) the
// rotation undone and mu_c restored, u = H^T u' + mu_c; lane l holds channels 16 l .. 16 l + 15.
template <bool kBf16Out>
__global__ void __launch_bounds__(kCombineWarps * 32) mla_combine_kernel(const MlaCombineArgs a) {
  const int lane = threadIdx.x % 32;
  const size_t head = size_t(blockIdx.x) * kCombineWarps + threadIdx.x / 32;
  if (head >= size_t(a.heads_total)) return;
  const float* lses = a.partial_lse + head * a.parts;
  float big = neg_inf();
  for (int s = 0; s < a.parts; ++s) big = fmaxf(big, lses[s]);
  cache::detail::RowFrag<kMlaLatent> u;
#pragma unroll
  for (int k = 0; k < kCombineChannels; ++k) u.x[k] = 0.0f;
  float wsum = 0.0f;
  for (int s = 0; s < a.parts; ++s) {
    const float w = merge_weight(lses[s], big);
    if (w == 0.0f) continue;
    wsum += w;
    const float4* o = reinterpret_cast<const float4*>(a.partial_out + (head * a.parts + s) * kMlaLatent) + lane * 4;
#pragma unroll
    for (int k = 0; k < kCombineChannels / 4; ++k) {
      const float4 v = o[k];
      u.x[4 * k] = fmaf(w, v.x, u.x[4 * k]);
      u.x[4 * k + 1] = fmaf(w, v.y, u.x[4 * k + 1]);
      u.x[4 * k + 2] = fmaf(w, v.z, u.x[4 * k + 2]);
      u.x[4 * k + 3] = fmaf(w, v.w, u.x[4 * k + 3]);
    }
  }
  const float inv = wsum > 0.0f ? 1.0f / wsum : 0.0f;
#pragma unroll
  for (int k = 0; k < kCombineChannels; ++k) u.x[k] *= inv;
  if (wsum > 0.0f) {  // an empty row stays 0
    if (a.rotate) cache::detail::warp_fwht<kMlaLatent>(u, lane);
    if (a.mu_c) {
#pragma unroll
      for (int k = 0; k < kCombineChannels; ++k) u.x[k] = __fadd_rn(u.x[k], a.mu_c[lane * kCombineChannels + k]);
    }
  }
#pragma unroll
  for (int k = 0; k < kCombineChannels; ++k) {
    const size_t i = head * kMlaLatent + lane * kCombineChannels + k;
    if constexpr (kBf16Out) static_cast<__nv_bfloat16*>(a.out)[i] = __float2bfloat16_rn(u.x[k]);
    else static_cast<float*>(a.out)[i] = u.x[k];
  }
  if (lane == 0 && a.lse != nullptr) {
    const float shift = a.lse_shift ? a.lse_shift[head] : 0.0f;
    a.lse[head] = wsum > 0.0f ? (big + __log2f(wsum)) * kLn2 + shift : neg_inf();
  }
}

template <KvFormat F>
constexpr int split_smem_bytes() {
  if constexpr (F == KvFormat::bf16) return MlaBf16Plan::kBytes;
  else return MlaFp4Plan<F>::kBytes;
}

template <KvFormat F>
void set_smem_limit() {
  cache::cuda_check(cudaFuncSetAttribute(mla_split_kernel<F>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         split_smem_bytes<F>()),
                    "MlaDecodeAttention: shared-memory limit of the split kernel");
}

template <KvFormat F>
void launch_split(const MlaArgs& a, dim3 grid, cudaStream_t stream) {
  mla_split_kernel<F><<<grid, kMlaThreads, split_smem_bytes<F>(), stream>>>(a);
}

}  // namespace
}  // namespace detail

namespace {

bool fp4_latent(KvFormat f) { return f == KvFormat::nvfp4 || f == KvFormat::mxfp4; }

constexpr int kMaxGridDim = 65535;  // CUDA's limit on gridDim.y and .z (the parts); the batch keeps to it too

}  // namespace

void MlaDecodeAttention::check_supported(const MlaGeometry& g, const Recipe& r, const MlaCapacity& c) {
  if (r.kv != KvFormat::bf16 && !fp4_latent(r.kv))
    throw Error("MlaDecodeAttention: recipe '" + r.name + "': the " + to_string(r.kv) +
                " latent cache has no decode kernel (bf16, nvfp4, mxfp4)");
  if (fp4_latent(r.kv) && r.query != QueryFormat::full)
    throw Error("MlaDecodeAttention: recipe '" + r.name +
                "': the MLA kernels run the mixed mode (16-bit query and P); native and comparison query "
                "formats are CPU-reference only (ref/mla.h)");
  if (fp4_latent(r.kv) && r.prob != ProbFormat::full)
    throw Error("MlaDecodeAttention: recipe '" + r.name + "': MLA keeps P in 16 bits (its latent blocks run along d_c)");
  if (g.latent_dim != detail::kMlaLatent || g.rope_dim != detail::kMlaRope)
    throw Error("MlaDecodeAttention: latent_dim " + std::to_string(g.latent_dim) + " and rope_dim " +
                std::to_string(g.rope_dim) + " (supported: 512 and 64, DeepSeek-V2/V3)");
  if (g.heads < kMlaHeadsPerCta || g.heads % kMlaHeadsPerCta != 0 || g.heads > kMlaMaxHeads)
    throw Error("MlaDecodeAttention: heads " + std::to_string(g.heads) + " (a multiple of 16)");
  if (g.nope_dim < 1) throw Error("MlaDecodeAttention: nope_dim " + std::to_string(g.nope_dim) + " (at least 1)");
  if (c.max_batch < 1 || c.max_batch > kMaxGridDim)
    throw Error("MlaDecodeAttention: max_batch " + std::to_string(c.max_batch) + " outside [1, " +
                std::to_string(kMaxGridDim) + "]");
  if (c.max_pages < 1) throw Error("MlaDecodeAttention: max_pages " + std::to_string(c.max_pages) + " (at least 1)");
  if (c.max_splits < 1 || c.max_splits > kMaxGridDim - 1)  // + 1 part for the slot rows
    throw Error("MlaDecodeAttention: max_splits " + std::to_string(c.max_splits) + " outside [1, " +
                std::to_string(kMaxGridDim - 1) + "]");
}

MlaDecodeAttention::MlaDecodeAttention(const MlaGeometry& geometry, const Recipe& recipe, const MlaCapacity& capacity)
    : geometry_(geometry), recipe_(recipe), capacity_(capacity) {
  check_supported(geometry, recipe, capacity);
  layout_ = cache::LatentPageLayout::make(recipe.kv, geometry.latent_dim, geometry.rope_dim);
  const size_t heads = size_t(capacity.max_batch) * geometry.heads;
  const size_t parts = heads * (capacity.max_splits + 1);
  cache::cuda_check(cudaMalloc(&partial_out_, parts * detail::kMlaLatent * sizeof(float)),
                    "MlaDecodeAttention: cudaMalloc of the partial outputs");
  cache::cuda_check(cudaMalloc(&partial_lse_, parts * sizeof(float)), "MlaDecodeAttention: cudaMalloc of the partial LSE");
  cache::cuda_check(cudaMalloc(&lse_shift_, heads * sizeof(float)), "MlaDecodeAttention: cudaMalloc of the LSE shifts");
  switch (recipe.kv) {
    case KvFormat::nvfp4: detail::set_smem_limit<KvFormat::nvfp4>(); break;
    case KvFormat::mxfp4: detail::set_smem_limit<KvFormat::mxfp4>(); break;
    default: detail::set_smem_limit<KvFormat::bf16>(); break;
  }
}

MlaDecodeAttention::~MlaDecodeAttention() {
  cudaFree(partial_out_);
  cudaFree(partial_lse_);
  cudaFree(lse_shift_);
}

void MlaDecodeAttention::run_typed(const MlaStep& step, const __nv_bfloat16* q_c, const __nv_bfloat16* q_r, void* out,
                                   bool bf16_out, float* lse, cudaStream_t stream) {
  if (step.batch < 1 || step.batch > capacity_.max_batch)
    throw Error("MlaDecodeAttention::run: batch " + std::to_string(step.batch) + " outside [1, " +
                std::to_string(capacity_.max_batch) + "]");
  if (step.splits < 1 || step.splits > capacity_.max_splits)
    throw Error("MlaDecodeAttention::run: splits " + std::to_string(step.splits) + " outside [1, " +
                std::to_string(capacity_.max_splits) + "]");
  if (step.block_stride < layout_.bytes || step.block_stride % 16 != 0)
    throw Error("MlaDecodeAttention::run: block_stride " + std::to_string(step.block_stride) +
                " (a multiple of 16, at least the page's " + std::to_string(layout_.bytes) + " bytes)");
  if (!(step.pool && step.block_tables && step.seq_lens && q_c && q_r && out))
    throw Error("MlaDecodeAttention::run: null pool, block_tables, seq_lens, q_c, q_r or out");
  const bool fp4 = fp4_latent(recipe_.kv);
  if (fp4 && !(step.slot_rows && step.row_slot))
    throw Error("MlaDecodeAttention::run: the " + to_string(recipe_.kv) +
                " latent cache needs slot_rows and row_slot (its BF16 sink and recent rows)");
  detail::MlaArgs a;
  a.pool = step.pool;
  a.block_stride = step.block_stride;
  a.block_tables = step.block_tables;
  a.seq_lens = step.seq_lens;
  a.max_pages = capacity_.max_pages;
  a.heads = geometry_.heads;
  a.splits = step.splits;
  a.parts = step.splits + (fp4 ? 1 : 0);
  a.layout = layout_;
  a.query.q_c = q_c;
  a.query.q_r = q_r;
  a.query.mu_c = fp4 && recipe_.smooth_keys ? step.mu_c : nullptr;
  a.query.rotate = recipe_.rotate_keys;
  a.slot_rows = step.slot_rows;
  a.row_slot = step.row_slot;
  a.sink = recipe_.bf16_sink;
  a.recent = recipe_.bf16_recent;
  a.scale = 1.0f / std::sqrt(float(geometry_.nope_dim + geometry_.rope_dim));
  a.scale_log2 = detail::kLog2e * a.scale;
  a.partial_out = partial_out_;
  a.partial_lse = partial_lse_;
  a.lse_shift = lse_shift_;
  const dim3 grid(step.batch, geometry_.heads / kMlaHeadsPerCta, a.parts);
  switch (recipe_.kv) {
    case KvFormat::nvfp4: detail::launch_split<KvFormat::nvfp4>(a, grid, stream); break;
    case KvFormat::mxfp4: detail::launch_split<KvFormat::mxfp4>(a, grid, stream); break;
    default: detail::launch_split<KvFormat::bf16>(a, grid, stream); break;
  }
  detail::MlaCombineArgs c;
  c.partial_out = partial_out_;
  c.partial_lse = partial_lse_;
  c.lse_shift = a.query.mu_c ? lse_shift_ : nullptr;
  c.mu_c = a.query.mu_c;
  c.rotate = fp4 && recipe_.rotate_keys;
  c.parts = a.parts;
  c.heads_total = step.batch * geometry_.heads;
  c.out = out;
  c.lse = lse;
  const unsigned blocks = unsigned((c.heads_total + detail::kCombineWarps - 1) / detail::kCombineWarps);
  if (bf16_out) detail::mla_combine_kernel<true><<<blocks, detail::kCombineWarps * 32, 0, stream>>>(c);
  else detail::mla_combine_kernel<false><<<blocks, detail::kCombineWarps * 32, 0, stream>>>(c);
  cache::cuda_check(cudaGetLastError(), "MlaDecodeAttention::run: launch");
}

void MlaDecodeAttention::run(const MlaStep& step, const __nv_bfloat16* q_c, const __nv_bfloat16* q_r, float* out,
                             float* lse, cudaStream_t stream) {
  run_typed(step, q_c, q_r, out, false, lse, stream);
}

void MlaDecodeAttention::run(const MlaStep& step, const __nv_bfloat16* q_c, const __nv_bfloat16* q_r,
                             __nv_bfloat16* out, float* lse, cudaStream_t stream) {
  run_typed(step, q_c, q_r, out, true, lse, stream);
}

}  // namespace fp4kv::attention
