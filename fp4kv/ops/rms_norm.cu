// RMSNorm kernels: one CTA per row; pass 1 sums squares (and, fused, stores the rounded
// residual sum), pass 2 normalizes. Each thread revisits only the elements it wrote in
// pass 1, so the residual it reads back needs no barrier beyond the sum's. Launched as
// programmatic dependents (cache/dependent_launch.cuh) that wait for their producer before
// reading anything: their launch overlaps the producer's tail.
#include "fp4kv/ops/rms_norm.h"

#include <string>

#include "fp4kv/cache/cuda_check.h"
#include "fp4kv/core/error.h"
#include "fp4kv/core/hd_math.h"
#include "fp4kv/cache/dependent_launch.cuh"

namespace fp4kv::ops {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr unsigned kFullMask = 0xffffffffu;

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
  cache::launch_dependent(rms_norm_kernel, dim3(a.rows), dim3(kThreads), 0, stream, a.x, a.weight, a.n, a.eps, a.y);
  cache::cuda_check_launch("rms_norm");
}

void add_rms_norm(const AddRmsNormArgs& a, cudaStream_t stream) {
  check_sizes("add_rms_norm", a.rows, a.n, a.eps);
  if (a.rows == 0) return;
  require(a.residual && a.delta && a.weight && a.y, "add_rms_norm: a device pointer is null");
  require(a.y != a.residual, "add_rms_norm: y must not alias residual");
  cache::launch_dependent(add_rms_norm_kernel, dim3(a.rows), dim3(kThreads), 0, stream, a.residual, a.delta, a.weight,
                          a.n, a.eps, a.y);
  cache::cuda_check_launch("add_rms_norm");
}

}  // namespace fp4kv::ops
