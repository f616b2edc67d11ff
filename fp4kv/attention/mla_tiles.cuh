// The building blocks of the MLA decode kernels (mla_decode.h): shared-memory plans, the
// loads of a 64-token tile (BF16 pool pages, BF16 slot rows, FP4 pages), the FP4 tile's
// expansion into FP16, and the three per-tile steps (scores, softmax, context). Every
// function reads only its arguments and shared memory; the kernels in mla_decode.cu compose
// them.
//
// Tile layouts in shared memory (every row of 16-byte chunks XOR-swizzled by row % 8, so the
// eight rows an ldmatrix phase reads hit eight different bank groups):
//   Qb  [16 heads][576]  BF16: [q_c' | q_r], the operand against BF16 rows
//   Q16 [16 heads][512]  FP16: q_c' rounded to FP16, the operand against FP4 pages
//   C   [64 tokens][512] BF16 (BF16 rows) or FP16 (expanded FP4 codes)
//   R   [64 tokens][64]  BF16 positional keys
//   P   [16 heads][64]   BF16 or FP16 probabilities
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "fp4kv/attention/device_common.cuh"
#include "fp4kv/attention/fragment.h"
#include "fp4kv/attention/mla_decode.h"
#include "fp4kv/attention/page_traits.cuh"
#include "fp4kv/cache/layout.h"
#include "fp4kv/cache/split_plan.h"
#include "fp4kv/cache/warp_hadamard.cuh"

namespace fp4kv::attention::detail {

inline constexpr int kMlaLatent = cache::kMlaLatentDim, kMlaRope = cache::kMlaRopeDim, kMlaQk = kMlaLatent + kMlaRope;
inline constexpr int kMlaTilesPerPage = kPageTokens / kMlaTileTokens;
inline constexpr int kMlaWarps = 8;  // S: 8 tokens each; P.C: 64 channels each
inline constexpr int kMlaThreads = kMlaWarps * 32;
inline constexpr int kChunkBytes = 16;
inline constexpr int kChunkElems = 8;  // 16-bit values per chunk
inline constexpr int kQkChunks = kMlaQk / kChunkElems;          // 72: a Qb row
inline constexpr int kLatentChunks = kMlaLatent / kChunkElems;  // 64: a C or Q16 row
inline constexpr int kRopeChunks = kMlaRope / kChunkElems;      // 8: an R row
inline constexpr int kPChunks = kMlaTileTokens / kChunkElems;   // 8: a P row

// Sizes (bytes) of the shared tiles.
inline constexpr int kQbBytes = kMlaHeadsPerCta * kMlaQk * 2;
inline constexpr int kQ16Bytes = kMlaHeadsPerCta * kMlaLatent * 2;
inline constexpr int kCTileBytes = kMlaTileTokens * kMlaLatent * 2;
inline constexpr int kRTileBytes = kMlaTileTokens * kMlaRope * 2;
inline constexpr int kPTileBytes = kMlaHeadsPerCta * kMlaTileTokens * 2;
inline constexpr int kReduceBytes = kMlaWarps * kMlaHeadsPerCta * 4;

// One FP4 tile as it arrives (the raw stage): the codes of 64 tokens (4 key groups of the
// page's fragment order, layout.h), their block scales and the page scales. The tile's R
// rows go straight to the R tile.
template <KvFormat F>
struct MlaFp4Raw {
  static constexpr int kBlock = F == KvFormat::nvfp4 ? 16 : 32;
  static constexpr int kBlocksPerRow = kMlaLatent / kBlock;
  static constexpr int kCodes = 0, kCodeBytes = kMlaTileTokens * kMlaLatent / 2;
  static constexpr int kScales = kCodes + kCodeBytes, kScaleBytes = kMlaTileTokens * kBlocksPerRow;
  static constexpr int kPageScale = kScales + kScaleBytes;
  static constexpr int kBytes = kPageScale + kChunkBytes;
};

// Shared-memory plan of the BF16 cache's kernel: Qb, two stages of (C, R), P, the reductions
// (165 KB: one CTA per SM, 144 KB of copies in flight).
struct MlaBf16Plan {
  static constexpr int kStageBytes = kCTileBytes + kRTileBytes;
  static constexpr int kQb = 0;
  static constexpr int kStage = kQb + kQbBytes;
  static constexpr int kP = kStage + 2 * kStageBytes;
  static constexpr int kMax = kP + kPTileBytes;
  static constexpr int kSum = kMax + kReduceBytes;
  static constexpr int kBytes = kSum + kReduceBytes;
};

// Shared-memory plan of the FP4 kernels, sized for two CTAs per SM (111 KB): the query (page
// CTAs: Q16 then Qr [16][64] BF16; the slot-row CTA: Qb), one expanded C tile, one R tile,
// one raw stage, P, the reductions. One raw stage suffices: the next tile's codes are copied
// once this tile is expanded, its R rows once this tile's scores are done, and both land
// while the softmax and P C run.
inline constexpr int kMlaFp4CtasPerSm = 2;
inline constexpr int kSmemPerSm = 228 * 1024;       // H100/H200 shared memory per SM
inline constexpr int kSmemReservedPerCta = 1024;    // what the runtime keeps per resident CTA

template <KvFormat F>
struct MlaFp4Plan {
  static constexpr int kQ = 0;
  static constexpr int kQr = kQ16Bytes;  // page CTAs
  static constexpr int kC = kQ + kQbBytes;
  static constexpr int kR = kC + kCTileBytes;
  static constexpr int kRaw = kR + kRTileBytes;
  static constexpr int kP = kRaw + MlaFp4Raw<F>::kBytes;
  static constexpr int kMax = kP + kPTileBytes;
  static constexpr int kSum = kMax + kReduceBytes;
  static constexpr int kBytes = kSum + kReduceBytes;
  static_assert(kQbBytes >= kQ16Bytes + kMlaHeadsPerCta * kMlaRope * 2, "the page CTA's Q16 and Qr fit Qb's place");
  static_assert(kMlaFp4CtasPerSm * (kBytes + kSmemReservedPerCta) <= kSmemPerSm, "two CTAs per SM");
};

// Byte offset of chunk `ch` of row `row` in a tile of `chunks` chunks per row.
__device__ __forceinline__ uint32_t swizzled(int row, int ch, int chunks) {
  return uint32_t((row * chunks + (ch ^ (row % 8))) * kChunkBytes);
}

// Which rows of a 64-row tile are attended: [lo0, hi0) and [lo1, hi1) (tile-local rows).
struct TileRows {
  int lo0 = 0, hi0 = 0, lo1 = 0, hi1 = 0;
  __device__ __forceinline__ bool has(int r) const { return (r >= lo0 && r < hi0) || (r >= lo1 && r < hi1); }
  __device__ __forceinline__ bool empty() const { return hi0 <= lo0 && hi1 <= lo1; }
};

__device__ __forceinline__ int clamp_tile(int x) { return min(max(x, 0), kMlaTileTokens); }

// The quantized (or BF16 pool) pages a row attends, as 64-token tiles: tile k is half k % 2
// of page k / 2 (cache/split_plan.h attended_layout: the masked sink copy on page 0, a
// partial last page).
struct PageTiles {
  int quant_pages = 0, masked_prefix = 0, last_page_tokens = 0, count = 0;
};
__device__ __forceinline__ PageTiles page_tiles(const DecodeLayout& l) {
  PageTiles p;
  p.quant_pages = l.quant_pages;
  p.masked_prefix = l.masked_prefix;
  p.last_page_tokens = l.last_page_tokens;
  p.count = l.quant_pages == 0 ? 0 : kMlaTilesPerPage * (l.quant_pages - 1) + (l.last_page_tokens > kMlaTileTokens ? 2 : 1);
  return p;
}
__device__ __forceinline__ TileRows page_tile_rows(const PageTiles& p, int tile) {
  const int page = tile / kMlaTilesPerPage, first = (tile % kMlaTilesPerPage) * kMlaTileTokens;
  const int lo = page == 0 ? p.masked_prefix : 0;
  const int hi = page == p.quant_pages - 1 ? p.last_page_tokens : kPageTokens;
  TileRows v;
  v.lo0 = clamp_tile(lo - first);
  v.hi0 = clamp_tile(hi - first);
  return v;
}
// Slot-row tile k (rows 64 k .. 64 k + 63 of the 144): the sink rows [0, sink) and the
// recent rows [16, 16 + recent).
__device__ __forceinline__ TileRows slot_tile_rows(int sink, int recent, int tile) {
  const int first = tile * kMlaTileTokens;
  TileRows v;
  v.lo0 = clamp_tile(-first);
  v.hi0 = clamp_tile(sink - first);
  v.lo1 = clamp_tile(kSinkTokens - first);
  v.hi1 = clamp_tile(kSinkTokens + recent - first);
  return v;
}
inline constexpr int kSlotTiles = (cache::kSlotRows + kMlaTileTokens - 1) / kMlaTileTokens;  // 3

// ---- Loads ---------------------------------------------------------------------------------

// Copies 64 rows of kChunks 16-byte chunks (row i at src + i * row_bytes) into a swizzled
// tile; rows outside `v` are zero-filled (never read from memory).
template <int kChunks>
__device__ __forceinline__ void load_rows(const uint8_t* src, int row_bytes, const TileRows& v, uint32_t tile) {
  for (int i = threadIdx.x; i < kMlaTileTokens * kChunks; i += kMlaThreads) {
    const int r = i / kChunks, ch = i % kChunks;
    const bool ok = v.has(r);
    cp_async16(tile + swizzled(r, ch, kChunks), ok ? src + size_t(r) * row_bytes + ch * kChunkBytes : src,
               ok ? kChunkBytes : 0);
  }
}

// Copies 64 rows of BF16 [c | r] into the C and R tiles: row i's latent at c_src + i *
// row_bytes, its positional key at r_src + i * r_row_bytes; rows outside `v` zero-filled.
__device__ __forceinline__ void load_bf16_rows(const uint8_t* c_src, const uint8_t* r_src, int row_bytes,
                                               int r_row_bytes, const TileRows& v, uint32_t c_tile, uint32_t r_tile) {
  load_rows<kLatentChunks>(c_src, row_bytes, v, c_tile);
  load_rows<kRopeChunks>(r_src, r_row_bytes, v, r_tile);
}

// Copies the codes, block scales and page scales of half `half` of an FP4 latent page (each
// contiguous per 64 tokens, layout.h) into the raw stage.
template <KvFormat F>
__device__ __forceinline__ void load_fp4_codes(const uint8_t* page, const cache::LatentPageLayout& l, int half,
                                               uint32_t raw) {
  using Raw = MlaFp4Raw<F>;
  const uint8_t* codes = page + l.c_codes + half * Raw::kCodeBytes;
  for (int i = threadIdx.x; i < Raw::kCodeBytes / kChunkBytes; i += kMlaThreads)
    cp_async16(raw + Raw::kCodes + i * kChunkBytes, codes + i * kChunkBytes);
  const uint8_t* scales = page + l.c_scales + half * Raw::kScaleBytes;
  for (int i = threadIdx.x; i < Raw::kScaleBytes / kChunkBytes; i += kMlaThreads)
    cp_async16(raw + Raw::kScales + i * kChunkBytes, scales + i * kChunkBytes);
  if (threadIdx.x == 0) cp_async16(raw + Raw::kPageScale, page + l.page_scales);
}

// Copies the R rows of half `half` of a latent page into the R tile; rows outside `v`
// zero-filled.
__device__ __forceinline__ void load_page_rope(const uint8_t* page, const cache::LatentPageLayout& l, int half,
                                               const TileRows& v, uint32_t r_tile) {
  const uint8_t* r_rows = page + l.r_rows + size_t(half) * kMlaTileTokens * kMlaRope * 2;
  for (int i = threadIdx.x; i < kMlaTileTokens * kRopeChunks; i += kMlaThreads) {
    const int r = i / kRopeChunks, ch = i % kRopeChunks;
    const bool ok = v.has(r);
    cp_async16(r_tile + swizzled(r, ch, kRopeChunks), ok ? r_rows + (r * kRopeChunks + ch) * kChunkBytes : r_rows,
               ok ? kChunkBytes : 0);
  }
}

// FP16 bits of 2^x for an MXFP4 block relative to its page: 0 below FP16's smallest
// subnormal (blocks 2^24 below the page's largest contribute nothing measurable).
__device__ __forceinline__ uint32_t pow2_half_bits(int x) {
  x = min(x, 15);
  if (x >= -14) return uint32_t(x + 15) << 10;
  return x >= -24 ? 1u << (x + 24) : 0u;
}

// The FP32 factor of an FP4 tile's FP16 products (S and P.C partials): the page scale times
// the FP4 expansion's 2^14 (page_traits.cuh). NVFP4: g. MXFP4: the stored 2^(emax - 15), the
// FP16 block scales being 2^(e - (emax - 15)) <= 2^15.
template <KvFormat F>
__device__ __forceinline__ float fp4_tile_factor(float page_scale) {
  if constexpr (F == KvFormat::nvfp4) return page_scale * kFp4ExpansionScale;
  else return ldexpf(1.0f, ilogbf(page_scale) + 14);
}

// Expands a raw FP4 stage into the FP16 C tile: code x block scale x 2^-14 (exact; rows
// outside `v` are zero). A thread takes one 16-byte part: the 4 k-steps of one lane of one
// 16-token group, i.e. 8 codes of rows r, r + 8 at 16 channels each.
template <KvFormat F>
__device__ __forceinline__ void expand_fp4_tile(const uint8_t* raw, float page_scale, const TileRows& v,
                                                uint8_t* c_tile) {
  using Raw = MlaFp4Raw<F>;
  constexpr int kParts = Raw::kCodeBytes / kChunkBytes;  // 1024
  constexpr int kKstepGroups = kMlaLatent / 16 / 4;      // 16-byte parts (4 k-steps) per lane and key group: 8
  const int pe = F == KvFormat::mxfp4 ? ilogbf(page_scale) : 0;
  for (int i = threadIdx.x; i < kParts; i += kMlaThreads) {
    const int lane = i % 32, kq = (i / 32) % kKstepGroups, group = i / (32 * kKstepGroups);
    const int r0 = group * 16 + lane / 4, r1 = r0 + 8;
    const bool ok0 = v.has(r0), ok1 = v.has(r1);
    const uint4 w = *reinterpret_cast<const uint4*>(raw + Raw::kCodes + i * kChunkBytes);
    const uint32_t words[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const int ks = 4 * kq + q;
      const int blk = ks * 16 / Raw::kBlock;
      const uint32_t pair = *reinterpret_cast<const uint16_t*>(
          raw + Raw::kScales + cache::scale_offset(r0, blk, Raw::kBlocksPerRow));  // rows r0 (low), r1 (high)
      uint32_t sc;
      if constexpr (F == KvFormat::nvfp4) {
        sc = e4m3x2_to_half2_bits(pair);
      } else {
        sc = pow2_half_bits(int(pair & 0xFFu) - kE8M0Bias - pe) | (pow2_half_bits(int(pair >> 8) - kE8M0Bias - pe) << 16);
      }
      sc &= (ok0 ? 0x0000FFFFu : 0u) | (ok1 ? 0xFFFF0000u : 0u);
      uint32_t a[4];
      expand_fp4(a, words[q], sc);
      // A registers: a0 (r0, c), a1 (r1, c), a2 (r0, c + 8), a3 (r1, c + 8), c = 16 ks + 2 (lane % 4).
      const int byte = (lane % 4) * 4;
      *reinterpret_cast<uint32_t*>(c_tile + swizzled(r0, 2 * ks, kLatentChunks) + byte) = a[0];
      *reinterpret_cast<uint32_t*>(c_tile + swizzled(r1, 2 * ks, kLatentChunks) + byte) = a[1];
      *reinterpret_cast<uint32_t*>(c_tile + swizzled(r0, 2 * ks + 1, kLatentChunks) + byte) = a[2];
      *reinterpret_cast<uint32_t*>(c_tile + swizzled(r1, 2 * ks + 1, kLatentChunks) + byte) = a[3];
    }
  }
}

// ---- Queries -------------------------------------------------------------------------------

// BF16 cache: the 16 heads' [q_c q_r] as given into Qb.
__device__ __forceinline__ void load_queries_bf16(const __nv_bfloat16* q_c, const __nv_bfloat16* q_r, size_t head0,
                                                  uint32_t qb) {
  for (int i = threadIdx.x; i < kMlaHeadsPerCta * kQkChunks; i += kMlaThreads) {
    const int r = i / kQkChunks, ch = i % kQkChunks;
    const size_t head = head0 + r;
    const __nv_bfloat16* src = ch < kLatentChunks ? q_c + head * kMlaLatent + ch * kChunkElems
                                                  : q_r + head * kMlaRope + (ch - kLatentChunks) * kChunkElems;
    cp_async16(qb + swizzled(r, ch, kQkChunks), src);
  }
}

// The two MMA operand types: BF16 (BF16 rows) and FP16 (expanded FP4 tiles).
struct MmaBf16 {
  __device__ __forceinline__ static void run(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    mma_bf16(c, a, b0, b1);
  }
  __device__ __forceinline__ static uint32_t pack(float lo, float hi) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&v);
  }
};
struct MmaF16 {
  __device__ __forceinline__ static void run(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    mma_f16(c, a, b0, b1);
  }
  __device__ __forceinline__ static uint32_t pack(float lo, float hi) {
    const __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&v);
  }
};

// FP4 caches: warp w prepares heads 2w, 2w + 1: q_c' = H q_c (non-finite elements zeroed, as
// the reference does), q_r as given. Page CTAs: q_c' as FP16 into Q16 at `q`, q_r into Qr
// ([16][64] BF16) at q + kQ16Bytes. The slot-row CTA: [q_c' | q_r] as BF16 into Qb at `q`.
// Returns through `shift` (per head of the pair) q_c . mu_c, the logit offset smoothing
// removed (0 without mu_c).
struct QueryArgs {
  const __nv_bfloat16* q_c = nullptr;
  const __nv_bfloat16* q_r = nullptr;
  const float* mu_c = nullptr;
  bool rotate = false;
};
__device__ __forceinline__ void load_queries_fp4(const QueryArgs& a, size_t head0, bool slot_cta, uint8_t* q,
                                                 float (&shift)[2]) {
  constexpr int E = kMlaLatent / 32;  // channels per lane
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    const int hl = 2 * warp + hh;
    const size_t head = head0 + hl;
    cache::detail::RowFrag<kMlaLatent> x;
    const uint4* src = reinterpret_cast<const uint4*>(a.q_c + head * kMlaLatent + lane * E);
#pragma unroll
    for (int part = 0; part < E / kChunkElems; ++part) {
      const uint4 w = src[part];
      const uint32_t words[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        const float f = __bfloat162float(__ushort_as_bfloat16(uint16_t(words[k / 2] >> (16 * (k % 2)))));
        x.x[part * 8 + k] = isfinite(f) ? f : 0.0f;
      }
    }
    float dot = 0.0f;
    if (a.mu_c) {
#pragma unroll
      for (int k = 0; k < E; ++k) dot = fmaf(x.x[k], a.mu_c[lane * E + k], dot);
      dot = warp_sum_xor(dot, 1);
    }
    shift[hh] = dot;
    if (a.rotate) cache::detail::warp_fwht<kMlaLatent>(x, lane);
#pragma unroll
    for (int part = 0; part < E / kChunkElems; ++part) {
      uint32_t w[4];
#pragma unroll
      for (int k = 0; k < 4; ++k)
        w[k] = slot_cta ? MmaBf16::pack(x.x[part * 8 + 2 * k], x.x[part * 8 + 2 * k + 1])
                        : MmaF16::pack(x.x[part * 8 + 2 * k], x.x[part * 8 + 2 * k + 1]);
      const int ch = lane * (E / kChunkElems) + part;
      *reinterpret_cast<uint4*>(q + swizzled(hl, ch, slot_cta ? kQkChunks : kLatentChunks)) =
          make_uint4(w[0], w[1], w[2], w[3]);
    }
    if (lane < kRopeChunks) {
      const uint4 r = reinterpret_cast<const uint4*>(a.q_r + head * kMlaRope)[lane];
      if (slot_cta) *reinterpret_cast<uint4*>(q + swizzled(hl, kLatentChunks + lane, kQkChunks)) = r;
      else *reinterpret_cast<uint4*>(q + kQ16Bytes + swizzled(hl, lane, kRopeChunks)) = r;
    }
  }
}

// ---- The three steps of a tile -------------------------------------------------------------

// s[16 heads][8 tokens 8w ..] += Q[:, chunks q_ch0 ..] X^T for the warp's tokens: X a
// row-major tile [64][kXChunks], Q [16][kQChunks], both swizzled; two k-steps per iteration.
// The even and odd k-steps accumulate in two independent chains (summed at the end), so
// consecutive MMAs do not wait on each other's results.
template <class Mma, int kXChunks, int kQChunks>
__device__ __forceinline__ void tile_scores(uint32_t q_tile, int q_ch0, uint32_t x_tile, float (&s)[4]) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int key_row = warp * 8 + lane % 8;
  float odd[4] = {};
#pragma unroll 4
  for (int kp = 0; kp < kXChunks / 4; ++kp) {
    uint32_t b[4];  // k-step 2kp: b[0], b[1]; 2kp + 1: b[2], b[3]
    ldmatrix_x4(b, x_tile + swizzled(key_row, 4 * kp + lane / 8, kXChunks));
    uint32_t qa[4], qb[4];
    ldmatrix_x4(qa, q_tile + swizzled(lane % 16, q_ch0 + 4 * kp + lane / 16, kQChunks));
    ldmatrix_x4(qb, q_tile + swizzled(lane % 16, q_ch0 + 4 * kp + 2 + lane / 16, kQChunks));
    Mma::run(s, qa, b[0], b[1]);
    Mma::run(odd, qb, b[2], b[3]);
  }
#pragma unroll
  for (int e = 0; e < 4; ++e) s[e] += odd[e];
}

// The running softmax of the thread's two rows (heads g and g + 8 of the tile).
struct MlaSoftmax {
  float m[2], l[2];
};

// Masks scaled logits (base 2) outside `v` to -inf.
__device__ __forceinline__ void mask_scores(const TileRows& v, float (&s)[4]) {
  const int warp = threadIdx.x / 32, t = threadIdx.x % 4;
#pragma unroll
  for (int e = 0; e < 4; ++e)
    if (!v.has(warp * 8 + 2 * t + e % 2)) s[e] = neg_inf();
}

// From masked base-2 logits to P in shared memory: the tile maxima across warps, the new
// maxima and alpha (returned), P = exp2(S - m) packed by Mma::pack, the row sums.
template <class Mma>
__device__ __forceinline__ void tile_softmax(const float (&s)[4], uint8_t* p_tile, float* red_max, float* red_sum,
                                             MlaSoftmax& st, float (&alpha)[2]) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
#pragma unroll
  for (int rr = 0; rr < 2; ++rr) {
    float mx = fmaxf(s[2 * rr], s[2 * rr + 1]);
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    if (t == 0) red_max[warp * kMlaHeadsPerCta + g + 8 * rr] = mx;
  }
  __syncthreads();  // (A)
  uint32_t* p_words = reinterpret_cast<uint32_t*>(p_tile);
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
    const int token = warp * 8 + 2 * t;
    p_words[(swizzled(head, token / kChunkElems, kPChunks) + (token % kChunkElems) * 2) / 4] = Mma::pack(p0, p1);
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

// O[16][64 channels of warp w] = rescale O + P C over the tile's 64 tokens.
template <class Mma>
__device__ __forceinline__ void tile_context(uint32_t p_tile, uint32_t c_tile, const float (&rescale)[2],
                                             float (&o)[8][4]) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
#pragma unroll
  for (int nt = 0; nt < 8; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) o[nt][e] *= rescale[e / 2];
#pragma unroll
  for (int kk = 0; kk < kMlaTileTokens / 16; ++kk) {
    uint32_t pa[4];
    ldmatrix_x4(pa, p_tile + swizzled(lane % 16, 2 * kk + lane / 16, kPChunks));
#pragma unroll
    for (int cp = 0; cp < 4; ++cp) {  // pairs of 8-channel n-tiles
      uint32_t b[4];
      const int token = kk * 16 + ((lane / 8) % 2) * 8 + lane % 8;
      ldmatrix_x4_trans(b, c_tile + swizzled(token, warp * 8 + 2 * cp + lane / 16, kLatentChunks));
      Mma::run(o[2 * cp], pa, b[0], b[1]);
      Mma::run(o[2 * cp + 1], pa, b[2], b[3]);
    }
  }
}

}  // namespace fp4kv::attention::detail
