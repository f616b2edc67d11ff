// SwiGLU of the fused gate_up GEMM output on the GPU: out = silu(gate) * up, BF16 in/out.
//
// Layout: gate_up [rows][2 intermediate], the gate projection's columns first, then the
// up projection's (the row order of the stacked weight w_gate_up in model/qwen3.cpp).
// Rounding points: a = bf16(silu(gate)) (transformers' act_fn on a BF16 tensor), then
// out = bf16(a * up). silu is core/hd_math.h's, bit-identical on host and device, so the CPU
// twin (reference.h) agrees bit for bit. No host synchronization. Gemm::run_swiglu runs the
// same function (swiglu.cuh) as the gate/up GEMV's epilogue where that GEMV runs.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

namespace fp4kv::ops {

struct SwigluArgs {
  const __nv_bfloat16* gate_up = nullptr;  // device [rows][2 intermediate]
  __nv_bfloat16* out = nullptr;            // device [rows][intermediate]
  int rows = 0;
  int intermediate = 0;
};

// Throws fp4kv::Error naming the bad argument before launching.
void swiglu(const SwigluArgs& args, cudaStream_t stream);

}  // namespace fp4kv::ops
