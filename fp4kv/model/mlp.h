// The float32 building blocks the CPU runner's dense MLP and the Qwen3-MoE experts (moe.h)
// share.
#pragma once

namespace fp4kv::model {

// y[M][N] = x[M][K] w[N][K]^T: a torch.nn.Linear without bias, weights as stored by HF.
void linear(const float* x, const float* w, int M, int N, int K, float* y);

// out[rows][hidden] = down(silu(gate(x)) * up(x)) for x[rows][hidden]: gate_up
// [2 intermediate][hidden] (the gate rows, then the up rows), down [hidden][intermediate].
void swiglu_mlp(const float* x, int rows, int hidden, int intermediate, const float* gate_up, const float* down,
                float* out);

}  // namespace fp4kv::model
