// One pass of BF16 tensor-core attention for prefill (FlashAttention-2 style): a CTA holds 64
// query rows (tokens) of one query head, 16 per warp, and streams its KV head's keys in tiles
// of 64 through shared memory (cp.async, double-buffered), S = Q K^T and O += P V on
// mma.sync.m16n8k16 with FP32 accumulation, online softmax in log2 units.
//
// A pass can start from the state of an earlier pass over other keys of the same rows
// (normalized O in FP32 and the natural-log LSE) and can write its state instead of (or as
// well as) the BF16 output, so the prefix of a prompt chunk (read from the cache, possibly
// in several windows) and the chunk's own causal keys chain into one softmax.
//
// Keys of quantized cache pages arrive as their exact BF16 expansion (code x block scale)
// with per-tile FP32 factors: S is multiplied by the tile's key factor, and O is kept in
// units of the current tile's value factor (rescaled by old / new when the factor changes,
// together with the softmax rescale), so the page scales never round.
//
// Invariants: D in {64, 128}; rows of Q, K and V are 16-byte aligned; key tiles of 64; the
// key mask (when given) covers whole tiles.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "fp4kv/attention/device_common.cuh"

namespace fp4kv::attention::detail {

inline constexpr int kFlashRows = 64;     // query rows per CTA
inline constexpr int kFlashKeys = 64;     // keys per tile
inline constexpr int kFlashThreads = 128; // 4 warps x 16 rows

struct FlashArgs {
  // Queries: row t of query head h at q + t * q_row_stride + h * D (BF16 bits).
  const uint16_t* q = nullptr;
  long q_row_stride = 0;
  // Added to row (t, h)'s log2-unit logits ([T][q_heads]), or null.
  const float* q_logit_offset = nullptr;
  // Keys and values: key j of KV head g at k + g * kv_head_stride + j * kv_row_stride.
  const uint16_t* k = nullptr;
  const uint16_t* v = nullptr;
  long kv_head_stride = 0, kv_row_stride = 0;
  // Per (KV head, key tile) factors of the keys and values ([kv_heads][tile_stride]), or null (1).
  const float* tile_k_factor = nullptr;
  const float* tile_v_factor = nullptr;
  int tile_stride = 0;
  // Valid keys as bits ([kv_heads][mask_stride] words, key j = bit j % 32 of word j / 32), or
  // null (keys below n_keys are valid).
  const uint32_t* key_mask = nullptr;
  int mask_stride = 0;
  int T = 0, n_keys = 0, q_heads = 0, group = 1;  // group: query heads per KV head
  bool causal = false;     // key j is visible to query row t when j <= t
  float scale_log2 = 0.0f; // log2(e) / sqrt(D)
  // State of an earlier pass (normalized O [T][q_heads][D] FP32, natural-log LSE [T][q_heads]), or null.
  const float* state_o = nullptr;
  const float* state_lse = nullptr;
  // Outputs (any may be null): this pass's state, the BF16 output [T][q_heads][D], the LSE.
  float* out_o = nullptr;
  float* out_lse = nullptr;
  uint16_t* out = nullptr;
};

template <int D>
struct FlashTile {
  static constexpr int kChunks = D / 8;                   // 16-byte chunks per row
  static constexpr int kBytes = kFlashRows * D * 2;       // one [64][D] BF16 tile
  static constexpr int kSmemBytes = 5 * kBytes;           // Q, then (K, V) x 2 buffers
  // Byte offset of (row, chunk) in a tile: chunks XOR-swizzled by row % 8 so that the eight
  // rows an ldmatrix phase reads hit eight different bank groups.
  __device__ static __forceinline__ uint32_t offset(int row, int chunk) {
    return uint32_t(row * (D * 2) + ((chunk ^ (row % 8)) * 16));
  }
};

// Async copy of rows [row0, row0 + 64) of a row-major BF16 matrix into a tile; rows at or
// past `rows` are zero-filled.
template <int D>
__device__ __forceinline__ void load_tile_async(uint32_t tile, const uint16_t* base, long row_stride, int row0,
                                                int rows) {
  using Tile = FlashTile<D>;
  for (int i = threadIdx.x; i < kFlashRows * Tile::kChunks; i += kFlashThreads) {
    const int r = i / Tile::kChunks, c = i % Tile::kChunks;
    const bool ok = row0 + r < rows;
    const uint16_t* src = ok ? base + long(row0 + r) * row_stride + c * 8 : base;
    cp_async16(tile + Tile::offset(r, c), src, ok ? 16 : 0);
  }
}

__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) { return bf16_bits(lo) | (bf16_bits(hi) << 16); }

// The running softmax of the thread's two rows (lane / 4 and lane / 4 + 8 of its warp's 16).
template <int D>
struct FlashState {
  float o[D / 8][4];  // O accumulators (C fragments), in units of o_factor
  float m[2];         // running max, log2 units
  float l[2];         // this thread's part of the running sum (reduced over the quad at the end)
  float o_factor;     // the value factor O is expressed in
};

// Starts the state empty, or from an earlier pass's normalized O and LSE (as one virtual key
// with logit LSE and value O: m = LSE, l = 1 counted once per quad).
template <int D>
__device__ __forceinline__ void init_state(const FlashArgs& a, int h, const int (&t)[2], FlashState<D>& st) {
  const int lane = threadIdx.x % 32;
  st.o_factor = 1.0f;
#pragma unroll
  for (int rr = 0; rr < 2; ++rr) {
    st.m[rr] = neg_inf();
    st.l[rr] = 0.0f;
  }
#pragma unroll
  for (int nt = 0; nt < D / 8; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) st.o[nt][e] = 0.0f;
  if (a.state_o == nullptr) return;
#pragma unroll
  for (int rr = 0; rr < 2; ++rr) {
    if (t[rr] >= a.T) continue;
    const size_t row = size_t(t[rr]) * a.q_heads + h;
    const float lse = a.state_lse[row];
    if (lse == neg_inf()) continue;
    st.m[rr] = lse * 1.4426950408889634f;
    st.l[rr] = lane % 4 == 0 ? 1.0f : 0.0f;
#pragma unroll
    for (int nt = 0; nt < D / 8; ++nt) {
      const float2 x = *reinterpret_cast<const float2*>(a.state_o + row * D + nt * 8 + (lane % 4) * 2);
      st.o[nt][2 * rr] = x.x;
      st.o[nt][2 * rr + 1] = x.y;
    }
  }
}

// S = Q K^T for the warp's 16 rows and the tile's 64 keys (8 n-tiles of 8 keys).
template <int D>
__device__ __forceinline__ void tile_scores(const uint32_t (&qf)[D / 16][4], uint32_t k_tile, float (&s)[8][4]) {
  using Tile = FlashTile<D>;
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int nt = 0; nt < 8; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) s[nt][e] = 0.0f;
#pragma unroll
  for (int ks = 0; ks < D / 16; ++ks) {
#pragma unroll
    for (int np = 0; np < 4; ++np) {
      uint32_t b[4];
      ldmatrix_x4(b, k_tile + Tile::offset(np * 16 + (lane / 16) * 8 + lane % 8, 2 * ks + (lane / 8) % 2));
      mma_bf16(s[2 * np], qf[ks], b[0], b[1]);
      mma_bf16(s[2 * np + 1], qf[ks], b[2], b[3]);
    }
  }
}

// Scales the raw scores to log2 logits and masks the keys a row may not see (-inf).
template <int D>
__device__ __forceinline__ void scale_and_mask(const FlashArgs& a, int g, int tile, const int (&t)[2],
                                               const float (&offset)[2], float (&s)[8][4]) {
  const int lane = threadIdx.x % 32;
  const float kf = a.tile_k_factor ? a.tile_k_factor[size_t(g) * a.tile_stride + tile] : 1.0f;
  const float sc = a.scale_log2 * kf;
  uint32_t words[2] = {0xffffffffu, 0xffffffffu};
  if (a.key_mask) {
    words[0] = a.key_mask[size_t(g) * a.mask_stride + 2 * tile];
    words[1] = a.key_mask[size_t(g) * a.mask_stride + 2 * tile + 1];
  }
#pragma unroll
  for (int nt = 0; nt < 8; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int jt = nt * 8 + (lane % 4) * 2 + e % 2;  // key within the tile
      const int j = tile * kFlashKeys + jt;
      const int rr = e / 2;
      const bool valid = j < a.n_keys && (!a.causal || j <= t[rr]) && ((words[jt / 32] >> (jt % 32)) & 1u);
      s[nt][e] = valid ? fmaf(s[nt][e], sc, offset[rr]) : neg_inf();
    }
}

// Online softmax over the tile: updates m and l, turns s into P (unnormalized, in place) and
// rescales O by alpha and by the change of value factor.
template <int D>
__device__ __forceinline__ void softmax_tile(FlashState<D>& st, float v_factor, float (&s)[8][4]) {
  float alpha[2];
#pragma unroll
  for (int rr = 0; rr < 2; ++rr) {
    float mx = neg_inf();
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) mx = fmaxf(mx, fmaxf(s[nt][2 * rr], s[nt][2 * rr + 1]));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    const float mn = fmaxf(st.m[rr], mx);
    const float mz = mn == neg_inf() ? 0.0f : mn;  // no visible key yet: p = 0, alpha = 0, not NaN
    alpha[rr] = fast_exp2(st.m[rr] - mz);
    st.m[rr] = mn;
    float sum = 0.0f;
#pragma unroll
    for (int nt = 0; nt < 8; ++nt)
#pragma unroll
      for (int e = 2 * rr; e < 2 * rr + 2; ++e) {
        s[nt][e] = fast_exp2(s[nt][e] - mz);
        sum += s[nt][e];
      }
    st.l[rr] = fmaf(st.l[rr], alpha[rr], sum);
  }
  // A zero value factor (an all-zero page) contributes nothing; O keeps its units.
  const float ratio = v_factor == 0.0f ? 1.0f : st.o_factor / v_factor;
  if (v_factor != 0.0f) st.o_factor = v_factor;
#pragma unroll
  for (int nt = 0; nt < D / 8; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) st.o[nt][e] *= alpha[e / 2] * ratio;
}

// O += P V: P from the score fragments (two n-tiles of 8 keys form one k16 A fragment).
template <int D>
__device__ __forceinline__ void tile_pv(const float (&p)[8][4], uint32_t v_tile, FlashState<D>& st) {
  using Tile = FlashTile<D>;
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {
    const uint32_t pa[4] = {pack_bf16x2(p[2 * kk][0], p[2 * kk][1]), pack_bf16x2(p[2 * kk][2], p[2 * kk][3]),
                            pack_bf16x2(p[2 * kk + 1][0], p[2 * kk + 1][1]),
                            pack_bf16x2(p[2 * kk + 1][2], p[2 * kk + 1][3])};
#pragma unroll
    for (int cp = 0; cp < D / 16; ++cp) {
      uint32_t b[4];
      ldmatrix_x4_trans(b, v_tile + Tile::offset(kk * 16 + ((lane / 8) % 2) * 8 + lane % 8, 2 * cp + lane / 16));
      mma_bf16(st.o[2 * cp], pa, b[0], b[1]);
      mma_bf16(st.o[2 * cp + 1], pa, b[2], b[3]);
    }
  }
}

// Normalizes and writes the rows' outputs, state and LSE.
template <int D>
__device__ __forceinline__ void store_rows(const FlashArgs& a, int h, const int (&t)[2], FlashState<D>& st) {
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int rr = 0; rr < 2; ++rr) {
    float l = st.l[rr];
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    if (t[rr] >= a.T) continue;
    const size_t row = size_t(t[rr]) * a.q_heads + h;
    const float inv = l > 0.0f ? st.o_factor / l : 0.0f;
    const float lse = l > 0.0f ? (st.m[rr] + __log2f(l)) * 0.6931471805599453f : neg_inf();
#pragma unroll
    for (int nt = 0; nt < D / 8; ++nt) {
      const int c = nt * 8 + (lane % 4) * 2;
      const float x = st.o[nt][2 * rr] * inv, y = st.o[nt][2 * rr + 1] * inv;
      if (a.out_o) *reinterpret_cast<float2*>(a.out_o + row * D + c) = make_float2(x, y);
      if (a.out) *reinterpret_cast<uint32_t*>(a.out + row * D + c) = pack_bf16x2(x, y);
    }
    if (lane % 4 == 0 && a.out_lse) a.out_lse[row] = lse;
  }
}

template <int D>
__global__ void __launch_bounds__(kFlashThreads) prefill_flash_kernel(const FlashArgs a) {
  static_assert(D == 64 || D == 128, "prefill attention: head_dim 64 or 128");
  using Tile = FlashTile<D>;
  extern __shared__ __align__(128) uint8_t smem[];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  // Causal CTAs with the most keys first (the last row blocks), so the grid's tail is short.
  const int t0 = (gridDim.x - 1 - blockIdx.x) * kFlashRows;
  const int h = blockIdx.y, g = h / a.group;
  const uint32_t q_tile = smem_u32(smem);
  // Buffer b's K tile at 1 + 2b tiles, its V tile at 2 + 2b.
  auto k_tile = [q_tile](int b) { return q_tile + uint32_t(1 + 2 * b) * Tile::kBytes; };
  auto v_tile = [q_tile](int b) { return q_tile + uint32_t(2 + 2 * b) * Tile::kBytes; };
  const uint16_t* kbase = a.k + long(g) * a.kv_head_stride;
  const uint16_t* vbase = a.v + long(g) * a.kv_head_stride;

  const int visible = a.causal ? min(a.n_keys, t0 + kFlashRows) : a.n_keys;
  const int tiles = (visible + kFlashKeys - 1) / kFlashKeys;

  load_tile_async<D>(q_tile, a.q + long(h) * D, a.q_row_stride, t0, a.T);
  if (tiles > 0) {
    load_tile_async<D>(k_tile(0), kbase, a.kv_row_stride, 0, a.n_keys);
    load_tile_async<D>(v_tile(0), vbase, a.kv_row_stride, 0, a.n_keys);
  }
  cp_async_commit();

  const int t[2] = {t0 + warp * 16 + lane / 4, t0 + warp * 16 + lane / 4 + 8};
  float offset[2] = {0.0f, 0.0f};
  if (a.q_logit_offset) {
#pragma unroll
    for (int rr = 0; rr < 2; ++rr)
      if (t[rr] < a.T) offset[rr] = a.q_logit_offset[size_t(t[rr]) * a.q_heads + h];
  }
  FlashState<D> st;
  init_state<D>(a, h, t, st);

  uint32_t qf[D / 16][4];
  for (int i = 0; i < tiles; ++i) {
    const int buf = i % 2;
    if (i + 1 < tiles) {
      load_tile_async<D>(k_tile(buf ^ 1), kbase, a.kv_row_stride, (i + 1) * kFlashKeys, a.n_keys);
      load_tile_async<D>(v_tile(buf ^ 1), vbase, a.kv_row_stride, (i + 1) * kFlashKeys, a.n_keys);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    if (i == 0) {
#pragma unroll
      for (int ks = 0; ks < D / 16; ++ks)
        ldmatrix_x4(qf[ks], q_tile + Tile::offset(warp * 16 + lane % 16, 2 * ks + lane / 16));
    }
    float s[8][4];
    tile_scores<D>(qf, k_tile(buf), s);
    scale_and_mask<D>(a, g, i, t, offset, s);
    const float vf = a.tile_v_factor ? a.tile_v_factor[size_t(g) * a.tile_stride + i] : 1.0f;
    softmax_tile<D>(st, vf, s);
    if (vf != 0.0f) tile_pv<D>(s, v_tile(buf), st);
    __syncthreads();  // every warp is done with this buffer before the next prefetch overwrites it
  }
  if (tiles == 0) cp_async_wait<0>();
  store_rows<D>(a, h, t, st);
}

}  // namespace fp4kv::attention::detail
