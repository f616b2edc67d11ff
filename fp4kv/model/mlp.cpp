// The CPU runner's linear layer and SwiGLU MLP (mlp.h).
#include "fp4kv/model/mlp.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "fp4kv/core/parallel.h"

namespace fp4kv::model {

void linear(const float* x, const float* w, int M, int N, int K, float* y) {
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, N, K, 1.0f, x, K, w, K, 0.0f, y, N);
}

void swiglu_mlp(const float* x, int rows, int hidden, int intermediate, const float* gate_up, const float* down,
                float* out) {
  const int I = intermediate;
  std::vector<float> gu(size_t(rows) * 2 * I), act(size_t(rows) * I);
  linear(x, gate_up, rows, 2 * I, hidden, gu.data());
  parallel_for_chunks(rows, std::max<int64_t>(1, 16384 / I), [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) {
      const float* g = gu.data() + t * 2 * I;
      const float* u = g + I;
      float* a = act.data() + t * I;
      for (int i = 0; i < I; ++i) a[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
    }
  });
  linear(act.data(), down, rows, hidden, I, out);
}

}  // namespace fp4kv::model
