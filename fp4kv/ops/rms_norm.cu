// RMSNorm kernels: one CTA per row; pass 1 sums squares (and, fused, stores the rounded
// residual sum), pass 2 normalizes. Each thread revisits only the elements it wrote in
// pass 1, so the residual it reads back needs no barrier beyond the sum's. Launched as
// programmatic dependents (cache/dependent_launch.cuh) that wait for their producer before
// reading its output: their launch overlaps the producer's tail.
//
// Rows of a multiple of 8 elements up to kMaxVectorRow (every Qwen3 hidden size) take the
// vector kernel: a thread owns 16-byte chunks tid, tid + 256, ... and issues every load of its
// row at once (the norm weight's before the wait, the row's after), keeping the values in
// registers between the passes. A decode step runs this kernel at one or a few rows, where
// its time is memory latency, not bandwidth: the scalar loop's loads waited for each other
// (a store between them that might alias), ~20 L2 round trips per row; the vector kernel
// makes 2.
#include "fp4kv/ops/rms_norm.h"

#include <string>

#include "fp4kv/cache/cuda_check.h"
#include "fp4kv/core/error.h"
#include "fp4kv/core/hd_math.h"
#include "fp4kv/cache/dependent_launch.cuh"
#include "fp4kv/ops/bf16x8.cuh"

namespace fp4kv::ops {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr unsigned kFullMask = 0xffffffffu;
constexpr int kChunk = kBf16PerLoad;        // BF16 per 16-byte load
constexpr int kMaxChunksPerThread = 4;      // chunks a thread of the vector kernel holds
constexpr int kMaxVectorRow = kThreads * kMaxChunksPerThread * kChunk;  // 8192 elements

// Sum over the CTA, returned to every thread.
__device__ float block_sum(float v) {
  __shared__ float warp_sums[kWarps];
  __shared__ float total;
  for (int off = 16; off > 0; off /= 2) v = __fadd_rn(v, __shfl_down_sync(kFullMask, v, off));
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) warp_sums[warp] = v;
  __syncthreads();
  if (threadIdx.x == 0) {
    float s = 0.0f;
    for (int w = 0; w < kWarps; ++w) s = __fadd_rn(s, warp_sums[w]);
    total = s;
  }
  __syncthreads();
  return total;
}

// y_i = bf16(w_i * bf16(x_i * r)) for the row (the rounding points of rms_norm.h).
__device__ void normalize_row(const __nv_bfloat16* x, const __nv_bfloat16* weight, int n, float ss, float eps,
                              __nv_bfloat16* y) {
  const float r = rms_scale(__fdiv_rn(ss, float(n)), eps);
  for (int i = threadIdx.x; i < n; i += kThreads) {
    const float h = __bfloat162float(__float2bfloat16_rn(__fmul_rn(__bfloat162float(x[i]), r)));
    y[i] = __float2bfloat16_rn(__fmul_rn(__bfloat162float(weight[i]), h));
  }
}

__global__ void __launch_bounds__(kThreads)
    rms_norm_kernel(const __nv_bfloat16* x, const __nv_bfloat16* weight, int n, float eps, __nv_bfloat16* y) {
  cache::allow_dependents();  // the next GEMV may start streaming its weights
  cache::wait_for_producer();
  const size_t row = size_t(blockIdx.x) * n;
  float ss = 0.0f;
  for (int i = threadIdx.x; i < n; i += kThreads) {
    const float v = __bfloat162float(x[row + i]);
    ss = __fadd_rn(ss, __fmul_rn(v, v));
  }
  ss = block_sum(ss);
  normalize_row(x + row, weight, n, ss, eps, y + row);
}

__global__ void __launch_bounds__(kThreads)
    add_rms_norm_kernel(__nv_bfloat16* residual, const __nv_bfloat16* delta, const __nv_bfloat16* weight, int n,
                        float eps, __nv_bfloat16* y) {
  cache::allow_dependents();
  cache::wait_for_producer();
  const size_t row = size_t(blockIdx.x) * n;
  float ss = 0.0f;
  for (int i = threadIdx.x; i < n; i += kThreads) {
    const __nv_bfloat16 s =
        __float2bfloat16_rn(__fadd_rn(__bfloat162float(residual[row + i]), __bfloat162float(delta[row + i])));
    residual[row + i] = s;
    const float v = __bfloat162float(s);
    ss = __fadd_rn(ss, __fmul_rn(v, v));
  }
  ss = block_sum(ss);
  normalize_row(residual + row, weight, n, ss, eps, y + row);
}

// Both norms of rows of n = a multiple of 8, n <= kMaxVectorRow, 16-byte aligned rows: with
// `add`, residual[row] = bf16(residual + delta) first (x is residual then); the same
// rounding points as the scalar kernels (rms_norm.h), the sum of squares per thread over its
// chunks in order, then block_sum. Every load comes before any store, so y may alias x
// (rms_norm.h).
template <bool Add>
__global__ void __launch_bounds__(kThreads)
    norm_rows_kernel(__nv_bfloat16* x, const __nv_bfloat16* delta, const __nv_bfloat16* __restrict__ weight,
                     int n, float eps, __nv_bfloat16* y) {
  cache::allow_dependents();  // the next GEMV may start streaming its weights
  const int chunks = n / kChunk;
  const uint4* w4 = reinterpret_cast<const uint4*>(weight);
  uint4 wv[kMaxChunksPerThread], xv[kMaxChunksPerThread], dv[kMaxChunksPerThread];
#pragma unroll
  for (int c = 0; c < kMaxChunksPerThread; ++c) {
    const int at = threadIdx.x + c * kThreads;
    if (at < chunks) wv[c] = __ldg(w4 + at);  // weights depend on no producer
  }
  cache::wait_for_producer();
  const size_t row = size_t(blockIdx.x) * chunks;
  uint4* x4 = reinterpret_cast<uint4*>(x) + row;
#pragma unroll
  for (int c = 0; c < kMaxChunksPerThread; ++c) {
    const int at = threadIdx.x + c * kThreads;
    if (at < chunks) {
      xv[c] = x4[at];
      if constexpr (Add) dv[c] = reinterpret_cast<const uint4*>(delta)[row + at];
    }
  }
  float ss = 0.0f;
  float v[kMaxChunksPerThread][kChunk];
#pragma unroll
  for (int c = 0; c < kMaxChunksPerThread; ++c) {
    if (threadIdx.x + c * kThreads >= chunks) continue;
    bf16x8_to_float(xv[c], v[c]);
    if constexpr (Add) {
      float d[kChunk];
      bf16x8_to_float(dv[c], d);
#pragma unroll
      for (int e = 0; e < kChunk; ++e) v[c][e] = __bfloat162float(__float2bfloat16_rn(__fadd_rn(v[c][e], d[e])));
      x4[threadIdx.x + c * kThreads] = float_to_bf16x8(v[c]);  // exact: v is BF16-valued
    }
#pragma unroll
    for (int e = 0; e < kChunk; ++e) ss = __fadd_rn(ss, __fmul_rn(v[c][e], v[c][e]));
  }
  ss = block_sum(ss);
  const float r = rms_scale(__fdiv_rn(ss, float(n)), eps);
  uint4* y4 = reinterpret_cast<uint4*>(y) + row;
#pragma unroll
  for (int c = 0; c < kMaxChunksPerThread; ++c) {
    if (threadIdx.x + c * kThreads >= chunks) continue;
    float wf[kChunk], out[kChunk];
    bf16x8_to_float(wv[c], wf);
#pragma unroll
    for (int e = 0; e < kChunk; ++e) {
      const float h = __bfloat162float(__float2bfloat16_rn(__fmul_rn(v[c][e], r)));
      out[e] = __fmul_rn(wf[e], h);
    }
    y4[threadIdx.x + c * kThreads] = float_to_bf16x8(out);
  }
}

// Whether rows of n at these pointers take norm_rows_kernel.
bool vector_rows(int n, const void* x, const void* delta, const void* weight, const void* y) {
  return n % kChunk == 0 && n <= kMaxVectorRow && aligned16(x) && (!delta || aligned16(delta)) && aligned16(weight) &&
         aligned16(y);
}

void check_sizes(const char* op, int rows, int n, float eps) {
  require(rows >= 0, std::string(op) + ": rows " + std::to_string(rows) + " is negative");
  require(n > 0, std::string(op) + ": n " + std::to_string(n) + " must be positive");
  require(eps >= 0.0f, std::string(op) + ": eps " + std::to_string(eps) + " is negative");
}

}  // namespace

void rms_norm(const RmsNormArgs& a, cudaStream_t stream) {
  check_sizes("rms_norm", a.rows, a.n, a.eps);
  if (a.rows == 0) return;
  require(a.x && a.weight && a.y, "rms_norm: a device pointer is null");
  if (vector_rows(a.n, a.x, nullptr, a.weight, a.y)) {
    cache::launch_dependent(norm_rows_kernel<false>, dim3(a.rows), dim3(kThreads), 0, stream,
                            const_cast<__nv_bfloat16*>(a.x), static_cast<const __nv_bfloat16*>(nullptr), a.weight, a.n,
                            a.eps, a.y);
  } else {
    cache::launch_dependent(rms_norm_kernel, dim3(a.rows), dim3(kThreads), 0, stream, a.x, a.weight, a.n, a.eps, a.y);
  }
  cache::cuda_check_launch("rms_norm");
}

void add_rms_norm(const AddRmsNormArgs& a, cudaStream_t stream) {
  check_sizes("add_rms_norm", a.rows, a.n, a.eps);
  if (a.rows == 0) return;
  require(a.residual && a.delta && a.weight && a.y, "add_rms_norm: a device pointer is null");
  require(a.y != a.residual, "add_rms_norm: y must not alias residual");
  if (vector_rows(a.n, a.residual, a.delta, a.weight, a.y)) {
    cache::launch_dependent(norm_rows_kernel<true>, dim3(a.rows), dim3(kThreads), 0, stream, a.residual, a.delta,
                            a.weight, a.n, a.eps, a.y);
  } else {
    cache::launch_dependent(add_rms_norm_kernel, dim3(a.rows), dim3(kThreads), 0, stream, a.residual, a.delta,
                            a.weight, a.n, a.eps, a.y);
  }
  cache::cuda_check_launch("add_rms_norm");
}

}  // namespace fp4kv::ops
