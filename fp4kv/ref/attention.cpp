#include "fp4kv/ref/attention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "fp4kv/core/block_quant.h"
#include "fp4kv/core/error.h"
#include "fp4kv/core/half.h"
#include "fp4kv/core/operand_quant.h"
#include "fp4kv/core/transform.h"
#include "fp4kv/ref/query_operand.h"
#include "fp4kv/ref/softmax_state.h"

namespace fp4kv::ref {

namespace {

constexpr int P = kPageTokens;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();
// fp8qp probabilities: E4M3(p / 2^-8) x 2^-8. p <= 1 (exp2(s - m)), so p x 2^8 <= 256 < 448;
// a power of two keeps the scaling exact; p below 2^-17 (E4M3's subnormal floor) is 0.
constexpr float kFp8ProbScale = 1.0f / 256.0f;

float exp2f_ref(float x) { return float(std::exp2(double(x))); }

// Running state of one split for one head, in double (log2c: 0, or 3 when the P scaling
// factor c = 8 is folded into exp2).
using SplitState = SoftmaxPartial<double>;

void log_hist(PBlockStats& s, float pmax) {
  int bin = 40;
  if (pmax > 0.0f) bin = std::min(40, std::max(0, -floor_log2(pmax) - 1));
  s.pmax_log2_hist[bin]++;
}

}  // namespace

float quantize_tile_probs(const float* p, const Recipe& r, float* pq, PBlockStats* stats) {
  const bool c_folded = r.prob == ProbFormat::fp4_underflow;
  float pv_factor = 1.0f;  // two-level scaling multiplies its P.V partial back
  if (r.prob == ProbFormat::full) {
    for (int i = 0; i < P; ++i) pq[i] = round_operand(p[i]);
  } else if (r.prob == ProbFormat::fp8) {
    for (int i = 0; i < P; ++i) pq[i] = fp8_value(fp8_encode(p[i], kFp8ProbScale), kFp8ProbScale);
  } else if (r.kv == KvFormat::nvfp4) {
    float boost = 1.0f;
    if (r.prob == ProbFormat::fp4_two_level) {
      float amax = 0.0f;
      for (int i = 0; i < P; ++i) amax = std::max(amax, p[i]);
      if (amax > 0.0f) {
        boost = div_rn(kNvfp4GlobalDivisor, amax);  // tile max -> 448 * 6
        pv_factor = div_rn(amax, kNvfp4GlobalDivisor);
      }
    }
    for (int b = 0; b < P; b += kNvfp4Block) {
      float x[kNvfp4Block], pmax = 0.0f;
      for (int i = 0; i < kNvfp4Block; ++i) {
        x[i] = r.prob == ProbFormat::fp4_two_level ? mul_rn(p[b + i], boost) : p[b + i];
        pmax = std::max(pmax, x[i]);
      }
      for (int i = 0; i < kNvfp4Block; ++i) pq[b + i] = 0.0f;
      if (pmax == 0.0f) continue;  // nothing attended in this block
      const uint8_t sc = nvfp4_prob_scale(pmax, r.prob == ProbFormat::fp4_underflow, r.tau);
      const float sv = e4m3_value(sc);
      for (int i = 0; i < kNvfp4Block; ++i) pq[b + i] = mul_rn(e2m1_value(nvfp4_prob_code(x[i], sv)), sv);
      if (stats) {
        stats->blocks++;
        if (sv == 0.0f) stats->zero_scale_blocks++;
        // Histogram of max(p_b) itself, without c or the two-level boost.
        const float unscaled = r.prob == ProbFormat::fp4_two_level ? div_rn(pmax, boost)
                               : c_folded                          ? div_rn(pmax, r.c)
                                                                   : pmax;
        log_hist(*stats, unscaled);
      }
    }
  } else {  // MXFP4 probabilities
    for (int b = 0; b < P; b += kMxfp4Block) {
      float pmax = 0.0f;
      for (int i = 0; i < kMxfp4Block; ++i) pmax = std::max(pmax, p[b + i]);
      for (int i = 0; i < kMxfp4Block; ++i) pq[b + i] = 0.0f;
      if (pmax == 0.0f) continue;
      const uint8_t sc = mxfp4_prob_scale(pmax);
      for (int i = 0; i < kMxfp4Block; ++i) pq[b + i] = mul_rn(e2m1_value(mxfp4_prob_code(p[b + i], sc)), e8m0_value(sc));
      if (stats) {
        stats->blocks++;
        log_hist(*stats, c_folded ? div_rn(pmax, r.c) : pmax);
      }
    }
  }
  return pv_factor;
}

namespace {

// One tile (= one quantized page) of Algorithm 1 for one head.
void process_page(const QueryOperand& op, const QuantPage& page, int first, int end, const Recipe& r, float gamma,
                  SplitState& st, PBlockStats* stats) {
  const int d = page.d;
  std::vector<float> s(P, kNegInf);
  float tile_max = kNegInf;
  for (int i = first; i < end; ++i) {
    s[i] = page_logit(op, page, i, gamma);
    tile_max = std::max(tile_max, s[i]);
  }
  if (tile_max == kNegInf) return;
  const double alpha = st.raise_max(tile_max);
  const float m_new = st.m;

  // p_i = exp2(S_i - m + log2 c); the row sum uses the unquantized p.
  std::vector<float> p(P, 0.0f), pq(P, 0.0f);
  double psum = 0.0;
  for (int i = first; i < end; ++i) {
    p[i] = exp2f_ref(add_rn(sub_rn(s[i], m_new), st.log2c));
    psum += p[i];
  }
  st.l = st.l * alpha + psum;

  const float pv_factor = quantize_tile_probs(p.data(), r, pq.data(), stats);
  for (int c = 0; c < d; ++c) {
    double pv = 0.0;
    for (int i = first; i < end; ++i) pv += double(pq[i]) * double(page.v_expanded(i, c));
    st.o[c] = st.o[c] * alpha + double(mul_rn(mul_rn(float(pv), page.v_g), pv_factor));
  }
}

// The BF16 split (sink + recent): FP32 arithmetic on BF16-stored K' and V, no quantization.
void process_bf16(const QueryOperand& op, const HeadCacheView& view, float gamma, SplitState& st) {
  const int d = view.d, n = view.layout.bf16_tokens();
  if (n == 0) return;
  std::vector<float> s(n);
  float m = kNegInf;
  for (int i = 0; i < n; ++i) {
    double dot = 0.0;
    for (int c = 0; c < d; ++c) dot += double(op.full[c]) * double(view.bf16_k[size_t(i) * d + c]);
    s[i] = mul_rn(float(dot), gamma);
    m = std::max(m, s[i]);
  }
  st.m = m;
  for (int i = 0; i < n; ++i) {
    const float p = exp2f_ref(sub_rn(s[i], m));
    st.l += p;
    for (int c = 0; c < d; ++c) st.o[c] += double(p) * double(view.bf16_v[size_t(i) * d + c]);
  }
}

}  // namespace

AttentionOutput exact_attention(const float* q, int G, const float* k, const float* v, int n, int d) {
  require(n >= 1, "empty sequence: attention needs at least one key");
  require(G >= 1 && d >= 1, "attention needs G >= 1 query heads and head_dim >= 1");
  AttentionOutput res;
  res.out.assign(size_t(G) * d, 0.0f);
  res.lse.assign(G, 0.0f);
  const double scale = 1.0 / std::sqrt(double(d));
  std::vector<double> s(n);
  for (int h = 0; h < G; ++h) {
    for (int i = 0; i < n; ++i) {
      double dot = 0.0;
      for (int c = 0; c < d; ++c) dot += double(q[size_t(h) * d + c]) * double(k[size_t(i) * d + c]);
      s[i] = dot * scale;
    }
    res.lse[h] = float(exact_softmax_average(s, v, size_t(d), d, &res.out[size_t(h) * d]));
  }
  return res;
}

AttentionOutput quantized_attention(const float* q, int G, const HeadCacheView& view, const Recipe& r,
                                    const SplitBounds& bounds_in, PBlockStats* stats) {
  const int d = view.d;
  check_head_dim(d, r);
  require(G >= 1, "decode attention needs at least one query head");
  const DecodeLayout& L = view.layout;
  require(L.quant_pages + L.bf16_tokens() > 0, "empty sequence: decode attention needs at least one token");
  require(int(view.pages.size()) == L.quant_pages, "view has " + std::to_string(view.pages.size()) +
                                                        " pages, layout says " + std::to_string(L.quant_pages));
  SplitBounds bounds = bounds_in;
  if (bounds.empty()) bounds = {0, L.quant_pages};
  require(bounds.front() == 0 && bounds.back() == L.quant_pages && std::is_sorted(bounds.begin(), bounds.end()),
          "split bounds must rise from 0 to the number of quantized pages");

  const float gamma = log2e_over_sqrt_d_any(d);
  const auto ops = make_query_operands(q, G, d, r);
  const float log2c = r.prob == ProbFormat::fp4_underflow ? std::log2(r.c) : 0.0f;

  AttentionOutput res;
  res.out.assign(size_t(G) * d, 0.0f);
  res.lse.assign(G, 0.0f);
  for (int h = 0; h < G; ++h) {
    std::vector<SplitState> splits;
    for (size_t s = 0; s + 1 < bounds.size(); ++s) {
      SplitState st;
      st.o.assign(d, 0.0);
      st.log2c = log2c;
      for (int pg = bounds[s]; pg < bounds[s + 1]; ++pg) {
        const int first = pg == 0 ? L.masked_prefix : 0;
        const int end = pg == L.quant_pages - 1 ? L.last_page_tokens : P;
        process_page(ops[h], *view.pages[pg], first, end, r, gamma, st, stats);
      }
      splits.push_back(std::move(st));
    }
    SplitState bf;
    bf.o.assign(d, 0.0);
    process_bf16(ops[h], view, gamma, bf);
    splits.push_back(std::move(bf));

    std::vector<const SplitState*> parts;
    for (const SplitState& st : splits) parts.push_back(&st);
    const MergedSoftmax merged = merge<double>(parts, d);
    for (int c = 0; c < d; ++c) res.out[size_t(h) * d + c] = float(merged.o[c]);
    double shift = 0.0;  // q.mu_k / sqrt(d), removed from every logit by smoothing
    if (r.smooth_keys && view.mu_k) {
      for (int c = 0; c < d; ++c)
        shift += double(is_finite(q[size_t(h) * d + c]) ? q[size_t(h) * d + c] : 0.0f) * double(view.mu_k[c]);
      shift /= std::sqrt(double(d));
    }
    res.lse[h] = merged.lse(shift);
  }
  return res;
}

HeadSequence::HeadSequence(const float* k, const float* v, int n, int d, const Recipe& r, const float* mu_k)
    : n_(n), d_(d), recipe_(r) {
  require(n >= 0, "negative sequence length");
  check_head_dim(d, r);
  k_t_.resize(size_t(n) * d);
  v_.assign(v, v + size_t(n) * d);
  for (int t = 0; t < n; ++t)
    transform_key(k + size_t(t) * d, mu_k, d, r.smooth_keys, r.rotate_keys, &k_t_[size_t(t) * d]);
  if (r.smooth_keys && mu_k) mu_.assign(mu_k, mu_k + d);
  const bool exact = r.kv == KvFormat::fp32;
  k_bf16_.resize(k_t_.size());
  v_bf16_.resize(v_.size());
  for (size_t i = 0; i < k_t_.size(); ++i) {
    // Non-finite values are stored as 0 in the BF16 slot (and so in pages); one count per
    // element of K' and V.
    const float kx = is_finite(k_t_[i]) ? k_t_[i] : 0.0f, vx = is_finite(v_[i]) ? v_[i] : 0.0f;
    if (!is_finite(k_t_[i]) || !is_finite(v_[i])) ++nonfinite_;
    k_bf16_[i] = exact ? kx : round_bf16(kx);
    v_bf16_[i] = exact ? vx : round_bf16(vx);
  }
  if (r.fp4() || r.kv == KvFormat::fp8) {
    // Pages are quantized from the values as the BF16 slot holds them, as the GPU cache
    // does: every path into a page (prefill, promotion, re-quantization) then agrees.
    for (int p = 0; p < n / P; ++p)
      pages_.push_back(quantize_page(&k_bf16_[size_t(p) * P * d], &v_bf16_[size_t(p) * P * d], P, d, r));
  }
}

void HeadSequence::view(int n_tokens, View& out) const {
  require(n_tokens >= 1 && n_tokens <= n_, "decode view of " + std::to_string(n_tokens) +
                                               " tokens outside the sequence of " + std::to_string(n_));
  const bool quantized = recipe_.fp4() || recipe_.kv == KvFormat::fp8;
  const DecodeLayout L = decode_layout(n_tokens, quantized, recipe_.bf16_sink, recipe_.bf16_recent);
  out.view = HeadCacheView{};
  out.view.d = d_;
  out.view.layout = L;
  out.view.mu_k = mu_.empty() ? nullptr : mu_.data();
  for (int p = 0; p < L.quant_pages; ++p) {
    if (p == L.quant_pages - 1 && L.last_page_tokens < P) {
      out.partial = quantize_page(&k_bf16_[size_t(p) * P * d_], &v_bf16_[size_t(p) * P * d_], L.last_page_tokens, d_,
                                  recipe_);
      out.view.pages.push_back(&out.partial);
    } else {
      out.view.pages.push_back(&pages_[p]);
    }
  }
  out.bf16_k.clear();
  out.bf16_v.clear();
  auto gather = [&](int b, int e) {
    out.bf16_k.insert(out.bf16_k.end(), k_bf16_.begin() + size_t(b) * d_, k_bf16_.begin() + size_t(e) * d_);
    out.bf16_v.insert(out.bf16_v.end(), v_bf16_.begin() + size_t(b) * d_, v_bf16_.begin() + size_t(e) * d_);
  };
  gather(0, L.sink_tokens);
  gather(L.recent_begin, L.recent_end);
  out.view.bf16_k = out.bf16_k.data();
  out.view.bf16_v = out.bf16_v.data();
}

AttentionOutput decode_attention(const float* q, int G, const float* k, const float* v, int n, int d,
                                 const Recipe& recipe, const float* mu_k, const SplitBounds& bounds,
                                 PBlockStats* stats) {
  require(n >= 1, "empty sequence: decode attention needs at least one token");
  HeadSequence seq(k, v, n, d, recipe, mu_k);
  HeadSequence::View v_;
  seq.view(n, v_);
  return quantized_attention(q, G, v_.view, recipe, bounds, stats);
}

std::vector<float> effective_query(const float* q, int G, int d, const Recipe& r) {
  check_head_dim(d, r);
  const auto ops = make_query_operands(q, G, d, r);
  std::vector<float> out(size_t(G) * d);
  for (int h = 0; h < G; ++h) {
    for (int c = 0; c < d; ++c) {
      float x;
      if (ops[h].terms.empty()) {
        x = ops[h].full[c];
      } else {
        x = ops[h].terms[0].dequant[c];
        for (size_t t = 1; t < ops[h].terms.size(); ++t) x = add_rn(x, ops[h].terms[t].dequant[c]);
        if (!ops[h].qbar.empty()) x = add_rn(x, ops[h].qbar[c]);
      }
      out[size_t(h) * d + c] = x;
    }
  }
  return out;
}

}  // namespace fp4kv::ref
