// CPU reference of FP4 MLA decode (mla.h).
#include "fp4kv/ref/mla.h"

#include <cmath>
#include <limits>
#include <string>

#include "fp4kv/core/error.h"
#include "fp4kv/core/half.h"
#include "fp4kv/core/transform.h"
#include "fp4kv/ref/query_operand.h"
#include "fp4kv/ref/softmax_state.h"

namespace fp4kv::ref {

namespace {

constexpr int P = kPageTokens;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();
using SplitState = SoftmaxPartial<double>;

void check_shape(const MlaShape& s) {
  require(s.latent_dim > 0 && s.rope_dim >= 0 && s.nope_dim > 0,
          "MLA shape: latent_dim and nope_dim must be positive, rope_dim non-negative");
}

// A head's queries as the products see them.
struct MlaQuery {
  QueryOperand content;       // against the latent: q'_c = H q_c (and its FP4 terms)
  const float* rope = nullptr;  // [d_r] q_r
};

double rope_dot(const float* q_r, const float* r, int dr) {
  double dot = 0.0;
  for (int c = 0; c < dr; ++c) dot += double(q_r[c]) * double(r[c]);
  return dot;
}

// One page of the latent cache (tokens [first, end)) for one head.
void mla_page(const MlaQuery& q, const QuantPage& page, const float* r_rows, int dr, int first, int end, float gamma,
              SplitState& st) {
  const int dc = page.d;
  std::vector<float> s(P, kNegInf);
  float tile_max = kNegInf;
  for (int i = first; i < end; ++i) {
    // Latent part as the GQA page logit, positional part in FP32, summed once.
    const float pos = mul_rn(float(rope_dot(q.rope, r_rows + size_t(i) * dr, dr)), gamma);
    s[i] = add_rn(page_logit(q.content, page, i, gamma), pos);
    tile_max = std::max(tile_max, s[i]);
  }
  if (tile_max == kNegInf) return;
  const double alpha = st.raise_max(tile_max);
  std::vector<float> pq(P, 0.0f);
  double psum = 0.0;
  for (int i = first; i < end; ++i) {
    const float p = float(std::exp2(double(sub_rn(s[i], st.m))));
    psum += p;
    pq[i] = round_operand(p);
  }
  st.l = st.l * alpha + psum;
  for (int c = 0; c < dc; ++c) {
    double pv = 0.0;
    for (int i = first; i < end; ++i) pv += double(pq[i]) * double(page.k_expanded(i, c));
    st.o[c] = st.o[c] * alpha + double(mul_rn(float(pv), page.k_g));
  }
}

// The BF16 rows (sink, then recent): FP32 arithmetic on the stored latents and r rows.
void mla_bf16(const MlaQuery& q, const float* latent_rows, const float* r_rows, int n, int dc, int dr, float gamma,
              SplitState& st) {
  if (n == 0) return;
  std::vector<float> s(n);
  float m = kNegInf;
  for (int i = 0; i < n; ++i) {
    double dot = 0.0;
    for (int c = 0; c < dc; ++c) dot += double(q.content.full[c]) * double(latent_rows[size_t(i) * dc + c]);
    dot += rope_dot(q.rope, r_rows + size_t(i) * dr, dr);
    s[i] = mul_rn(float(dot), gamma);
    m = std::max(m, s[i]);
  }
  st.m = m;
  for (int i = 0; i < n; ++i) {
    const float p = float(std::exp2(double(sub_rn(s[i], m))));
    st.l += p;
    for (int c = 0; c < dc; ++c) st.o[c] += double(p) * double(latent_rows[size_t(i) * dc + c]);
  }
}

}  // namespace

MlaOutput exact_mla(const float* q_c, const float* q_r, int H, const float* c, const float* r, int n,
                    const MlaShape& shape) {
  check_shape(shape);
  require(n >= 1 && H >= 1, "MLA attention needs at least one token and one head");
  const int dc = shape.latent_dim, dr = shape.rope_dim;
  const double scale = 1.0 / std::sqrt(double(shape.nope_dim + dr));
  MlaOutput res;
  res.out.assign(size_t(H) * dc, 0.0f);
  res.lse.assign(H, 0.0f);
  std::vector<double> s(n);
  for (int h = 0; h < H; ++h) {
    for (int t = 0; t < n; ++t) {
      double dot = rope_dot(q_r + size_t(h) * dr, r + size_t(t) * dr, dr);
      for (int k = 0; k < dc; ++k) dot += double(q_c[size_t(h) * dc + k]) * double(c[size_t(t) * dc + k]);
      s[t] = dot * scale;
    }
    res.lse[h] = float(exact_softmax_average(s, c, size_t(dc), dc, &res.out[size_t(h) * dc]));
  }
  return res;
}

namespace {

const Recipe& check_mla_recipe(const Recipe& r) {
  require(r.kv != KvFormat::fp32, "MLA: fp32 is the exact path (exact_mla), not a cache format");
  require(r.query != QueryFormat::smooth_fp4 && r.prob != ProbFormat::fp4_two_level && r.query != QueryFormat::fp8,
          "MLA: recipe '" + r.name + "' is a GQA comparison variant with no MLA form");
  return r;
}

}  // namespace

MlaSequence::MlaSequence(const float* c, const float* r, int n, const MlaShape& shape, const Recipe& recipe,
                         const float* mu_c)
    : shape_(shape),
      recipe_(check_mla_recipe(recipe)),
      latent_(c, std::vector<float>(size_t(std::max(n, 0)) * shape.latent_dim, 0.0f).data(), n, shape.latent_dim,
              recipe, mu_c) {
  check_shape(shape);
  r_bf16_.resize(size_t(n) * shape.rope_dim);
  for (size_t i = 0; i < r_bf16_.size(); ++i) r_bf16_[i] = is_finite(r[i]) ? round_bf16(r[i]) : 0.0f;
  if (recipe.smooth_keys && mu_c) mu_.assign(mu_c, mu_c + shape.latent_dim);
}

MlaOutput MlaSequence::decode(const float* q_c, const float* q_r, int H, int n_tokens) const {
  require(H >= 1, "MLA decode needs at least one head");
  const int dc = shape_.latent_dim, dr = shape_.rope_dim;
  HeadSequence::View v;
  latent_.view(n_tokens, v);
  const DecodeLayout& L = v.view.layout;
  const float gamma = log2e_over_sqrt_d_any(shape_.nope_dim + dr);
  const std::vector<QueryOperand> ops = make_query_operands(q_c, H, dc, recipe_);
  // The BF16 rows' positional keys in the order of the gathered latent rows.
  std::vector<float> r_rows(r_bf16_.begin(), r_bf16_.begin() + size_t(L.sink_tokens) * dr);
  r_rows.insert(r_rows.end(), r_bf16_.begin() + size_t(L.recent_begin) * dr, r_bf16_.begin() + size_t(L.recent_end) * dr);

  MlaOutput res;
  res.out.assign(size_t(H) * dc, 0.0f);
  res.lse.assign(H, 0.0f);
  for (int h = 0; h < H; ++h) {
    const MlaQuery q{ops[h], q_r + size_t(h) * dr};
    SplitState pages, bf;
    pages.o.assign(dc, 0.0);
    bf.o.assign(dc, 0.0);
    for (int pg = 0; pg < L.quant_pages; ++pg) {
      const int first = pg == 0 ? L.masked_prefix : 0;
      const int end = pg == L.quant_pages - 1 ? L.last_page_tokens : P;
      mla_page(q, *v.view.pages[pg], r_bf16_.data() + size_t(pg) * P * dr, dr, first, end, gamma, pages);
    }
    mla_bf16(q, v.view.bf16_k, r_rows.data(), L.bf16_tokens(), dc, dr, gamma, bf);
    const MergedSoftmax merged = merge<double>(pages, bf, dc);
    // u = H^T u' + mu_c: the rotation is its own inverse (H symmetric, orthonormal).
    std::vector<float> u(dc);
    for (int k = 0; k < dc; ++k) u[k] = float(merged.o[k]);
    if (recipe_.rotate_keys) fwht_inplace(u.data(), dc);
    for (int k = 0; k < dc; ++k) res.out[size_t(h) * dc + k] = mu_.empty() ? u[k] : add_rn(u[k], mu_[k]);
    double shift = 0.0;  // q_c . mu_c / sqrt(d_nope + d_r), removed from every logit by smoothing
    if (!mu_.empty()) {
      for (int k = 0; k < dc; ++k) {
        const float x = q_c[size_t(h) * dc + k];
        shift += double(is_finite(x) ? x : 0.0f) * double(mu_[k]);
      }
      shift /= std::sqrt(double(shape_.nope_dim + dr));
    }
    res.lse[h] = merged.lse(shift);
  }
  return res;
}

}  // namespace fp4kv::ref
