// The SwiGLU of one (gate, up) pair of BF16 GEMM outputs, shared by the SwiGLU kernel and the
// GEMV's SwiGLU epilogue so that both give the same bits (swiglu.h: a = bf16(silu(gate)),
// out = bf16(a * up); silu is core/hd_math.h's, the CPU twin's too).
#pragma once

#include <cuda_bf16.h>

#include "fp4kv/core/hd_math.h"

namespace fp4kv::ops {

__device__ __forceinline__ __nv_bfloat16 swiglu_value(__nv_bfloat16 gate, __nv_bfloat16 up) {
  const float act = __bfloat162float(__float2bfloat16_rn(silu(__bfloat162float(gate))));
  return __float2bfloat16_rn(__fmul_rn(act, __bfloat162float(up)));
}

}  // namespace fp4kv::ops
