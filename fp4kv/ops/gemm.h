// Y[M][N] = X[M][K] W[N][K]^T through cuBLASLt (torch.nn.Linear, weights as Hugging Face
// stores them), BF16 inputs, FP32 accumulation, BF16 or FP32 output (the FP32 variant is the
// LM head: the final hidden states times the tied embedding table [vocab][hidden]).
//
// A Gemm is the plan of one shape: the constructor creates the cuBLASLt handle, the matmul
// descriptor and the three layouts, asks the heuristic once for the algorithm, and allocates
// the workspace; run() only launches (no allocation, no host synchronization: capturable in
// a CUDA graph). tune() may replace the heuristic's first algorithm by the fastest of its
// candidates, measured on the caller's operands. Row-major Y = X W^T is the column-major Y^T = W^T' X^T', i.e. cuBLAS's
// A = W (transposed, ld K), B = X (ld K), D = Y^T (ld N).
//
// Invariants: pointers passed to run() must be 16-byte aligned (the heuristic is asked for
// algorithms under that alignment); errors are fp4kv::Error with the cuBLAS status name.
#pragma once

#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <vector>

namespace fp4kv::ops {

enum class GemmOutput { bf16, f32 };

struct GemmShape {
  int m = 0;  // rows of X and Y (tokens)
  int n = 0;  // rows of W, columns of Y (output features)
  int k = 0;  // columns of X and W (input features)
  GemmOutput output = GemmOutput::bf16;
};

inline constexpr size_t kDefaultGemmWorkspaceBytes = size_t(32) << 20;
inline constexpr int kGemmCandidates = 8;  // heuristic results kept for Gemm::tune

class Gemm {
 public:
  // Throws fp4kv::Error for a non-positive dimension, a cuBLAS failure, or when no algorithm fits.
  explicit Gemm(const GemmShape& shape, size_t workspace_bytes = kDefaultGemmWorkspaceBytes);
  ~Gemm();
  Gemm(const Gemm&) = delete;
  Gemm& operator=(const Gemm&) = delete;

  // x: device [m][k], w: device [n][k], y: device [m][n]; the overload must match shape().output.
  void run(const __nv_bfloat16* x, const __nv_bfloat16* w, __nv_bfloat16* y, cudaStream_t stream) const;
  void run(const __nv_bfloat16* x, const __nv_bfloat16* w, float* y, cudaStream_t stream) const;
  // The MLP's gate/up product and its SwiGLU (ops/swiglu.h): w holds the gate rows, then the
  // up rows (n = 2 intermediate); act [m][n / 2]. With the GEMV plan, where gemv_swiglu
  // applies, one kernel (the SwiGLU as the GEMV's epilogue: one kernel boundary less in a
  // decode step, the product never written); else the product X W^T into `product` [m][n]
  // and ops::swiglu. The same bits either way. A BF16-output plan of even n only (else
  // fp4kv::Error).
  void run_swiglu(const __nv_bfloat16* x, const __nv_bfloat16* w, __nv_bfloat16* product, __nv_bfloat16* act,
                  cudaStream_t stream) const;

  // Times each of the heuristic's candidate algorithms (up to 8), and for m <= 8 our GEMV
  // (ops/gemv.h), on these operands and keeps the fastest; returns its rank in the
  // heuristic's list (0: the heuristic's first choice) or kTunedGemv. Each timing is a few
  // passes over `weights` (one model's layers: together larger than the L2 cache, so W is
  // read from memory as in a decode step; one matrix would be timed out of L2 when it fits).
  // Synchronizes the stream: call outside graph capture. Every candidate is an
  // FP32-accumulated GEMM; they differ only in summation order.
  static constexpr int kTunedGemv = -1;
  int tune(const __nv_bfloat16* x, const std::vector<const __nv_bfloat16*>& weights, void* y, cudaStream_t stream);

  // Plans our GEMV from now on where it supports the shape (m <= 8; tests and A/B runs that
  // want the GEMV path without timing); returns whether it does.
  bool use_gemv();

  const GemmShape& shape() const { return shape_; }

 private:
  void run_any(const void* x, const void* w, void* y, cudaStream_t stream) const;
  void check_operands(const void* x, const void* w, const void* y) const;  // non-null, 16-byte aligned
  void release() noexcept;

  GemmShape shape_;
  size_t workspace_bytes_ = 0;
  void* workspace_ = nullptr;
  cublasLtHandle_t handle_ = nullptr;
  cublasLtMatmulDesc_t op_ = nullptr;
  cublasLtMatrixLayout_t a_ = nullptr, b_ = nullptr, d_ = nullptr;
  cublasLtMatmulAlgo_t algo_{};
  cublasLtMatmulAlgo_t candidates_[kGemmCandidates]{};  // the heuristic's list, best first
  int num_candidates_ = 0;
  bool use_gemv_ = false;  // tune() found ops::gemv faster for this shape
};

}  // namespace fp4kv::ops
