// SwiGLU kernel: a grid-stride loop over the rows x intermediate outputs.
#include "fp4kv/ops/swiglu.h"

#include <algorithm>
#include <string>

#include "fp4kv/cache/cuda_check.h"
#include "fp4kv/core/error.h"
#include "fp4kv/cache/dependent_launch.cuh"
#include "fp4kv/ops/swiglu.cuh"

namespace fp4kv::ops {
namespace {

constexpr int kThreads = 256;
constexpr int kMaxBlocks = 4096;

__global__ void __launch_bounds__(kThreads)
    swiglu_kernel(const __nv_bfloat16* gate_up, int64_t total, int intermediate, __nv_bfloat16* out) {
  cache::allow_dependents();  // the down GEMV may start streaming its weights
  cache::wait_for_producer();  // launched as a programmatic dependent of the gate/up GEMM
  for (int64_t e = int64_t(blockIdx.x) * kThreads + threadIdx.x; e < total; e += int64_t(gridDim.x) * kThreads) {
    const int64_t row = e / intermediate, col = e % intermediate;
    const __nv_bfloat16* g = gate_up + row * 2 * intermediate;
    out[e] = swiglu_value(g[col], g[intermediate + col]);
  }
}

}  // namespace

void swiglu(const SwigluArgs& a, cudaStream_t stream) {
  require(a.rows >= 0, "swiglu: rows " + std::to_string(a.rows) + " is negative");
  require(a.intermediate > 0, "swiglu: intermediate " + std::to_string(a.intermediate) + " must be positive");
  if (a.rows == 0) return;
  require(a.gate_up && a.out, "swiglu: a device pointer is null");
  const int64_t total = int64_t(a.rows) * a.intermediate;
  const int blocks = int(std::min<int64_t>(kMaxBlocks, (total + kThreads - 1) / kThreads));
  cache::launch_dependent(swiglu_kernel, dim3(blocks), dim3(kThreads), 0, stream, a.gate_up, total, a.intermediate,
                          a.out);
  cache::cuda_check_launch("swiglu");
}

}  // namespace fp4kv::ops
