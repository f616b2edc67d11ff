// MLA decode over the BF16 latent cache (mla_decode.h): the split kernel and the combine.
//
// A CTA: one batch row, 16 heads (one MMA m-tile), one split of the row's 64-token tiles
// (half pages). Shared memory: Q = [q_c q_r] of the 16 heads [16][576]; two stages of a
// tile's latent C [64][512] and positional keys R [64][64]; P [16][64]; per-warp row maxima
// and sums. Every row of 16-byte chunks is XOR-swizzled by row % 8, so the eight rows an
// ldmatrix phase reads hit eight different bank groups.
//
// Per tile (three barriers): (0) the tile has landed; the next tile's copy starts into the
// other stage (every warp is past the tile that used it). (S) warp w: S[16 heads][8 tokens]
// = Q [C R]^T over k = 576 for tokens 8w .. 8w + 7; its row maxima to shared memory. (A) the
// tile maxima: the new running maxima, P = exp2(S - m) as BF16 into shared memory, row sums.
// (B) warp w: O[16][64 channels 64w ..] = alpha O + P C over the 64 tokens, C as the B
// operand by transposing ldmatrix.
#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>

#include "fp4kv/attention/device_common.cuh"
#include "fp4kv/attention/lse_merge.cuh"
#include "fp4kv/attention/mla_decode.h"
#include "fp4kv/cache/cuda_check.h"
#include "fp4kv/core/error.h"

namespace fp4kv::attention {
namespace detail {
namespace {

constexpr int kMlaLatent = 512, kMlaRope = 64, kMlaQk = kMlaLatent + kMlaRope;
constexpr int kTilesPerPage = kPageTokens / kMlaTileTokens;
constexpr int kMlaWarps = 8;         // S: 8 tokens each; P.C: 64 channels each
constexpr int kMlaThreads = kMlaWarps * 32;
constexpr int kChunkBf16 = 8;        // BF16 values per 16-byte chunk

// Shared-memory plan (bytes).
constexpr int kQBytes = kMlaHeadsPerCta * kMlaQk * 2;
constexpr int kCBytes = kMlaTileTokens * kMlaLatent * 2;
constexpr int kRBytes = kMlaTileTokens * kMlaRope * 2;
constexpr int kStageBytes = kCBytes + kRBytes;
constexpr int kPBytes = kMlaHeadsPerCta * kMlaTileTokens * 2;
constexpr int kRedBytes = kMlaWarps * kMlaHeadsPerCta * 4;
constexpr int kQOff = 0, kStageOff = kQOff + kQBytes, kPOff = kStageOff + 2 * kStageBytes;
constexpr int kMaxOff = kPOff + kPBytes, kSumOff = kMaxOff + kRedBytes;
constexpr int kMlaSmemBytes = kSumOff + kRedBytes;

// The shared-memory address of stage i % 2.
__device__ __forceinline__ uint32_t stage_addr(uint8_t* smem, int i) {
  return smem_u32(smem + kStageOff + (i % 2) * kStageBytes);
}

// Byte offset of chunk `ch` of row `row` in a tile of `chunks` chunks per row.
__device__ __forceinline__ uint32_t swizzled(int row, int ch, int chunks) {
  return uint32_t((row * chunks + (ch ^ (row % 8))) * 16);
}

struct MlaArgs {
  const uint8_t* pool = nullptr;
  long long block_stride = 0;
  const int32_t* block_tables = nullptr;
  const int32_t* seq_lens = nullptr;
  int max_pages = 0, heads = 0, splits = 1;
  int c_offset = 0, r_offset = 0;  // the page's latent and positional rows (LatentPageLayout)
  const __nv_bfloat16* q_c = nullptr;
  const __nv_bfloat16* q_r = nullptr;
  float scale_log2 = 0.0f;          // log2(e) / sqrt(d_nope + d_r)
  float* partial_out = nullptr;     // [batch][heads][splits][512]
  float* partial_lse = nullptr;     // [batch][heads][splits], log2 units
};

// The tiles [first, end) of a row's split, and the row's length.
struct MlaSplit {
  int n = 0, first = 0, end = 0;
};

__device__ __forceinline__ MlaSplit split_of(const MlaArgs& a, int row, int split) {
  MlaSplit s;
  s.n = min(max(a.seq_lens[row], 0), a.max_pages * kPageTokens);  // a row ends at its table's last page
  const int tiles = (s.n + kMlaTileTokens - 1) / kMlaTileTokens;
  const int per = (tiles + a.splits - 1) / a.splits;
  s.first = min(tiles, split * per);
  s.end = min(tiles, s.first + per);
  return s;
}

// Copies the 16 heads' [q_c q_r] into the Q tile.
__device__ __forceinline__ void load_queries(const MlaArgs& a, int row, int h0, uint32_t q_tile) {
  constexpr int kChunks = kMlaQk / kChunkBf16;  // 72 per head
  for (int i = threadIdx.x; i < kMlaHeadsPerCta * kChunks; i += kMlaThreads) {
    const int r = i / kChunks, ch = i % kChunks;
    const size_t head = size_t(row) * a.heads + h0 + r;
    const __nv_bfloat16* src = ch < kMlaLatent / kChunkBf16 ? a.q_c + head * kMlaLatent + ch * kChunkBf16
                                                            : a.q_r + head * kMlaRope + (ch - kMlaLatent / kChunkBf16) * kChunkBf16;
    cp_async16(q_tile + swizzled(r, ch, kChunks), src);
  }
}

// Copies tile `tile` of the row (C and R of 64 tokens; rows past the row's end zero-filled).
__device__ __forceinline__ void load_tile(const MlaArgs& a, int row, int tile, int n, uint32_t stage) {
  const int page = tile / kTilesPerPage, first_token = (tile % kTilesPerPage) * kMlaTileTokens;
  const int valid = min(kMlaTileTokens, n - tile * kMlaTileTokens);
  const uint8_t* base = a.pool + size_t(a.block_tables[size_t(row) * a.max_pages + page]) * size_t(a.block_stride);
  constexpr int kCChunks = kMlaLatent / kChunkBf16, kRChunks = kMlaRope / kChunkBf16;
  for (int i = threadIdx.x; i < kMlaTileTokens * kCChunks; i += kMlaThreads) {
    const int r = i / kCChunks, ch = i % kCChunks;
    const uint8_t* src = base + a.c_offset + ((first_token + r) * kMlaLatent + ch * kChunkBf16) * 2;
    cp_async16(stage + swizzled(r, ch, kCChunks), r < valid ? src : base, r < valid ? 16 : 0);
  }
  for (int i = threadIdx.x; i < kMlaTileTokens * kRChunks; i += kMlaThreads) {
    const int r = i / kRChunks, ch = i % kRChunks;
    const uint8_t* src = base + a.r_offset + ((first_token + r) * kMlaRope + ch * kChunkBf16) * 2;
    cp_async16(stage + kCBytes + swizzled(r, ch, kRChunks), r < valid ? src : base, r < valid ? 16 : 0);
  }
}

// S[16 heads][8 tokens 8w ..] = Q [C R]^T of the warp's tokens, raw (unscaled).
__device__ __forceinline__ void tile_scores(uint32_t q_tile, uint32_t stage, float (&s)[4]) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  constexpr int kQChunks = kMlaQk / kChunkBf16, kCChunks = kMlaLatent / kChunkBf16, kRChunks = kMlaRope / kChunkBf16;
  s[0] = s[1] = s[2] = s[3] = 0.0f;
  const int key_row = warp * 8 + lane % 8;
#pragma unroll 4
  for (int kp = 0; kp < kMlaQk / 32; ++kp) {  // two k-steps of 16 per iteration
    uint32_t b[4];  // k-step 2kp: b[0], b[1]; 2kp + 1: b[2], b[3]
    const int ch = 4 * kp + lane / 8;  // chunk of the key row this lane addresses
    if (4 * kp < kCChunks) {
      ldmatrix_x4(b, stage + swizzled(key_row, ch, kCChunks));
    } else {
      ldmatrix_x4(b, stage + kCBytes + swizzled(key_row, ch - kCChunks, kRChunks));
    }
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      uint32_t qa[4];
      ldmatrix_x4(qa, q_tile + swizzled(lane % 16, 2 * (2 * kp + half) + lane / 16, kQChunks));
      mma_bf16(s, qa, b[2 * half], b[2 * half + 1]);
    }
  }
}

// The running softmax of the thread's two rows (heads g and g + 8 of the tile).
struct MlaSoftmax {
  float m[2], l[2];
};

// From raw scores to P in shared memory: masks tokens past the row's end, the tile maxima
// across warps, the new maxima and alpha (returned), P = exp2(S - m) as BF16, the row sums.
__device__ __forceinline__ void tile_softmax(const MlaArgs& a, int valid, float (&s)[4], uint8_t* smem,
                                             MlaSoftmax& st, float (&alpha)[2]) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  float* red_max = reinterpret_cast<float*>(smem + kMaxOff);
  float* red_sum = reinterpret_cast<float*>(smem + kSumOff);
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    const int token = warp * 8 + 2 * t + e % 2;
    s[e] = token < valid ? s[e] * a.scale_log2 : neg_inf();
  }
#pragma unroll
  for (int rr = 0; rr < 2; ++rr) {
    float mx = fmaxf(s[2 * rr], s[2 * rr + 1]);
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    if (t == 0) red_max[warp * kMlaHeadsPerCta + g + 8 * rr] = mx;
  }
  __syncthreads();  // (A)
  uint32_t* p_words = reinterpret_cast<uint32_t*>(smem + kPOff);
  constexpr int kPChunks = kMlaTileTokens / kChunkBf16;
#pragma unroll
  for (int rr = 0; rr < 2; ++rr) {
    const int head = g + 8 * rr;
    float mx = neg_inf();
    for (int w = 0; w < kMlaWarps; ++w) mx = fmaxf(mx, red_max[w * kMlaHeadsPerCta + head]);
    const float mn = fmaxf(st.m[rr], mx);
    const float mz = mn == neg_inf() ? 0.0f : mn;  // nothing visible yet: p = 0, alpha = 0
    alpha[rr] = fast_exp2(st.m[rr] - mz);
    st.m[rr] = mn;
    const float p0 = fast_exp2(s[2 * rr] - mz), p1 = fast_exp2(s[2 * rr + 1] - mz);
    const __nv_bfloat162 pair = __floats2bfloat162_rn(p0, p1);
    const int token = warp * 8 + 2 * t;
    p_words[(swizzled(head, token / kChunkBf16, kPChunks) + (token % kChunkBf16) * 2) / 4] =
        *reinterpret_cast<const uint32_t*>(&pair);
    float sum = p0 + p1;
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    sum += __shfl_xor_sync(0xffffffffu, sum, 2);
    if (t == 0) red_sum[warp * kMlaHeadsPerCta + head] = sum;
  }
  __syncthreads();  // (B)
#pragma unroll
  for (int rr = 0; rr < 2; ++rr) {
    float sum = 0.0f;
    for (int w = 0; w < kMlaWarps; ++w) sum += red_sum[w * kMlaHeadsPerCta + g + 8 * rr];
    st.l[rr] = fmaf(st.l[rr], alpha[rr], sum);
  }
}

// O[16][64 channels of warp w] = alpha O + P C over the tile's 64 tokens.
__device__ __forceinline__ void tile_context(uint32_t p_tile, uint32_t stage, const float (&alpha)[2],
                                             float (&o)[8][4]) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  constexpr int kPChunks = kMlaTileTokens / kChunkBf16, kCChunks = kMlaLatent / kChunkBf16;
#pragma unroll
  for (int nt = 0; nt < 8; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) o[nt][e] *= alpha[e / 2];
#pragma unroll
  for (int kk = 0; kk < kMlaTileTokens / 16; ++kk) {
    uint32_t pa[4];
    ldmatrix_x4(pa, p_tile + swizzled(lane % 16, 2 * kk + lane / 16, kPChunks));
#pragma unroll
    for (int cp = 0; cp < 4; ++cp) {  // pairs of 8-channel n-tiles
      uint32_t b[4];
      const int token = kk * 16 + ((lane / 8) % 2) * 8 + lane % 8;
      ldmatrix_x4_trans(b, stage + swizzled(token, warp * 8 + 2 * cp + lane / 16, kCChunks));
      mma_bf16(o[2 * cp], pa, b[0], b[1]);
      mma_bf16(o[2 * cp + 1], pa, b[2], b[3]);
    }
  }
}

// Grid (batch, heads / 16, splits).
__global__ void __launch_bounds__(kMlaThreads) mla_bf16_split_kernel(const MlaArgs a) {
  extern __shared__ __align__(128) uint8_t smem[];
  const int row = blockIdx.x, h0 = blockIdx.y * kMlaHeadsPerCta, split = blockIdx.z;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const MlaSplit sp = split_of(a, row, split);
  const uint32_t q_tile = smem_u32(smem + kQOff), p_tile = smem_u32(smem + kPOff);

  MlaSoftmax st{{neg_inf(), neg_inf()}, {0.0f, 0.0f}};
  float o[8][4] = {};
  if (sp.first < sp.end) {
    load_queries(a, row, h0, q_tile);
    load_tile(a, row, sp.first, sp.n, stage_addr(smem, 0));
    cp_async_commit();
  }
  for (int tile = sp.first; tile < sp.end; ++tile) {
    const int i = tile - sp.first;
    cp_async_wait<0>();
    __syncthreads();  // (0) the tile has landed; every warp is done with the other stage
    if (tile + 1 < sp.end) {
      load_tile(a, row, tile + 1, sp.n, stage_addr(smem, i + 1));
      cp_async_commit();
    }
    float s[4];
    tile_scores(q_tile, stage_addr(smem, i), s);
    float alpha[2];
    tile_softmax(a, min(kMlaTileTokens, sp.n - tile * kMlaTileTokens), s, smem, st, alpha);
    tile_context(p_tile, stage_addr(smem, i), alpha, o);
  }
  // This split's normalized O and its LSE (log2 units; -inf and zeros when it has no tokens).
#pragma unroll
  for (int rr = 0; rr < 2; ++rr) {
    const size_t head = size_t(row) * a.heads + h0 + g + 8 * rr;
    const size_t part = head * a.splits + split;
    const float inv = st.l[rr] > 0.0f ? 1.0f / st.l[rr] : 0.0f;
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) {
      const int c = warp * 64 + nt * 8 + 2 * t;
      *reinterpret_cast<float2*>(a.partial_out + part * kMlaLatent + c) =
          make_float2(o[nt][2 * rr] * inv, o[nt][2 * rr + 1] * inv);
    }
    if (warp == 0 && t == 0) a.partial_lse[part] = st.l[rr] > 0.0f ? st.m[rr] + __log2f(st.l[rr]) : neg_inf();
  }
}

constexpr int kCombineThreads = 128;
constexpr int kCombineChannels = kMlaLatent / kCombineThreads;  // per thread

// Grid (batch * heads): the splits of one head merged by LSE (lse_merge.cuh's weights, each
// computed once per split); the natural-log LSE.
template <bool kBf16Out>
__global__ void __launch_bounds__(kCombineThreads) mla_combine_kernel(const float* partial_out, const float* partial_lse,
                                                                      int splits, void* out, float* lse) {
  const size_t head = blockIdx.x;
  const float* lses = partial_lse + head * splits;
  float big = neg_inf();
  for (int s = 0; s < splits; ++s) big = fmaxf(big, lses[s]);
  float wsum = 0.0f, acc[kCombineChannels] = {};
  for (int s = 0; s < splits; ++s) {
    const float w = merge_weight(lses[s], big);
    wsum += w;
    const float* o = partial_out + (head * splits + s) * kMlaLatent + threadIdx.x;
#pragma unroll
    for (int k = 0; k < kCombineChannels; ++k) acc[k] = fmaf(w, o[k * kCombineThreads], acc[k]);
  }
  const float inv = wsum > 0.0f ? 1.0f / wsum : 0.0f;
#pragma unroll
  for (int k = 0; k < kCombineChannels; ++k) {
    const size_t i = head * kMlaLatent + threadIdx.x + k * kCombineThreads;
    if constexpr (kBf16Out) static_cast<__nv_bfloat16*>(out)[i] = __float2bfloat16_rn(acc[k] * inv);
    else static_cast<float*>(out)[i] = acc[k] * inv;
  }
  if (threadIdx.x == 0 && lse != nullptr) lse[head] = wsum > 0.0f ? (big + __log2f(wsum)) * kLn2 : neg_inf();
}

}  // namespace
}  // namespace detail

void MlaDecodeAttention::check_supported(const MlaGeometry& g, KvFormat format, const MlaCapacity& c) {
  if (format != KvFormat::bf16)
    throw Error("MlaDecodeAttention: the " + to_string(format) +
                " latent cache has no decode kernel yet (bf16 only)");
  if (g.latent_dim != detail::kMlaLatent || g.rope_dim != detail::kMlaRope)
    throw Error("MlaDecodeAttention: latent_dim " + std::to_string(g.latent_dim) + " and rope_dim " +
                std::to_string(g.rope_dim) + " (supported: 512 and 64, DeepSeek-V2/V3)");
  if (g.heads < kMlaHeadsPerCta || g.heads % kMlaHeadsPerCta != 0 || g.heads > kMlaMaxHeads)
    throw Error("MlaDecodeAttention: heads " + std::to_string(g.heads) + " (a multiple of 16)");
  if (g.nope_dim < 1) throw Error("MlaDecodeAttention: nope_dim " + std::to_string(g.nope_dim) + " (at least 1)");
  if (c.max_batch < 1 || c.max_batch > 65535)
    throw Error("MlaDecodeAttention: max_batch " + std::to_string(c.max_batch) + " outside [1, 65535]");
  if (c.max_pages < 1) throw Error("MlaDecodeAttention: max_pages " + std::to_string(c.max_pages) + " (at least 1)");
  if (c.max_splits < 1 || c.max_splits > 65535)
    throw Error("MlaDecodeAttention: max_splits " + std::to_string(c.max_splits) + " outside [1, 65535]");
}

MlaDecodeAttention::MlaDecodeAttention(const MlaGeometry& geometry, KvFormat format, const MlaCapacity& capacity)
    : geometry_(geometry), capacity_(capacity) {
  check_supported(geometry, format, capacity);
  layout_ = cache::LatentPageLayout::make(format, geometry.latent_dim, geometry.rope_dim);
  const size_t parts = size_t(capacity.max_batch) * geometry.heads * capacity.max_splits;
  cache::cuda_check(cudaMalloc(&partial_out_, parts * detail::kMlaLatent * sizeof(float)),
                    "MlaDecodeAttention: cudaMalloc of the partial outputs");
  cache::cuda_check(cudaMalloc(&partial_lse_, parts * sizeof(float)), "MlaDecodeAttention: cudaMalloc of the partial LSE");
  cache::cuda_check(cudaFuncSetAttribute(detail::mla_bf16_split_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         detail::kMlaSmemBytes),
                    "MlaDecodeAttention: shared-memory limit of the split kernel");
}

MlaDecodeAttention::~MlaDecodeAttention() {
  cudaFree(partial_out_);
  cudaFree(partial_lse_);
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
  detail::MlaArgs a;
  a.pool = step.pool;
  a.block_stride = step.block_stride;
  a.block_tables = step.block_tables;
  a.seq_lens = step.seq_lens;
  a.max_pages = capacity_.max_pages;
  a.heads = geometry_.heads;
  a.splits = step.splits;
  a.c_offset = layout_.c_codes;
  a.r_offset = layout_.r_rows;
  a.q_c = q_c;
  a.q_r = q_r;
  a.scale_log2 = detail::kLog2e / std::sqrt(float(geometry_.nope_dim + geometry_.rope_dim));
  a.partial_out = partial_out_;
  a.partial_lse = partial_lse_;
  const dim3 grid(step.batch, geometry_.heads / kMlaHeadsPerCta, step.splits);
  detail::mla_bf16_split_kernel<<<grid, detail::kMlaThreads, detail::kMlaSmemBytes, stream>>>(a);
  const unsigned heads = unsigned(step.batch) * geometry_.heads;
  if (bf16_out) {
    detail::mla_combine_kernel<true><<<heads, detail::kCombineThreads, 0, stream>>>(partial_out_, partial_lse_,
                                                                                  step.splits, out, lse);
  } else {
    detail::mla_combine_kernel<false><<<heads, detail::kCombineThreads, 0, stream>>>(partial_out_, partial_lse_,
                                                                                   step.splits, out, lse);
  }
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
