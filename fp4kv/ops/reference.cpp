// CPU twins of the GPU ops (reference.h).
#include "fp4kv/ops/reference.h"

#include <cmath>
#include <limits>

#include "fp4kv/core/half.h"
#include "fp4kv/core/parallel.h"
#include "fp4kv/ops/common.h"
#include "fp4kv/core/hd_math.h"

namespace fp4kv::ops {
namespace {

float bf(uint16_t bits) { return bf16_bits_to_float(bits); }

// The norm's output n_i = bf16(w_i * bf16(x_i * r)) of one vector x[n] (rms_norm.h).
void norm_vector(const float* x, const uint16_t* weight, int n, float eps, float* out) {
  double ss = 0;
  for (int i = 0; i < n; ++i) ss += double(x[i]) * double(x[i]);
  const float r = rms_scale(float(ss / n), eps);
  for (int i = 0; i < n; ++i) out[i] = round_bf16(bf(weight[i]) * round_bf16(x[i] * r));
}

std::vector<uint16_t> norm_rows(const std::vector<float>& x, const std::vector<uint16_t>& weight, int rows, int n,
                                float eps) {
  std::vector<uint16_t> y(size_t(rows) * n);
  std::vector<float> tmp(static_cast<size_t>(n));
  for (int r = 0; r < rows; ++r) {
    norm_vector(x.data() + size_t(r) * n, weight.data(), n, eps, tmp.data());
    for (int i = 0; i < n; ++i) y[size_t(r) * n + i] = float_to_bf16_bits(tmp[size_t(i)]);
  }
  return y;
}

}  // namespace

std::vector<uint16_t> ref_embedding_gather(const std::vector<int32_t>& token_ids, const std::vector<uint16_t>& table,
                                           int vocab, int hidden, int32_t* error_flags) {
  std::vector<uint16_t> out(token_ids.size() * size_t(hidden), 0);
  for (size_t t = 0; t < token_ids.size(); ++t) {
    const int32_t id = token_ids[t];
    if (id < 0 || id >= vocab) {
      *error_flags |= kErrorTokenOutOfRange;
      continue;
    }
    std::copy_n(table.data() + size_t(id) * hidden, hidden, out.data() + t * hidden);
  }
  return out;
}

std::vector<uint16_t> ref_rms_norm(const std::vector<uint16_t>& x, const std::vector<uint16_t>& weight, int rows,
                                   int n, float eps) {
  std::vector<float> xf(x.size());
  for (size_t i = 0; i < x.size(); ++i) xf[i] = bf(x[i]);
  return norm_rows(xf, weight, rows, n, eps);
}

std::vector<uint16_t> ref_add_rms_norm(std::vector<uint16_t>& residual, const std::vector<uint16_t>& delta,
                                       const std::vector<uint16_t>& weight, int rows, int n, float eps) {
  std::vector<float> s(residual.size());
  for (size_t i = 0; i < residual.size(); ++i) {
    residual[i] = float_to_bf16_bits(bf(residual[i]) + bf(delta[i]));
    s[i] = bf(residual[i]);
  }
  return norm_rows(s, weight, rows, n, eps);
}

QkvOutputs ref_qk_norm_rope(const std::vector<uint16_t>& qkv, const std::vector<int32_t>& positions,
                            const std::vector<uint16_t>& q_norm, const std::vector<uint16_t>& k_norm,
                            const RopeTable& rope, const QkvShape& s) {
  const int d = s.head_dim, half = d / 2, heads = s.q_heads + 2 * s.kv_heads;
  QkvOutputs o;
  o.q.assign(size_t(s.tokens) * s.q_heads * d, 0);
  o.k.assign(size_t(s.tokens) * s.kv_heads * d, 0.0f);
  o.v.assign(o.k.size(), 0.0f);
  const size_t dn = static_cast<size_t>(d);
  std::vector<float> x(dn), nrm(dn), out(dn);
  for (int t = 0; t < s.tokens; ++t) {
    const int pos = positions[size_t(t)];
    const bool valid = pos >= 0 && pos < rope.positions;
    if (!valid) o.error_flags |= kErrorPositionOutOfRange;
    for (int j = 0; j < heads; ++j) {
      const uint16_t* src = qkv.data() + (size_t(t) * heads + j) * d;
      for (int i = 0; i < d; ++i) x[size_t(i)] = bf(src[i]);
      if (j >= s.q_heads + s.kv_heads) {
        std::copy_n(x.data(), d, o.v.data() + (size_t(t) * s.kv_heads + (j - s.q_heads - s.kv_heads)) * d);
        continue;
      }
      std::fill(out.begin(), out.end(), 0.0f);
      if (valid) {
        norm_vector(x.data(), (j < s.q_heads ? q_norm : k_norm).data(), d, s.eps, nrm.data());
        for (int i = 0; i < half; ++i) {
          const float c = bf(rope.cos_bits[size_t(pos) * half + i]), sn = bf(rope.sin_bits[size_t(pos) * half + i]);
          const float n1 = nrm[size_t(i)], n2 = nrm[size_t(i + half)];
          out[size_t(i)] = round_bf16(round_bf16(n1 * c) - round_bf16(n2 * sn));
          out[size_t(i + half)] = round_bf16(round_bf16(n2 * c) + round_bf16(n1 * sn));
        }
      }
      if (j < s.q_heads) {
        uint16_t* dst = o.q.data() + (size_t(t) * s.q_heads + j) * d;
        for (int i = 0; i < d; ++i) dst[i] = float_to_bf16_bits(out[size_t(i)]);
      } else {
        std::copy_n(out.data(), d, o.k.data() + (size_t(t) * s.kv_heads + (j - s.q_heads)) * d);
      }
    }
  }
  return o;
}

std::vector<uint16_t> ref_swiglu(const std::vector<uint16_t>& gate_up, int rows, int intermediate) {
  std::vector<uint16_t> out(size_t(rows) * intermediate);
  for (int r = 0; r < rows; ++r) {
    const uint16_t* g = gate_up.data() + size_t(r) * 2 * intermediate;
    for (int i = 0; i < intermediate; ++i) {
      const float act = round_bf16(silu(bf(g[i])));
      out[size_t(r) * intermediate + i] = float_to_bf16_bits(act * bf(g[intermediate + i]));
    }
  }
  return out;
}

GemmReference ref_gemm(const std::vector<uint16_t>& x, const std::vector<uint16_t>& w, int m, int n, int k) {
  GemmReference r;
  r.y.assign(size_t(m) * n, 0.0);
  r.abs_sum.assign(r.y.size(), 0.0);
  std::vector<float> xf(x.size()), wf(w.size());
  for (size_t i = 0; i < x.size(); ++i) xf[i] = bf(x[i]);
  for (size_t i = 0; i < w.size(); ++i) wf[i] = bf(w[i]);
  parallel_for_chunks(n, 64, [&](int64_t begin, int64_t end) {
    for (int64_t col = begin; col < end; ++col) {
      const float* wr = wf.data() + size_t(col) * k;
      for (int row = 0; row < m; ++row) {
        const float* xr = xf.data() + size_t(row) * k;
        double acc = 0, abs_acc = 0;
        for (int i = 0; i < k; ++i) {
          const double p = double(xr[i]) * double(wr[i]);
          acc += p;
          abs_acc += std::fabs(p);
        }
        r.y[size_t(row) * n + col] = acc;
        r.abs_sum[size_t(row) * n + col] = abs_acc;
      }
    }
  });
  return r;
}

}  // namespace fp4kv::ops
