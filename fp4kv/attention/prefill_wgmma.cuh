// The prefill attention pass of prefill_flash.cuh on Hopper's warpgroup MMA (wgmma.cuh): the
// same arguments, tiles of 64 keys, online softmax and outputs, with S = Q K^T and O += P V
// issued per warpgroup from shared memory. A CTA is kWgmmaGroups warpgroups of 64 query rows
// of one query head sharing each K/V tile; Q, K and V live in the 128-byte swizzled layout the
// descriptors read, K and V in kWgmmaStages buffers filled by cp.async two tiles ahead. Each
// warp's registers hold what the mma.sync kernel's warp holds for 16 rows (one m-tile: S as
// eight n-tiles of 8 keys, O as D / 8 n-tiles), so the score masking, the softmax and the state
// and output code are prefill_flash.cuh's, called with M = 1.
//
// Invariants: D == 128; sm_90a; the tensor cores read shared memory only after every thread
// has fenced its cp.async writes for the async proxy and passed the barrier; a buffer is
// overwritten only after the barrier that follows every warpgroup's last wgmma on it (each
// waits for its groups before reaching that barrier).
#pragma once

#include "fp4kv/attention/prefill_flash.cuh"
#include "fp4kv/attention/wgmma.cuh"

namespace fp4kv::attention::detail {

inline constexpr int kWgmmaGroupRows = 64;  // query rows of one warpgroup
inline constexpr int kWgmmaGroups = 3;      // warpgroups per CTA (the fastest of 2 and 3 on the H200)
inline constexpr int kWgmmaStages = 3;      // K/V buffers

// kWgmmaGroups warpgroups per CTA share each K/V tile.
template <int D>
struct WgmmaShape {
  static_assert(D == 128, "prefill attention on wgmma: head_dim 128");
  static constexpr int kThreads = kWgmmaGroups * kWarpgroupThreads;
  static constexpr int kRows = kWgmmaGroups * kWgmmaGroupRows;  // query rows per CTA
  static constexpr int kChunks = D / 8;                          // 16-byte chunks per row
  static constexpr int kGroupQBytes = kWgmmaGroupRows * D * 2;  // one warpgroup's Q tile
  static constexpr int kKvBytes = kFlashKeys * D * 2;            // one K or V tile
  // Q, then (K, V) x stages, plus the slack that aligns the base to a swizzle atom.
  static constexpr int kSmemBytes = kWgmmaGroups * kGroupQBytes + 2 * kWgmmaStages * kKvBytes + kSw128AtomBytes;
  static_assert(kGroupQBytes % kSw128AtomBytes == 0 && kKvBytes % kSw128AtomBytes == 0, "atom-aligned tiles");
};

// Async copy of rows [row0, row0 + n) (n a multiple of 64) of a row-major BF16 matrix into
// consecutive 64-row swizzled tiles; rows at or past `rows` are zero-filled.
template <int D>
__device__ __forceinline__ void load_sw128_async(uint32_t tile, const uint16_t* base, long row_stride, int row0, int n,
                                                 int rows) {
  using Shape = WgmmaShape<D>;
  for (int i = threadIdx.x; i < n * Shape::kChunks; i += Shape::kThreads) {
    const int r = i / Shape::kChunks, c = i % Shape::kChunks;
    const bool ok = row0 + r < rows;
    const uint16_t* src = ok ? base + long(row0 + r) * row_stride + c * 8 : base;
    const uint32_t dst = tile + uint32_t((r / kWgmmaGroupRows) * Shape::kGroupQBytes) +
                         sw128_offset(kWgmmaGroupRows, r % kWgmmaGroupRows, c);
    cp_async16(dst, src, ok ? 16 : 0);
  }
}

// Waits for this thread's copies and publishes the buffers to every thread's wgmma.
__device__ __forceinline__ void publish_tiles(bool all) {
  if (all) cp_async_wait<0>();
  else cp_async_wait<1>();
  fence_proxy_async_shared();
  __syncthreads();
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

// The pipeline: K/V tiles in kWgmmaStages buffers, two tiles in flight while one is computed;
// one barrier per tile (after it, every warpgroup is past the previous tile, whose buffer the
// copies of tile i + 2 then overwrite).
template <int D>
__global__ void __launch_bounds__(WgmmaShape<D>::kThreads, 1) prefill_wgmma_kernel(const FlashArgs a) {
  using Shape = WgmmaShape<D>;
  extern __shared__ __align__(128) uint8_t smem[];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, group = threadIdx.x / kWarpgroupThreads;
  // Causal CTAs with the most keys first (the last row blocks), so the grid's tail is short.
  const int t0 = (gridDim.x - 1 - blockIdx.x) * Shape::kRows;
  const int h = blockIdx.y, g = h / a.group;
  const uint32_t q_tiles = (smem_u32(smem) + (kSw128AtomBytes - 1)) & ~uint32_t(kSw128AtomBytes - 1);
  const uint32_t q_tile = q_tiles + uint32_t(group * Shape::kGroupQBytes);
  const uint32_t kv_tiles = q_tiles + uint32_t(kWgmmaGroups * Shape::kGroupQBytes);
  // Buffer b's K tile, then its V tile, after the Q tiles.
  auto k_tile = [kv_tiles](int b) { return kv_tiles + uint32_t(2 * b * Shape::kKvBytes); };
  auto v_tile = [kv_tiles](int b) { return kv_tiles + uint32_t((2 * b + 1) * Shape::kKvBytes); };
  const uint16_t* kbase = a.k + long(g) * a.kv_head_stride;
  const uint16_t* vbase = a.v + long(g) * a.kv_head_stride;
  auto load_kv = [&](int tile) {
    const int buf = tile % kWgmmaStages;
    load_sw128_async<D>(k_tile(buf), kbase, a.kv_row_stride, tile * kFlashKeys, kFlashKeys, a.n_keys);
    load_sw128_async<D>(v_tile(buf), vbase, a.kv_row_stride, tile * kFlashKeys, kFlashKeys, a.n_keys);
    cp_async_commit();
  };

  const int visible = a.causal ? min(a.n_keys, t0 + Shape::kRows) : a.n_keys;
  const int tiles = (visible + kFlashKeys - 1) / kFlashKeys;

  load_sw128_async<D>(q_tiles, a.q + long(h) * D, a.q_row_stride, t0, Shape::kRows, a.T);
  if (tiles > 0) load_kv(0);  // Q and tile 0 in one group
  else cp_async_commit();
  if (tiles > 1) load_kv(1);

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

  uint32_t pa[4][4];
  for (int i = 0; i < tiles; ++i) {
    const int buf = i % kWgmmaStages;
    publish_tiles(i + 1 == tiles);  // tile i (tile i + 1 may still be in flight)
    if (i + 2 < tiles) load_kv(i + 2);
    const TileView view = view_tile(a, g, i, warp_first_row);
    const float vf = a.tile_v_factor ? a.tile_v_factor[size_t(g) * a.tile_stride + i] : 1.0f;
    float s[1][8][4];
    tile_scores_wgmma<D>(q_tile, k_tile(buf), s[0]);
    if (view.masked) {
      scale_and_mask<1>(a, i, view, rows, offset, s);
      const float no_bias[1][2] = {};  // the logits are finished
      softmax_tile<D, 1>(st, vf, 1.0f, no_bias, s);
    } else {
      softmax_tile<D, 1>(st, vf, view.scale, offset, s);
    }
    if (vf != 0.0f) tile_pv_wgmma<D>(s[0], v_tile(buf), pa, st.o[0]);
  }
  cp_async_wait<0>();
  store_rows<D, 1>(a, h, rows, st);
}

}  // namespace fp4kv::attention::detail
