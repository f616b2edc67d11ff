// The prefill attention pass of prefill_flash.cuh on Hopper's warpgroup MMA (wgmma.cuh): the
// same arguments, tiles of 64 keys, online softmax and outputs, with S = Q K^T and O += P V
// issued per warpgroup from shared memory. A CTA is kWgmmaGroups warpgroups of 64 query rows
// of one query head sharing each K/V tile. Q and the K/V tiles arrive by tensor (TMA) copies in
// the 128-byte swizzled layout the descriptors read, K/V in kWgmmaStages buffers; a buffer's
// "full" mbarrier says its copies landed, and the last warp to release it (a shared counter)
// issues the copies of the tile kWgmmaStages further. No CTA-wide barrier inside the loop: the
// warpgroups drift apart and one's softmax overlaps another's MMAs. (A separate producer warp
// would cap every thread at 128 registers: 13 warps put 4 on one of the SM's four register
// files.) Each warp's registers hold what the mma.sync kernel's warp holds for 16 rows (one
// m-tile: S as eight n-tiles of 8 keys, O as D / 8 n-tiles), so the score masking, the softmax
// and the state and output code are prefill_flash.cuh's, called with M = 1.
//
// Invariants: D == 128; sm_90a; the tensor maps (WgmmaMaps) describe a.q, a.k and a.v with
// exactly T and n_keys rows, so rows past them arrive as zeros; a warp releases a buffer only
// after its last wgmma on it has completed, and a buffer is refilled only by the warp whose
// release is the kWgmmaWarps-th of that tile.
#pragma once

#include <cuda.h>

#include "fp4kv/attention/prefill_flash.cuh"
#include "fp4kv/attention/wgmma.cuh"

namespace fp4kv::attention::detail {

inline constexpr int kWgmmaGroupRows = 64;  // query rows of one warpgroup
inline constexpr int kWgmmaGroups = 3;      // warpgroups per CTA (the fastest of 2 and 3 on the H200)
inline constexpr int kWgmmaWarps = kWgmmaGroups * kWarpgroupThreads / 32;
inline constexpr int kWgmmaStages = 3;      // K/V buffers
inline constexpr int kTmaBoxCols = kSw128RowBytes / 2;  // BF16 channels of one TMA box: one swizzled plane
inline constexpr int kTmaBoxRows = 64;                  // rows of one TMA box (a warpgroup's Q rows, a tile's keys)
static_assert(kTmaBoxRows == kWgmmaGroupRows && kTmaBoxRows == kFlashKeys, "one box height for Q and K/V");

// The tensor maps of one pass: BF16 rows of D channels as (channel, row, head), boxes of
// kTmaBoxCols x kTmaBoxRows x 1 in the 128-byte swizzle (prefill.cu builds them).
struct WgmmaMaps {
  CUtensorMap q, k, v;
};

// kWgmmaGroups warpgroups per CTA share each K/V tile.
template <int D>
struct WgmmaShape {
  static_assert(D == 128, "prefill attention on wgmma: head_dim 128");
  static constexpr int kThreads = kWgmmaWarps * 32;
  static constexpr int kRows = kWgmmaGroups * kWgmmaGroupRows;     // query rows per CTA
  static constexpr int kPlanes = D / kTmaBoxCols;                  // swizzled planes (boxes) per row block
  static constexpr int kGroupQBytes = kWgmmaGroupRows * D * 2;    // one warpgroup's Q tile
  static constexpr int kKvBytes = kFlashKeys * D * 2;              // one K or V tile
  static constexpr int kPlaneBytes = kTmaBoxRows * kSw128RowBytes; // one box in shared memory
  // Q, then (K, V) x stages, the mbarriers (Q full, K/V full x stages) and the release counters
  // (x stages), plus the slack that aligns the base to a swizzle atom.
  static constexpr int kSmemBytes =
      kWgmmaGroups * kGroupQBytes + 2 * kWgmmaStages * kKvBytes + (1 + 2 * kWgmmaStages) * 8 + kSw128AtomBytes;
  static_assert(kGroupQBytes % kSw128AtomBytes == 0 && kKvBytes % kSw128AtomBytes == 0, "atom-aligned tiles");
};

// The CTA's shared memory: Q tiles, K/V buffers and mbarriers, by address.
template <int D>
struct WgmmaSmem {
  using Shape = WgmmaShape<D>;
  uint32_t base;  // swizzle-atom aligned
  __device__ uint32_t q_tile(int group) const { return base + uint32_t(group * Shape::kGroupQBytes); }
  __device__ uint32_t k_tile(int buf) const { return kv(2 * buf); }
  __device__ uint32_t v_tile(int buf) const { return kv(2 * buf + 1); }
  __device__ uint32_t q_full() const { return barrier(0); }
  __device__ uint32_t full(int buf) const { return barrier(1 + buf); }
  // A 32-bit count of the warps' releases of buffer buf (8 bytes apart, after the barriers).
  __device__ uint32_t released(int buf) const { return barrier(1 + kWgmmaStages + buf); }

 private:
  __device__ uint32_t kv(int i) const {
    return base + uint32_t(kWgmmaGroups * Shape::kGroupQBytes + i * Shape::kKvBytes);
  }
  __device__ uint32_t barrier(int i) const { return kv(2 * kWgmmaStages) + uint32_t(8 * i); }
};

// A row block of D channels (kPlanes boxes) at `row` of `head` into its swizzled planes.
template <int D>
__device__ __forceinline__ void tma_load_rows(uint32_t tile, const CUtensorMap& map, int row, int head, uint32_t bar) {
  using Shape = WgmmaShape<D>;
#pragma unroll
  for (int p = 0; p < Shape::kPlanes; ++p)
    tma_load_3d(tile + uint32_t(p * Shape::kPlaneBytes), &map, p * kTmaBoxCols, row, head, bar);
}

// K/V tile j into buffer j % kWgmmaStages (one thread).
template <int D>
__device__ __forceinline__ void load_kv_tile(const WgmmaMaps& maps, const WgmmaSmem<D>& sm, int j, int g) {
  const int buf = j % kWgmmaStages;
  mbar_expect_tx(sm.full(buf), 2 * WgmmaShape<D>::kKvBytes);
  tma_load_rows<D>(sm.k_tile(buf), maps.k, j * kFlashKeys, g, sm.full(buf));
  tma_load_rows<D>(sm.v_tile(buf), maps.v, j * kFlashKeys, g, sm.full(buf));
}

// The CTA's start (one thread): the barriers and release counters, then the copies of Q and of
// the first kWgmmaStages K/V tiles.
template <int D>
__device__ __forceinline__ void start_copies(const WgmmaMaps& maps, const WgmmaSmem<D>& sm, int t0, int h, int g,
                                             int tiles) {
  mbar_init(sm.q_full(), 1);
  for (int b = 0; b < kWgmmaStages; ++b) {
    mbar_init(sm.full(b), 1);
    st_shared_u32(sm.released(b), 0);
  }
  mbar_init_fence();
  mbar_expect_tx(sm.q_full(), kWgmmaGroups * WgmmaShape<D>::kGroupQBytes);
  for (int w = 0; w < kWgmmaGroups; ++w) tma_load_rows<D>(sm.q_tile(w), maps.q, t0 + w * kWgmmaGroupRows, h, sm.q_full());
  for (int j = 0; j < min(tiles, kWgmmaStages); ++j) load_kv_tile<D>(maps, sm, j, g);
}

// A warp (one lane) is done with tile i: the last of the kWgmmaWarps releases refills its
// buffer with tile i + kWgmmaStages. The counter's acquire-release orders every warp's
// completed reads of the buffer before the refill's copies.
template <int D>
__device__ __forceinline__ void release_tile(const WgmmaMaps& maps, const WgmmaSmem<D>& sm, int i, int g, int tiles) {
  const uint32_t before = atom_add_acq_rel_shared(sm.released(i % kWgmmaStages), 1);
  if (before % kWgmmaWarps == kWgmmaWarps - 1 && i + kWgmmaStages < tiles) load_kv_tile<D>(maps, sm, i + kWgmmaStages, g);
}

// S = Q K^T for the warpgroup's 64 rows and the tile's 64 keys.
template <int D>
__device__ __forceinline__ void tile_scores_wgmma(uint32_t q_tile, uint32_t k_tile, float (&s)[8][4]) {
  wgmma_fence();
#pragma unroll
  for (int ks = 0; ks < D / kMmaK; ++ks)
    wgmma_m64n64k16_ss(s, kmajor_descriptor(q_tile, kWgmmaGroupRows, ks), kmajor_descriptor(k_tile, kFlashKeys, ks),
                       ks > 0);
  wgmma_commit();
  wgmma_wait<0>();
}

// O += P V: P from the score registers packed into pa (two n-tiles of 8 keys form one k16 A
// fragment; the MMAs read pa until the wait).
template <int D>
__device__ __forceinline__ void tile_pv_wgmma(const float (&p)[8][4], uint32_t v_tile, uint32_t (&pa)[4][4],
                                              float (&o)[D / 8][4]) {
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {
    pa[kk][0] = pack_bf16x2(p[2 * kk][0], p[2 * kk][1]);
    pa[kk][1] = pack_bf16x2(p[2 * kk][2], p[2 * kk][3]);
    pa[kk][2] = pack_bf16x2(p[2 * kk + 1][0], p[2 * kk + 1][1]);
    pa[kk][3] = pack_bf16x2(p[2 * kk + 1][2], p[2 * kk + 1][3]);
  }
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) wgmma_m64n128k16_rs_nmajor(o, pa[kk], nmajor_descriptor(v_tile, kFlashKeys, kk));
  wgmma_commit();
  wgmma_wait<0>();
}

// Per tile and warp: wait for its copies, S, softmax, P V, release the buffer.
template <int D>
__global__ void __launch_bounds__(WgmmaShape<D>::kThreads, 1)
    prefill_wgmma_kernel(const __grid_constant__ FlashArgs a, const __grid_constant__ WgmmaMaps maps) {
  extern __shared__ __align__(128) uint8_t smem[];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  // Causal CTAs with the most keys first (the last row blocks), so the grid's tail is short.
  const int t0 = (gridDim.x - 1 - blockIdx.x) * WgmmaShape<D>::kRows;
  const int h = blockIdx.y, g = h / a.group;
  const WgmmaSmem<D> sm{(smem_u32(smem) + (kSw128AtomBytes - 1)) & ~uint32_t(kSw128AtomBytes - 1)};
  const int visible = a.causal ? min(a.n_keys, t0 + WgmmaShape<D>::kRows) : a.n_keys;
  const int tiles = (visible + kFlashKeys - 1) / kFlashKeys;

  if (threadIdx.x == 0) start_copies<D>(maps, sm, t0, h, g, tiles);
  __syncthreads();  // the barriers are initialized

  // The thread's rows: warp w holds rows 16 w + lane / 4 (+ 8) of the CTA, as mma.sync's warp w.
  FlashRows<1> rows;
  float offset[1][2];
#pragma unroll
  for (int rr = 0; rr < 2; ++rr) {
    rows.t[0][rr] = t0 + warp * 16 + lane / 4 + 8 * rr;
    offset[0][rr] =
        a.q_logit_offset && rows.t[0][rr] < a.T ? a.q_logit_offset[size_t(rows.t[0][rr]) * a.q_heads + h] : 0.0f;
  }
  const int warp_first_row = t0 + warp * 16;
  FlashState<D, 1> st;
  init_state<D, 1>(a, h, rows, st);
  const uint32_t q_tile = sm.q_tile(warp / (kWarpgroupThreads / 32));
  mbar_wait(sm.q_full(), 0);

  uint32_t pa[4][4];
  for (int i = 0; i < tiles; ++i) {
    const int buf = i % kWgmmaStages;
    const TileView view = view_tile(a, g, i, warp_first_row);
    const float vf = a.tile_v_factor ? a.tile_v_factor[size_t(g) * a.tile_stride + i] : 1.0f;
    mbar_wait(sm.full(buf), uint32_t(i / kWgmmaStages) & 1u);
    float s[1][8][4];
    tile_scores_wgmma<D>(q_tile, sm.k_tile(buf), s[0]);
    if (view.masked) {
      scale_and_mask<1>(a, i, view, rows, offset, s);
      const float no_bias[1][2] = {};  // the logits are finished
      softmax_tile<D, 1>(st, vf, 1.0f, no_bias, s);
    } else {
      softmax_tile<D, 1>(st, vf, view.scale, offset, s);
    }
    if (vf != 0.0f) tile_pv_wgmma<D>(s[0], sm.v_tile(buf), pa, st.o[0]);
    if (lane == 0) release_tile<D>(maps, sm, i, g, tiles);  // this warp's MMAs on the buffer have completed
  }
  store_rows<D, 1>(a, h, rows, st);
}

}  // namespace fp4kv::attention::detail
