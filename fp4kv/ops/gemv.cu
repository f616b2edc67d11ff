// The small-batch GEMM (gemv.h).
#include "fp4kv/ops/gemv.h"

#include <cuda_bf16.h>

#include <cstdint>

#include "fp4kv/cache/cuda_check.h"
#include "fp4kv/ops/bf16x8.cuh"
#include "fp4kv/cache/dependent_launch.cuh"

namespace fp4kv::ops {

namespace {

constexpr int kWarps = 8;          // output features per CTA, one per warp
constexpr int kChunk = kBf16PerLoad;
constexpr int kLoadsInFlight = 8;  // W loads a lane issues before it uses any: 4 KiB per warp in flight

// acc[m] += <W chunk, X[m] chunk> for every row of X.
template <int M>
__device__ __forceinline__ void accumulate_chunk(const uint4& w_chunk, const __nv_bfloat16* __restrict__ x, int k,
                                                 int c, float (&acc)[M]) {
  float wf[kChunk];
  bf16x8_to_float(w_chunk, wf);
#pragma unroll
  for (int m = 0; m < M; ++m) {
    float xf[kChunk];
    bf16x8_to_float(__ldg(reinterpret_cast<const uint4*>(x + size_t(m) * k) + c), xf);
#pragma unroll
    for (int i = 0; i < kChunk; ++i) acc[m] = fmaf(wf[i], xf[i], acc[m]);
  }
}

// kLoadsInFlight streaming loads of W's chunks first, first + 32, ... (W is read once: past
// the caches); chunks past the row are left as they are.
__device__ __forceinline__ void load_w(const uint4* __restrict__ wrow, int first, int chunks,
                                       uint4 (&wv)[kLoadsInFlight]) {
#pragma unroll
  for (int j = 0; j < kLoadsInFlight; ++j) {
    const int c = first + 32 * j;
    if (c < chunks) wv[j] = __ldcs(wrow + c);
  }
}

// A lane owns the chunks lane, lane + 32, ... of W's row. The step is bound by how many bytes
// are in flight (a Qwen3 row is 5-19 KiB, a whole matrix one or two waves): each pass issues
// kLoadsInFlight independent streaming loads first, then consumes them in k order, so the
// per-lane summation order is the plain k order. Launched as a programmatic dependent of the
// op that writes X: the first pass's W loads are issued before waiting for it (W depends on
// nothing), X is read and Y written only after.
template <int M, bool F32Out>
__global__ void __launch_bounds__(kWarps * 32) gemv_kernel(const __nv_bfloat16* __restrict__ x,
                                                           const __nv_bfloat16* __restrict__ w, void* __restrict__ y,
                                                           int n, int k) {
  const int lane = threadIdx.x % 32;
  const int row = blockIdx.x * kWarps + threadIdx.x / 32;
  if (row >= n) return;
  const uint4* wrow = reinterpret_cast<const uint4*>(w + size_t(row) * k);
  const int chunks = k / kChunk;
  float acc[M];
#pragma unroll
  for (int m = 0; m < M; ++m) acc[m] = 0.0f;
  uint4 wv[kLoadsInFlight];
  load_w(wrow, lane, chunks, wv);
  cache::wait_for_producer();
  for (int first = lane; first < chunks; first += 32 * kLoadsInFlight) {
    if (first != lane) load_w(wrow, first, chunks, wv);
#pragma unroll
    for (int j = 0; j < kLoadsInFlight; ++j) {
      const int c = first + 32 * j;
      if (c < chunks) accumulate_chunk<M>(wv[j], x, k, c, acc);
    }
  }
#pragma unroll
  for (int m = 0; m < M; ++m) {
#pragma unroll
    for (int o = 16; o > 0; o /= 2) acc[m] += __shfl_xor_sync(0xffffffffu, acc[m], o);
  }
  if (lane != 0) return;
#pragma unroll
  for (int m = 0; m < M; ++m) {
    if constexpr (F32Out) {
      static_cast<float*>(y)[size_t(m) * n + row] = acc[m];
    } else {
      static_cast<__nv_bfloat16*>(y)[size_t(m) * n + row] = __float2bfloat16_rn(acc[m]);
    }
  }
}

template <int M>
void launch_rows(const __nv_bfloat16* x, const __nv_bfloat16* w, void* y, bool f32_out, int n, int k,
                 cudaStream_t stream) {
  const dim3 grid((n + kWarps - 1) / kWarps), block(kWarps * 32);
  if (f32_out)
    cache::launch_dependent(gemv_kernel<M, true>, grid, block, 0, stream, x, w, y, n, k);
  else
    cache::launch_dependent(gemv_kernel<M, false>, grid, block, 0, stream, x, w, y, n, k);
}

}  // namespace

bool gemv_supports(int m, int k) { return m >= 1 && m <= kGemvMaxRows && k > 0 && k % kGemvKMultiple == 0; }

void gemv(const __nv_bfloat16* x, const __nv_bfloat16* w, void* y, bool f32_out, int m, int n, int k,
          cudaStream_t stream) {
  switch (m) {
    case 1: launch_rows<1>(x, w, y, f32_out, n, k, stream); break;
    case 2: launch_rows<2>(x, w, y, f32_out, n, k, stream); break;
    case 3: launch_rows<3>(x, w, y, f32_out, n, k, stream); break;
    case 4: launch_rows<4>(x, w, y, f32_out, n, k, stream); break;
    case 5: launch_rows<5>(x, w, y, f32_out, n, k, stream); break;
    case 6: launch_rows<6>(x, w, y, f32_out, n, k, stream); break;
    case 7: launch_rows<7>(x, w, y, f32_out, n, k, stream); break;
    case 8: launch_rows<8>(x, w, y, f32_out, n, k, stream); break;
    default: return;  // gemv_supports is the caller's check
  }
  cache::cuda_check_launch("gemv");
}

}  // namespace fp4kv::ops
