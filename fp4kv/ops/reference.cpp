// CPU twins of the GPU ops (reference.h).
#include "fp4kv/ops/reference.h"

#include <algorithm>
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
                                           int vocab, int hidden, int32_t* error_flags, int table_first,
                                           int table_rows) {
  if (table_rows == 0) table_rows = vocab;
  std::vector<uint16_t> out(token_ids.size() * size_t(hidden), 0);
  for (size_t t = 0; t < token_ids.size(); ++t) {
    const int32_t id = token_ids[t];
    if (id < 0 || id >= vocab) {
      *error_flags |= kErrorTokenOutOfRange;
      continue;
    }
    if (id < table_first || id >= table_first + table_rows) continue;
    std::copy_n(table.data() + size_t(id - table_first) * hidden, hidden, out.data() + t * hidden);
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

MoeRouteReference ref_moe_route(const std::vector<uint16_t>& logits, int rows, int num_experts, int top_k,
                                bool normalize_top_k) {
  constexpr int kLanes = 32;
  MoeRouteReference r;
  r.experts.resize(size_t(rows) * top_k);
  r.weights.resize(r.experts.size());
  for (int row = 0; row < rows; ++row) {
    const uint16_t* l = logits.data() + size_t(row) * num_experts;
    int32_t* experts = r.experts.data() + size_t(row) * top_k;
    float* weights = r.weights.data() + size_t(row) * top_k;
    bool bad = false;
    float m = -std::numeric_limits<float>::infinity();
    for (int e = 0; e < num_experts; ++e) {
      bad = bad || !is_finite(bf(l[e]));
      m = std::fmax(m, bf(l[e]));
    }
    if (bad) {
      r.error_flags |= kErrorRouterLogit;
      for (int j = 0; j < top_k; ++j) experts[j] = j, weights[j] = 0.0f;
      continue;
    }
    // The kernel's sum: per lane over its experts in order, then a butterfly over the lanes.
    std::vector<float> p(static_cast<size_t>(num_experts));
    double lane_sum[kLanes] = {};
    for (int e = 0; e < num_experts; ++e) {
      p[size_t(e)] = exp_nonpositive(sub_rn(bf(l[e]), m));
      lane_sum[e % kLanes] += double(p[size_t(e)]);
    }
    for (int o = kLanes / 2; o > 0; o /= 2) {
      double next[kLanes];
      for (int lane = 0; lane < kLanes; ++lane) next[lane] = lane_sum[lane] + lane_sum[lane ^ o];
      std::copy(next, next + kLanes, lane_sum);
    }
    const float inv = float(1.0 / lane_sum[0]);
    for (float& v : p) v = mul_rn(v, inv);
    std::vector<int> order(static_cast<size_t>(num_experts));
    for (int e = 0; e < num_experts; ++e) order[size_t(e)] = e;
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return p[size_t(a)] > p[size_t(b)]; });
    float kept = 0.0f;
    for (int j = 0; j < top_k; ++j) kept = add_rn(kept, p[size_t(order[size_t(j)])]);
    std::vector<int> chosen(order.begin(), order.begin() + top_k);
    std::sort(chosen.begin(), chosen.end());
    for (int j = 0; j < top_k; ++j) {
      const float w = p[size_t(chosen[size_t(j)])];
      experts[j] = chosen[size_t(j)];
      weights[j] = round_bf16(normalize_top_k ? div_rn(w, kept) : w);
    }
  }
  return r;
}

MoeExpertsReference ref_moe_experts(const std::vector<uint16_t>& x, const std::vector<uint16_t>& gate_up,
                                    const std::vector<int32_t>& experts, int rows, int top_k, int hidden,
                                    int intermediate, ExpertRange held) {
  const size_t outputs = size_t(rows) * top_k * intermediate;
  MoeExpertsReference r{std::vector<uint16_t>(outputs), std::vector<double>(outputs), std::vector<double>(outputs),
                        std::vector<double>(outputs), std::vector<double>(outputs)};
  for (int row = 0; row < rows; ++row) {
    for (int j = 0; j < top_k; ++j) {
      const size_t pair = size_t(row) * top_k + j;
      if (!held.holds(experts[pair])) continue;
      const size_t e = size_t(experts[pair] - held.first);
      // The gate rows, then the up rows, of the expert, times this row of x.
      const GemmReference p =
          ref_gemm(x.data() + size_t(row) * hidden, gate_up.data() + e * 2 * intermediate * hidden, 1,
                   2 * intermediate, hidden);
      for (int c = 0; c < intermediate; ++c) {
        const size_t o = pair * intermediate + c;
        r.gate[o] = p.y[size_t(c)], r.gate_abs[o] = p.abs_sum[size_t(c)];
        r.up[o] = p.y[size_t(intermediate + c)], r.up_abs[o] = p.abs_sum[size_t(intermediate + c)];
        const float act = round_bf16(silu(round_bf16(float(r.gate[o]))));
        r.act[o] = float_to_bf16_bits(mul_rn(act, round_bf16(float(r.up[o]))));
      }
    }
  }
  return r;
}

MoeCombineReference ref_moe_combine(const std::vector<uint16_t>& act, const std::vector<uint16_t>& down,
                                    const std::vector<int32_t>& experts, const std::vector<float>& weights, int rows,
                                    int top_k, int hidden, int intermediate, ExpertRange held) {
  MoeCombineReference r{std::vector<uint16_t>(size_t(rows) * hidden),
                        std::vector<double>(size_t(rows) * top_k * hidden),
                        std::vector<double>(size_t(rows) * top_k * hidden)};
  for (size_t pair = 0; pair < size_t(rows) * top_k; ++pair) {
    if (!held.holds(experts[pair])) continue;
    const GemmReference p = ref_gemm(act.data() + pair * intermediate,
                                     down.data() + size_t(experts[pair] - held.first) * hidden * intermediate, 1,
                                     hidden, intermediate);
    std::copy(p.y.begin(), p.y.end(), r.y.begin() + pair * hidden);
    std::copy(p.abs_sum.begin(), p.abs_sum.end(), r.y_abs.begin() + pair * hidden);
  }
  for (int row = 0; row < rows; ++row) {
    for (int h = 0; h < hidden; ++h) {
      float acc = 0.0f;
      for (int j = 0; j < top_k; ++j) {
        const size_t pair = size_t(row) * top_k + j;
        if (!held.holds(experts[pair])) continue;
        acc = round_bf16(add_rn(acc, round_bf16(mul_rn(round_bf16(float(r.y[pair * hidden + h])), weights[pair]))));
      }
      r.out[size_t(row) * hidden + h] = float_to_bf16_bits(acc);
    }
  }
  return r;
}

GemmReference ref_gemm(const std::vector<uint16_t>& x, const std::vector<uint16_t>& w, int m, int n, int k) {
  return ref_gemm(x.data(), w.data(), m, n, k);
}

GemmReference ref_gemm(const uint16_t* x, const uint16_t* w, int m, int n, int k) {
  GemmReference r;
  r.y.assign(size_t(m) * n, 0.0);
  r.abs_sum.assign(r.y.size(), 0.0);
  std::vector<float> xf(size_t(m) * k), wf(size_t(n) * k);
  for (size_t i = 0; i < xf.size(); ++i) xf[i] = bf(x[i]);
  for (size_t i = 0; i < wf.size(); ++i) wf[i] = bf(w[i]);
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
