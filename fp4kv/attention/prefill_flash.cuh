// One pass of BF16 tensor-core attention for prefill (FlashAttention-2 style): a CTA holds 64
// or 128 query rows (tokens) of one query head, 16 or 32 per warp, and streams its KV head's
// keys in tiles of 64 through shared memory (cp.async, double-buffered), S = Q K^T and O += P V on
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

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "fp4kv/attention/device_common.cuh"

namespace fp4kv::attention::detail {

inline constexpr int kFlashKeys = 64;      // keys per tile
inline constexpr int kFlashWarps = 4;
inline constexpr int kFlashThreads = kFlashWarps * 32;

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

// A CTA's shape: M m-tiles of 16 query rows per warp (M = 2 reads each K/V fragment from shared
// memory once for 32 rows: half the shared-memory traffic per MMA, more registers).
template <int D, int M>
struct FlashShape {
  static_assert(D == 64 || D == 128, "prefill attention: head_dim 64 or 128");
  static_assert(M == 1 || M == 2, "prefill attention: 1 or 2 m-tiles per warp");
  static constexpr int kRows = kFlashWarps * 16 * M;      // query rows per CTA
  static constexpr int kChunks = D / 8;                   // 16-byte chunks per row
  static constexpr int kQBytes = kRows * D * 2;           // the CTA's Q tile
  static constexpr int kKvBytes = kFlashKeys * D * 2;     // one K or V tile
  static constexpr int kSmemBytes = kQBytes + 4 * kKvBytes;  // Q, then (K, V) x 2 buffers
  // Byte offset of (row, chunk) in a tile: chunks XOR-swizzled by row % 8 so that the eight
  // rows an ldmatrix phase reads hit eight different bank groups.
  __device__ static __forceinline__ uint32_t offset(int row, int chunk) {
    return uint32_t(row * (D * 2) + ((chunk ^ (row % 8)) * 16));
  }
};

// Async copy of rows [row0, row0 + n) of a row-major BF16 matrix into a tile; rows at or past
// `rows` are zero-filled.
template <int D, int M>
__device__ __forceinline__ void load_tile_async(uint32_t tile, const uint16_t* base, long row_stride, int row0,
                                                int n, int rows) {
  using Shape = FlashShape<D, M>;
  for (int i = threadIdx.x; i < n * Shape::kChunks; i += kFlashThreads) {
    const int r = i / Shape::kChunks, c = i % Shape::kChunks;
    const bool ok = row0 + r < rows;
    const uint16_t* src = ok ? base + long(row0 + r) * row_stride + c * 8 : base;
    cp_async16(tile + Shape::offset(r, c), src, ok ? 16 : 0);
  }
}

// Two floats as BF16 (round to nearest) in one 32-bit register, lo in the low half: one
// cvt.rn.bf16x2.f32.
__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  const __nv_bfloat162 x = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&x);
}

// The running softmax of the thread's rows: per m-tile, lane / 4 and lane / 4 + 8 of its 16.
template <int D, int M>
struct FlashState {
  float o[M][D / 8][4];  // O accumulators (C fragments), in units of o_factor
  float m[M][2];         // running max, log2 units
  float l[M][2];         // this thread's part of the running sum (reduced over the quad at the end)
  float o_factor;        // the value factor O is expressed in
};

// The query rows (tokens) of the thread: t[mt][rr].
template <int M>
struct FlashRows {
  int t[M][2];
};

// Starts the state empty, or from an earlier pass's normalized O and LSE (as one virtual key
// with logit LSE and value O: m = LSE, l = 1 counted once per quad).
template <int D, int M>
__device__ __forceinline__ void init_state(const FlashArgs& a, int h, const FlashRows<M>& rows, FlashState<D, M>& st) {
  const int lane = threadIdx.x % 32;
  st.o_factor = 1.0f;
#pragma unroll
  for (int mt = 0; mt < M; ++mt) {
#pragma unroll
    for (int rr = 0; rr < 2; ++rr) {
      st.m[mt][rr] = neg_inf();
      st.l[mt][rr] = 0.0f;
    }
#pragma unroll
    for (int nt = 0; nt < D / 8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) st.o[mt][nt][e] = 0.0f;
  }
  if (a.state_o == nullptr) return;
#pragma unroll
  for (int mt = 0; mt < M; ++mt)
#pragma unroll
    for (int rr = 0; rr < 2; ++rr) {
      const int t = rows.t[mt][rr];
      if (t >= a.T) continue;
      const size_t row = size_t(t) * a.q_heads + h;
      const float lse = a.state_lse[row];
      if (lse == neg_inf()) continue;
      st.m[mt][rr] = lse * kLog2e;
      st.l[mt][rr] = lane % 4 == 0 ? 1.0f : 0.0f;
#pragma unroll
      for (int nt = 0; nt < D / 8; ++nt) {
        const float2 x = *reinterpret_cast<const float2*>(a.state_o + row * D + nt * 8 + (lane % 4) * 2);
        st.o[mt][nt][2 * rr] = x.x;
        st.o[mt][nt][2 * rr + 1] = x.y;
      }
    }
}

// The Q fragments of m-tile mt, k-step ks of the warp's rows.
template <int D, int M>
__device__ __forceinline__ void load_q_fragment(uint32_t q_tile, int mt, int ks, uint32_t (&qf)[4]) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  ldmatrix_x4(qf, q_tile + FlashShape<D, M>::offset(warp * 16 * M + mt * 16 + lane % 16, 2 * ks + lane / 16));
}

// S = Q K^T for the warp's rows and the tile's 64 keys (8 n-tiles of 8 keys per m-tile). One
// m-tile keeps its Q fragments in registers (qf, loaded once); two load them per k-step.
template <int D, int M>
__device__ __forceinline__ void tile_scores(const uint32_t (&qf)[D / 16][4], uint32_t q_tile, uint32_t k_tile,
                                            float (&s)[M][8][4]) {
  using Shape = FlashShape<D, M>;
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int mt = 0; mt < M; ++mt)
#pragma unroll
    for (int nt = 0; nt < 8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[mt][nt][e] = 0.0f;
#pragma unroll
  for (int ks = 0; ks < D / 16; ++ks) {
    uint32_t qm[M][4];
#pragma unroll
    for (int mt = 0; mt < M; ++mt) {
      if constexpr (M == 1) {
#pragma unroll
        for (int i = 0; i < 4; ++i) qm[mt][i] = qf[ks][i];
      } else {
        load_q_fragment<D, M>(q_tile, mt, ks, qm[mt]);
      }
    }
#pragma unroll
    for (int np = 0; np < 4; ++np) {
      uint32_t b[4];
      ldmatrix_x4(b, k_tile + Shape::offset(np * 16 + (lane / 16) * 8 + lane % 8, 2 * ks + (lane / 8) % 2));
#pragma unroll
      for (int mt = 0; mt < M; ++mt) {
        mma_bf16(s[mt][2 * np], qm[mt], b[0], b[1]);
        mma_bf16(s[mt][2 * np + 1], qm[mt], b[2], b[3]);
      }
    }
  }
}

// A tile's keys as the warp sees them: the factor that turns raw scores into log2 logits, and
// whether any of its keys is hidden from any of the warp's rows (then the scores are masked
// element by element; interior tiles of a causal pass, and every tile of a full unmasked
// window, skip that work).
struct TileView {
  float scale;           // scale_log2 x the tile's key factor (>= 0)
  uint32_t words[2];     // the tile's key-mask bits (all ones without a mask)
  bool masked;
};

__device__ __forceinline__ TileView view_tile(const FlashArgs& a, int g, int tile, int warp_first_row) {
  TileView v;
  v.scale = a.scale_log2 * (a.tile_k_factor ? a.tile_k_factor[size_t(g) * a.tile_stride + tile] : 1.0f);
  v.words[0] = v.words[1] = 0xffffffffu;
  if (a.key_mask) {
    v.words[0] = a.key_mask[size_t(g) * a.mask_stride + 2 * tile];
    v.words[1] = a.key_mask[size_t(g) * a.mask_stride + 2 * tile + 1];
  }
  const int last_key = tile * kFlashKeys + kFlashKeys - 1;
  v.masked = (v.words[0] & v.words[1]) != 0xffffffffu || last_key >= a.n_keys ||
             (a.causal && last_key > warp_first_row);
  return v;
}

// Scales the raw scores of a masked tile to log2 logits (offset included) and sets the keys a
// row may not see to -inf.
template <int M>
__device__ __forceinline__ void scale_and_mask(const FlashArgs& a, int tile, const TileView& view,
                                               const FlashRows<M>& rows, const float (&offset)[M][2],
                                               float (&s)[M][8][4]) {
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int mt = 0; mt < M; ++mt)
#pragma unroll
    for (int nt = 0; nt < 8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int jt = nt * 8 + (lane % 4) * 2 + e % 2;  // key within the tile
        const int j = tile * kFlashKeys + jt;
        const int rr = e / 2;
        const bool valid = j < a.n_keys && (!a.causal || j <= rows.t[mt][rr]) &&
                           ((view.words[jt / 32] >> (jt % 32)) & 1u);
        s[mt][nt][e] = valid ? fmaf(s[mt][nt][e], view.scale, offset[mt][rr]) : neg_inf();
      }
}

// Online softmax over the tile: updates m and l, turns s into P (unnormalized, in place) and
// rescales O by alpha and by the change of value factor. The log2 logit of a score x is
// x * scale + bias[row] (a masked tile passes its finished logits with scale 1 and bias 0; an
// unmasked tile its raw scores, so the scaling rides on the exponent's FMA). scale >= 0, so the
// largest raw score gives the largest logit.
template <int D, int M>
__device__ __forceinline__ void softmax_tile(FlashState<D, M>& st, float v_factor, float scale,
                                             const float (&bias)[M][2], float (&s)[M][8][4]) {
  // A zero value factor (an all-zero page) contributes nothing; O keeps its units.
  const float ratio = v_factor == 0.0f ? 1.0f : st.o_factor / v_factor;
  if (v_factor != 0.0f) st.o_factor = v_factor;
#pragma unroll
  for (int mt = 0; mt < M; ++mt) {
    float o_scale[2];  // alpha x the change of value units
#pragma unroll
    for (int rr = 0; rr < 2; ++rr) {
      float mx = neg_inf();
#pragma unroll
      for (int nt = 0; nt < 8; ++nt) mx = fmaxf(mx, fmaxf(s[mt][nt][2 * rr], s[mt][nt][2 * rr + 1]));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      const float mn = fmaxf(st.m[mt][rr], fmaf(mx, scale, bias[mt][rr]));
      const float mz = mn == neg_inf() ? 0.0f : mn;  // no visible key yet: p = 0, alpha = 0, not NaN
      const float alpha = fast_exp2(st.m[mt][rr] - mz);
      o_scale[rr] = alpha * ratio;
      st.m[mt][rr] = mn;
      const float shift = bias[mt][rr] - mz;
      float sum = 0.0f;
#pragma unroll
      for (int nt = 0; nt < 8; ++nt)
#pragma unroll
        for (int e = 2 * rr; e < 2 * rr + 2; ++e) {
          s[mt][nt][e] = fast_exp2(fmaf(s[mt][nt][e], scale, shift));
          sum += s[mt][nt][e];
        }
      st.l[mt][rr] = fmaf(st.l[mt][rr], alpha, sum);
    }
    // Once the running maxima settle, most tiles leave O as it is: skip the multiplies when no
    // row of the warp needs them (a warp-uniform branch).
    if (__all_sync(0xffffffffu, o_scale[0] == 1.0f && o_scale[1] == 1.0f)) continue;
#pragma unroll
    for (int nt = 0; nt < D / 8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) st.o[mt][nt][e] *= o_scale[e / 2];
  }
}

// O += P V: P from the score fragments (two n-tiles of 8 keys form one k16 A fragment).
template <int D, int M>
__device__ __forceinline__ void tile_pv(const float (&p)[M][8][4], uint32_t v_tile, FlashState<D, M>& st) {
  using Shape = FlashShape<D, M>;
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {
    uint32_t pa[M][4];
#pragma unroll
    for (int mt = 0; mt < M; ++mt) {
      pa[mt][0] = pack_bf16x2(p[mt][2 * kk][0], p[mt][2 * kk][1]);
      pa[mt][1] = pack_bf16x2(p[mt][2 * kk][2], p[mt][2 * kk][3]);
      pa[mt][2] = pack_bf16x2(p[mt][2 * kk + 1][0], p[mt][2 * kk + 1][1]);
      pa[mt][3] = pack_bf16x2(p[mt][2 * kk + 1][2], p[mt][2 * kk + 1][3]);
    }
#pragma unroll
    for (int cp = 0; cp < D / 16; ++cp) {
      uint32_t b[4];
      ldmatrix_x4_trans(b, v_tile + Shape::offset(kk * 16 + ((lane / 8) % 2) * 8 + lane % 8, 2 * cp + lane / 16));
#pragma unroll
      for (int mt = 0; mt < M; ++mt) {
        mma_bf16(st.o[mt][2 * cp], pa[mt], b[0], b[1]);
        mma_bf16(st.o[mt][2 * cp + 1], pa[mt], b[2], b[3]);
      }
    }
  }
}

// Normalizes and writes the rows' outputs, state and LSE.
template <int D, int M>
__device__ __forceinline__ void store_rows(const FlashArgs& a, int h, const FlashRows<M>& rows, FlashState<D, M>& st) {
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int mt = 0; mt < M; ++mt)
#pragma unroll
    for (int rr = 0; rr < 2; ++rr) {
      float l = st.l[mt][rr];
      l += __shfl_xor_sync(0xffffffffu, l, 1);
      l += __shfl_xor_sync(0xffffffffu, l, 2);
      const int t = rows.t[mt][rr];
      if (t >= a.T) continue;
      const size_t row = size_t(t) * a.q_heads + h;
      const float inv = l > 0.0f ? st.o_factor / l : 0.0f;
      const float lse = l > 0.0f ? (st.m[mt][rr] + __log2f(l)) * kLn2 : neg_inf();
#pragma unroll
      for (int nt = 0; nt < D / 8; ++nt) {
        const int c = nt * 8 + (lane % 4) * 2;
        const float x = st.o[mt][nt][2 * rr] * inv, y = st.o[mt][nt][2 * rr + 1] * inv;
        if (a.out_o) *reinterpret_cast<float2*>(a.out_o + row * D + c) = make_float2(x, y);
        if (a.out) *reinterpret_cast<uint32_t*>(a.out + row * D + c) = pack_bf16x2(x, y);
      }
      if (lane % 4 == 0 && a.out_lse) a.out_lse[row] = lse;
    }
}

template <int D, int M>
__global__ void __launch_bounds__(kFlashThreads) prefill_flash_kernel(const FlashArgs a) {
  using Shape = FlashShape<D, M>;
  extern __shared__ __align__(128) uint8_t smem[];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  // Causal CTAs with the most keys first (the last row blocks), so the grid's tail is short.
  const int t0 = (gridDim.x - 1 - blockIdx.x) * Shape::kRows;
  const int h = blockIdx.y, g = h / a.group;
  const uint32_t q_tile = smem_u32(smem);
  // Buffer b's K tile, then its V tile, after the Q tile.
  auto k_tile = [q_tile](int b) { return q_tile + uint32_t(Shape::kQBytes + 2 * b * Shape::kKvBytes); };
  auto v_tile = [q_tile](int b) { return q_tile + uint32_t(Shape::kQBytes + (2 * b + 1) * Shape::kKvBytes); };
  const uint16_t* kbase = a.k + long(g) * a.kv_head_stride;
  const uint16_t* vbase = a.v + long(g) * a.kv_head_stride;

  const int visible = a.causal ? min(a.n_keys, t0 + Shape::kRows) : a.n_keys;
  const int tiles = (visible + kFlashKeys - 1) / kFlashKeys;

  load_tile_async<D, M>(q_tile, a.q + long(h) * D, a.q_row_stride, t0, Shape::kRows, a.T);
  if (tiles > 0) {
    load_tile_async<D, M>(k_tile(0), kbase, a.kv_row_stride, 0, kFlashKeys, a.n_keys);
    load_tile_async<D, M>(v_tile(0), vbase, a.kv_row_stride, 0, kFlashKeys, a.n_keys);
  }
  cp_async_commit();

  FlashRows<M> rows;
  float offset[M][2];
#pragma unroll
  for (int mt = 0; mt < M; ++mt)
#pragma unroll
    for (int rr = 0; rr < 2; ++rr) {
      rows.t[mt][rr] = t0 + warp * 16 * M + mt * 16 + lane / 4 + 8 * rr;
      offset[mt][rr] = a.q_logit_offset && rows.t[mt][rr] < a.T
                           ? a.q_logit_offset[size_t(rows.t[mt][rr]) * a.q_heads + h]
                           : 0.0f;
    }
  const int warp_first_row = t0 + warp * 16 * M;
  FlashState<D, M> st;
  init_state<D, M>(a, h, rows, st);

  uint32_t qf[D / 16][4];  // one m-tile: the warp's Q fragments, loaded once
  for (int i = 0; i < tiles; ++i) {
    const int buf = i % 2;
    if (i + 1 < tiles) {
      load_tile_async<D, M>(k_tile(buf ^ 1), kbase, a.kv_row_stride, (i + 1) * kFlashKeys, kFlashKeys, a.n_keys);
      load_tile_async<D, M>(v_tile(buf ^ 1), vbase, a.kv_row_stride, (i + 1) * kFlashKeys, kFlashKeys, a.n_keys);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    if constexpr (M == 1) {
      if (i == 0) {
#pragma unroll
        for (int ks = 0; ks < D / 16; ++ks) load_q_fragment<D, M>(q_tile, 0, ks, qf[ks]);
      }
    }
    const TileView view = view_tile(a, g, i, warp_first_row);
    float s[M][8][4];
    tile_scores<D, M>(qf, q_tile, k_tile(buf), s);
    const float vf = a.tile_v_factor ? a.tile_v_factor[size_t(g) * a.tile_stride + i] : 1.0f;
    if (view.masked) {
      scale_and_mask<M>(a, i, view, rows, offset, s);
      const float no_bias[M][2] = {};  // the logits are finished
      softmax_tile<D, M>(st, vf, 1.0f, no_bias, s);
    } else {
      softmax_tile<D, M>(st, vf, view.scale, offset, s);
    }
    if (vf != 0.0f) tile_pv<D, M>(s, v_tile(buf), st);
    __syncthreads();  // every warp is done with this buffer before the next prefetch overwrites it
  }
  if (tiles == 0) cp_async_wait<0>();
  store_rows<D, M>(a, h, rows, st);
}

}  // namespace fp4kv::attention::detail
