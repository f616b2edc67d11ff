// The GPU's one Walsh-Hadamard butterfly: a row of D floats held by one warp (lane l holds
// elements l * E .. l * E + E - 1, E = D / 32), transformed with exactly the stages of
// core/hadamard.h's fwht_inplace, so the cache kernels (keys) and the decode kernels
// (queries) get the CPU's bits.
#pragma once

#include <cuda_runtime.h>

#include "fp4kv/core/hadamard.h"
#include "fp4kv/core/host_device.h"

namespace fp4kv::cache::detail {

inline constexpr unsigned kFullMask = 0xffffffffu;

// Lane `lane` holds elements j = lane * E + i (i < E = D / 32) of a row.
template <int D>
struct RowFrag {
  static constexpr int E = D / 32;
  float x[E];
};

// Fast Walsh-Hadamard transform of a row held by one warp. Stage h pairs (j, j + h) within
// blocks of 2h exactly as fwht_inplace does; stages h < E are inside a lane, the others
// exchange with lane ^ (h / E). Same operations on the same operands: same bits.
template <int D>
__device__ __forceinline__ void warp_fwht(RowFrag<D>& r, int lane) {
  constexpr int E = RowFrag<D>::E;
#pragma unroll
  for (int h = 1; h < E; h *= 2) {
#pragma unroll
    for (int i = 0; i < E; ++i) {
      if ((i & h) == 0) {
        const float a = r.x[i], b = r.x[i + h];
        r.x[i] = add_rn(a, b);
        r.x[i + h] = sub_rn(a, b);
      }
    }
  }
#pragma unroll
  for (int m = 1; m < 32; m *= 2) {
    const bool upper = (lane & m) != 0;
#pragma unroll
    for (int i = 0; i < E; ++i) {
      const float other = __shfl_xor_sync(kFullMask, r.x[i], m);
      r.x[i] = upper ? sub_rn(other, r.x[i]) : add_rn(r.x[i], other);
    }
  }
  const float s = hadamard_scale(D);
#pragma unroll
  for (int i = 0; i < E; ++i) r.x[i] = mul_rn(r.x[i], s);
}

}  // namespace fp4kv::cache::detail
