// Device helpers shared by the cache kernels: one warp transforms one row of d values
// (k' = H (k - mu), bit-identical to core/transform.h), rounds it to BF16 (non-finite
// values stored as 0) and moves rows between global memory, shared memory and the slot.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "fp4kv/cache/kernels.h"
#include "fp4kv/cache/warp_hadamard.cuh"
#include "fp4kv/core/hadamard.h"
#include "fp4kv/core/host_device.h"

namespace fp4kv::cache::detail {

// Loads the lane's E floats of a row (16-byte aligned rows).
template <int D>
__device__ __forceinline__ void load_row(const float* row, int lane, RowFrag<D>& r) {
  constexpr int E = RowFrag<D>::E;
  const float* p = row + lane * E;
  if constexpr (E == 2) {
    const float2 a = *reinterpret_cast<const float2*>(p);
    r.x[0] = a.x;
    r.x[1] = a.y;
  } else {
#pragma unroll
    for (int q = 0; q < E / 4; ++q) {
      const float4 a = *reinterpret_cast<const float4*>(p + 4 * q);
      r.x[4 * q] = a.x;
      r.x[4 * q + 1] = a.y;
      r.x[4 * q + 2] = a.z;
      r.x[4 * q + 3] = a.w;
    }
  }
}

// The cached form of an input row (cache_row loads it, cached_row takes it loaded): K is
// transformed (smooth: minus mu, rotate: Hadamard), V is not. Non-finite elements (after the
// transform) are counted and become 0; the result is rounded to BF16 (round to nearest even,
// as float_to_bf16_bits).
template <int D>
__device__ __forceinline__ void cached_row(RowFrag<D>& r, const float* mu, bool is_key, bool smooth, bool rotate,
                                           int lane, uint16_t (&out)[D / 32], int& nonfinite) {
  constexpr int E = RowFrag<D>::E;
  if (is_key) {
    if (smooth && mu) {
#pragma unroll
      for (int i = 0; i < E; ++i) r.x[i] = sub_rn(r.x[i], mu[lane * E + i]);
    }
    if (rotate) warp_fwht<D>(r, lane);
  }
#pragma unroll
  for (int i = 0; i < E; ++i) {
    float v = r.x[i];
    if (!is_finite(v)) {
      ++nonfinite;
      v = 0.0f;
    }
    out[i] = __bfloat16_as_ushort(__float2bfloat16_rn(v));
  }
}
template <int D>
__device__ __forceinline__ void cache_row(const float* row, const float* mu, bool is_key, bool smooth, bool rotate,
                                          int lane, uint16_t (&out)[D / 32], int& nonfinite) {
  RowFrag<D> r;
  load_row<D>(row, lane, r);
  cached_row<D>(r, mu, is_key, smooth, rotate, lane, out, nonfinite);
}

// Stores / loads E BF16 values (E * 2 bytes, aligned to that) of a lane.
template <int E>
__device__ __forceinline__ void store_bf16(uint16_t* dst, const uint16_t (&v)[E]) {
  if constexpr (E == 2) {
    *reinterpret_cast<uint32_t*>(dst) = uint32_t(v[0]) | (uint32_t(v[1]) << 16);
  } else {
#pragma unroll
    for (int q = 0; q < E / 4; ++q) {
      uint2 w;
      w.x = uint32_t(v[4 * q]) | (uint32_t(v[4 * q + 1]) << 16);
      w.y = uint32_t(v[4 * q + 2]) | (uint32_t(v[4 * q + 3]) << 16);
      *reinterpret_cast<uint2*>(dst + 4 * q) = w;
    }
  }
}
template <int E>
__device__ __forceinline__ void load_bf16(const uint16_t* src, uint16_t (&v)[E]) {
  if constexpr (E == 2) {
    const uint32_t w = *reinterpret_cast<const uint32_t*>(src);
    v[0] = uint16_t(w);
    v[1] = uint16_t(w >> 16);
  } else {
#pragma unroll
    for (int q = 0; q < E / 4; ++q) {
      const uint2 w = *reinterpret_cast<const uint2*>(src + 4 * q);
      v[4 * q] = uint16_t(w.x);
      v[4 * q + 1] = uint16_t(w.x >> 16);
      v[4 * q + 2] = uint16_t(w.y);
      v[4 * q + 3] = uint16_t(w.y >> 16);
    }
  }
}

__device__ __forceinline__ float bf16_bits_to_float_dev(uint16_t h) { return __uint_as_float(uint32_t(h) << 16); }

// Adds a warp's non-finite count to the device counter (one atomic per warp).
__device__ __forceinline__ void flush_nonfinite(unsigned long long* counter, int count) {
#pragma unroll
  for (int m = 16; m > 0; m /= 2) count += __shfl_xor_sync(kFullMask, count, m);
  if ((threadIdx.x & 31) == 0 && count > 0 && counter) atomicAdd(counter, static_cast<unsigned long long>(count));
}

// Block-wide maximum of non-negative values (all threads get the result). `scratch`
// holds 32 words; blockDim.x is a multiple of 32.
template <typename T>
__device__ __forceinline__ T block_max(T v, T* scratch) {
#pragma unroll
  for (int m = 16; m > 0; m /= 2) {
    const T o = __shfl_xor_sync(kFullMask, v, m);
    v = o > v ? o : v;
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
  __syncthreads();  // scratch may still be read from a previous call
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  T r = scratch[0];
  for (int w = 1; w < warps; ++w) r = scratch[w] > r ? scratch[w] : r;
  return r;
}

// Slot buffer row of (layer, slot, head, K/V, row); latent caches: the row's latent (K) or
// positional key (V) part. Consecutive rows are dims.slot_row_stride() apart.
__device__ __forceinline__ uint16_t* slot_row(const CacheDims& dims, const CacheMem& mem, int layer, int slot, int head,
                                              int kv, int row) {
  if (dims.latent())
    return mem.slots + latent_slot_row_offset(layer, slot, row, dims.slots, dims.d, dims.rope_dim) + (kv == 1 ? dims.d : 0);
  return mem.slots + slot_row_offset(layer, slot, head, kv, row, dims.slots, dims.heads, dims.d);
}

// One KV head's part of a cache block.
__device__ __forceinline__ uint8_t* block_head(const CacheDims& dims, const CacheMem& mem, int layer, int block,
                                               int head) {
  return mem.pool + layer * dims.layer_stride + block * dims.block_stride + static_cast<long long>(head) * dims.layout.bytes;
}

__device__ __forceinline__ const float* mu_row(const CacheDims& dims, const CacheMem& mem, int layer, int head) {
  return mem.mu ? mem.mu + (static_cast<long long>(layer) * dims.heads + head) * dims.d : nullptr;
}

}  // namespace fp4kv::cache::detail
