// cuBLASLt plan of one GEMM shape (gemm.h): descriptors, layouts, algorithm and workspace
// are made once here; run() is a single cublasLtMatmul.
#include "fp4kv/ops/gemm.h"

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "fp4kv/cache/cuda_check.h"
#include "fp4kv/core/error.h"
#include "fp4kv/ops/gemv.h"
#include "fp4kv/ops/swiglu.h"

namespace fp4kv::ops {
namespace {

constexpr uint32_t kAlignmentBytes = 16;

void cublas_check(cublasStatus_t s, std::string_view what) {
  if (s != CUBLAS_STATUS_SUCCESS) [[unlikely]] {
    throw Error("Gemm: " + std::string(what) + ": " + cublasLtGetStatusName(s) + " (" + cublasLtGetStatusString(s) +
                ")");
  }
}

std::string shape_text(const GemmShape& s) {
  return "m " + std::to_string(s.m) + ", n " + std::to_string(s.n) + ", k " + std::to_string(s.k) +
         (s.output == GemmOutput::f32 ? ", f32 output" : ", bf16 output");
}

}  // namespace

Gemm::Gemm(const GemmShape& shape, size_t workspace_bytes) : shape_(shape), workspace_bytes_(workspace_bytes) {
  require(shape.m > 0 && shape.n > 0 && shape.k > 0, "Gemm: every dimension must be positive (" + shape_text(shape) + ")");
  try {
    if (workspace_bytes_ > 0) cache::cuda_check(cudaMalloc(&workspace_, workspace_bytes_), "Gemm: workspace");
    cublas_check(cublasLtCreate(&handle_), "cublasLtCreate");
    cublas_check(cublasLtMatmulDescCreate(&op_, CUBLAS_COMPUTE_32F, CUDA_R_32F), "cublasLtMatmulDescCreate");
    const cublasOperation_t transpose = CUBLAS_OP_T, keep = CUBLAS_OP_N;
    cublas_check(cublasLtMatmulDescSetAttribute(op_, CUBLASLT_MATMUL_DESC_TRANSA, &transpose, sizeof transpose),
                 "set TRANSA");
    cublas_check(cublasLtMatmulDescSetAttribute(op_, CUBLASLT_MATMUL_DESC_TRANSB, &keep, sizeof keep), "set TRANSB");
    // Column-major: A = W^T' (stored k x n, ld k), B = X^T' (k x m, ld k), D = Y^T' (n x m, ld n).
    const cudaDataType_t out_type = shape.output == GemmOutput::f32 ? CUDA_R_32F : CUDA_R_16BF;
    cublas_check(cublasLtMatrixLayoutCreate(&a_, CUDA_R_16BF, shape.k, shape.n, shape.k), "layout A");
    cublas_check(cublasLtMatrixLayoutCreate(&b_, CUDA_R_16BF, shape.k, shape.m, shape.k), "layout B");
    cublas_check(cublasLtMatrixLayoutCreate(&d_, out_type, shape.n, shape.m, shape.n), "layout D");

    cublasLtMatmulPreference_t pref = nullptr;
    cublas_check(cublasLtMatmulPreferenceCreate(&pref), "cublasLtMatmulPreferenceCreate");
    const uint64_t ws = workspace_bytes_;
    cublasStatus_t s =
        cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws);
    for (auto attr : {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES}) {
      if (s == CUBLAS_STATUS_SUCCESS) s = cublasLtMatmulPreferenceSetAttribute(pref, attr, &kAlignmentBytes, sizeof kAlignmentBytes);
    }
    cublasLtMatmulHeuristicResult_t results[kGemmCandidates]{};
    int found = 0;
    if (s == CUBLAS_STATUS_SUCCESS) {
      s = cublasLtMatmulAlgoGetHeuristic(handle_, op_, a_, b_, d_, d_, pref, kGemmCandidates, results, &found);
    }
    cublasLtMatmulPreferenceDestroy(pref);
    cublas_check(s, "cublasLtMatmulAlgoGetHeuristic (" + shape_text(shape) + ")");
    require(found > 0, "Gemm: cuBLASLt has no algorithm for " + shape_text(shape) + " within a workspace of " +
                           std::to_string(workspace_bytes_) + " bytes");
    for (int i = 0; i < found; ++i) candidates_[i] = results[i].algo;
    num_candidates_ = found;
    algo_ = candidates_[0];
  } catch (...) {
    release();
    throw;
  }
}

Gemm::~Gemm() { release(); }

void Gemm::release() noexcept {
  if (d_) cublasLtMatrixLayoutDestroy(d_);
  if (b_) cublasLtMatrixLayoutDestroy(b_);
  if (a_) cublasLtMatrixLayoutDestroy(a_);
  if (op_) cublasLtMatmulDescDestroy(op_);
  if (handle_) cublasLtDestroy(handle_);
  if (workspace_) cudaFree(workspace_);
  d_ = b_ = a_ = nullptr;
  op_ = nullptr;
  handle_ = nullptr;
  workspace_ = nullptr;
}

int Gemm::tune(const __nv_bfloat16* x, const std::vector<const __nv_bfloat16*>& weights, void* y,
               cudaStream_t stream) {
  require(!weights.empty(), "Gemm::tune: no weights to time on (" + shape_text(shape_) + ")");
  constexpr int kWarmupPasses = 1, kTimedPasses = 3;
  cudaEvent_t begin = nullptr, end = nullptr;
  cache::cuda_check(cudaEventCreate(&begin), "Gemm::tune: event");
  cache::cuda_check(cudaEventCreate(&end), "Gemm::tune: event");
  // Time of kTimedPasses passes over `weights` with the plan as it stands.
  auto time_ms = [&]() {
    auto pass = [&] {
      for (const __nv_bfloat16* w : weights) run_any(x, w, y, stream);
    };
    for (int r = 0; r < kWarmupPasses; ++r) pass();
    cache::cuda_check(cudaEventRecord(begin, stream), "Gemm::tune: event");
    for (int r = 0; r < kTimedPasses; ++r) pass();
    cache::cuda_check(cudaEventRecord(end, stream), "Gemm::tune: event");
    cache::cuda_check(cudaEventSynchronize(end), "Gemm::tune");
    float ms = 0;
    cache::cuda_check(cudaEventElapsedTime(&ms, begin, end), "Gemm::tune: elapsed");
    return ms;
  };
  float best_ms = 0;
  int best = 0;
  try {
    use_gemv_ = false;
    for (int i = 0; i < num_candidates_; ++i) {
      algo_ = candidates_[i];
      const float ms = time_ms();
      if (i == 0 || ms < best_ms) best_ms = ms, best = i;
    }
    algo_ = candidates_[best];
    if (gemv_supports(shape_.m, shape_.k)) {
      gemv_prepare(shape_.m, shape_.k);
      use_gemv_ = true;
      if (time_ms() < best_ms) best = kTunedGemv;
      else use_gemv_ = false;
    }
  } catch (...) {
    cudaEventDestroy(begin);
    cudaEventDestroy(end);
    algo_ = candidates_[0];
    use_gemv_ = false;
    throw;
  }
  cudaEventDestroy(begin);
  cudaEventDestroy(end);
  return best;
}

bool Gemm::use_gemv() {
  use_gemv_ = gemv_supports(shape_.m, shape_.k);
  if (use_gemv_) gemv_prepare(shape_.m, shape_.k);  // before any capture of a launch
  return use_gemv_;
}

void Gemm::run(const __nv_bfloat16* x, const __nv_bfloat16* w, __nv_bfloat16* y, cudaStream_t stream) const {
  require(shape_.output == GemmOutput::bf16, "Gemm::run: BF16 output given to a plan of " + shape_text(shape_));
  run_any(x, w, y, stream);
}

void Gemm::run(const __nv_bfloat16* x, const __nv_bfloat16* w, float* y, cudaStream_t stream) const {
  require(shape_.output == GemmOutput::f32, "Gemm::run: FP32 output given to a plan of " + shape_text(shape_));
  run_any(x, w, y, stream);
}

// Messages are built only on failure: the run functions are on the decode step's hot path.
void Gemm::check_operands(const void* x, const void* w, const void* y) const {
  if (!x || !w || !y) throw Error("Gemm::run: a device pointer is null (" + shape_text(shape_) + ")");
  for (const void* p : {x, w, y}) {
    if (reinterpret_cast<uintptr_t>(p) % kAlignmentBytes != 0) {
      throw Error("Gemm::run: pointer " + std::to_string(reinterpret_cast<uintptr_t>(p)) + " is not " +
                  std::to_string(kAlignmentBytes) + "-byte aligned");
    }
  }
}

void Gemm::run_swiglu(const __nv_bfloat16* x, const __nv_bfloat16* w, __nv_bfloat16* product, __nv_bfloat16* act,
                      cudaStream_t stream) const {
  if (shape_.output != GemmOutput::bf16 || shape_.n % 2 != 0)
    throw Error("Gemm::run_swiglu: needs a BF16 plan of even n (gate rows, then up rows), not " + shape_text(shape_));
  const int intermediate = shape_.n / 2;
  if (use_gemv_ && gemv_swiglu_supports(shape_.m, shape_.k)) {
    check_operands(x, w, act);
    gemv_swiglu(x, w, act, shape_.m, intermediate, shape_.k, stream);
    return;
  }
  run_any(x, w, product, stream);
  swiglu({product, act, shape_.m, intermediate}, stream);
}

void Gemm::run_any(const void* x, const void* w, void* y, cudaStream_t stream) const {
  check_operands(x, w, y);
  if (use_gemv_) {
    gemv(static_cast<const __nv_bfloat16*>(x), static_cast<const __nv_bfloat16*>(w), y,
         shape_.output == GemmOutput::f32, shape_.m, shape_.n, shape_.k, stream);
    return;
  }
  const float alpha = 1.0f, beta = 0.0f;
  const cublasStatus_t s = cublasLtMatmul(handle_, op_, &alpha, w, a_, x, b_, &beta, y, d_, y, d_, &algo_,
                                          workspace_, workspace_bytes_, stream);
  if (s != CUBLAS_STATUS_SUCCESS) cublas_check(s, "cublasLtMatmul (" + shape_text(shape_) + ")");
}

}  // namespace fp4kv::ops
