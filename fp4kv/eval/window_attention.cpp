#include "fp4kv/eval/window_attention.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <mutex>

#include "fp4kv/core/decode_layout.h"
#include "fp4kv/core/error.h"
#include "fp4kv/core/transform.h"
#include "fp4kv/core/parallel.h"
#include "fp4kv/ref/softmax_state.h"

extern "C" void openblas_set_num_threads(int);
extern "C" int openblas_get_num_threads(void);

namespace fp4kv::eval {

namespace {

constexpr int P = kPageTokens;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// C[m][n] = alpha * A[m][k] . B[n][k] (row-major, B transposed).
void gemm_abt(int m, int n, int k, float alpha, const float* a, const float* b, float* c) {
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, n, k, alpha, a, k, b, k, 0.0f, c, n);
}
// C[m][n] = A[m][k] . B[k][n]
void gemm_ab(int m, int n, int k, const float* a, const float* b, float* c) {
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, n, k, 1.0f, a, k, b, n, 0.0f, c, n);
}

// Running state of one split of one query row; o in float, as the BLAS products fill it.
using Split = ref::SoftmaxPartial<float>;

}  // namespace

void window_attention(const float* q, int G, int nq, const float* k, const float* v, int n, int d,
                      const Recipe& r, const float* mu_k, float* out, ref::PBlockStats* stats) {
  require(nq >= 1 && nq <= n, "window_attention: need 1 <= queries <= keys");
  const ref::HeadSequence seq(k, v, n, d, r, mu_k);  // transform, BF16 copies, full pages
  const bool quantized = r.fp4() || r.kv == KvFormat::fp8;
  const float gamma = log2e_over_sqrt_d_any(d);
  const float log2c = r.prob == ProbFormat::fp4_underflow ? std::log2(r.c) : 0.0f;

  // Dequantized full pages (value * g) and the queries as each product sees them.
  const int full = int(seq.pages().size());
  std::vector<float> kq(size_t(full) * P * d), vq(size_t(full) * P * d);
  for (int pg = 0; pg < full; ++pg)
    for (int i = 0; i < P; ++i)
      for (int c = 0; c < d; ++c) {
        kq[(size_t(pg) * P + i) * d + c] = seq.pages()[pg].k_value(i, c);
        vq[(size_t(pg) * P + i) * d + c] = seq.pages()[pg].v_value(i, c);
      }
  Recipe exact = r;
  exact.kv = KvFormat::fp32;
  exact.query = QueryFormat::full;
  std::vector<float> q_eff(size_t(G) * nq * d), q_full(size_t(G) * nq * d), one(size_t(G) * d);
  for (int i = 0; i < nq; ++i) {
    for (int h = 0; h < G; ++h) std::copy_n(q + (size_t(h) * nq + i) * d, d, &one[size_t(h) * d]);
    const auto e = ref::effective_query(one.data(), G, d, r);
    const auto f = ref::effective_query(one.data(), G, d, exact);
    for (int h = 0; h < G; ++h) {
      std::copy_n(&e[size_t(h) * d], d, &q_eff[(size_t(h) * nq + i) * d]);
      std::copy_n(&f[size_t(h) * d], d, &q_full[(size_t(h) * nq + i) * d]);
    }
  }
  const std::vector<float>& kb = seq.bf16_keys();
  const std::vector<float>& vb = seq.bf16_values();

  // Work in blocks of queries that share a page: they attend to the same full pages.
  const int first_pos = n - nq;
  std::vector<std::pair<int, int>> blocks;  // [i0, i1)
  for (int i = 0; i < nq;) {
    const int page = (first_pos + i) / P;
    const int i1 = std::min(nq, (page + 1) * P - first_pos);
    blocks.push_back({i, i1});
    i = i1;
  }
  std::mutex stats_mutex;
  const int saved_threads = openblas_get_num_threads();
  openblas_set_num_threads(1);
  parallel_for(int(blocks.size()), [&](int bi) {
    const auto [i0, i1] = blocks[size_t(blocks.size()) - 1 - bi];  // largest first
    const int nb = i1 - i0, rows = G * nb;
    const int page = (first_pos + i0) / P;
    const DecodeLayout Lfirst = decode_layout(first_pos + i0 + 1, quantized, r.bf16_sink, r.bf16_recent);
    // Full quantized pages attended by every query of the block.
    const int np = quantized ? std::min(page, full) : 0;
    ref::PBlockStats local;
    ref::PBlockStats* st = stats ? &local : nullptr;

    std::vector<float> qe(size_t(rows) * d), qf(size_t(rows) * d);
    for (int h = 0; h < G; ++h)
      for (int i = 0; i < nb; ++i) {
        std::copy_n(&q_eff[(size_t(h) * nq + i0 + i) * d], d, &qe[(size_t(h) * nb + i) * d]);
        std::copy_n(&q_full[(size_t(h) * nq + i0 + i) * d], d, &qf[(size_t(h) * nb + i) * d]);
      }
    std::vector<Split> qsplit(rows), bsplit(rows);
    for (int rr = 0; rr < rows; ++rr) {
      qsplit[rr].o.assign(d, 0.0f);
      qsplit[rr].log2c = log2c;
      bsplit[rr].o.assign(d, 0.0f);
    }

    // --- quantized split: full pages 0..np-1 as tiles, then (no sink) the open page ---
    if (np > 0) {
      const int nk = np * P;
      std::vector<float> s(size_t(rows) * nk), w(size_t(rows) * nk), pbuf(P), pq(P);
      std::vector<float> tile_m(np);
      gemm_abt(rows, nk, d, gamma, qe.data(), kq.data(), s.data());
      for (int rr = 0; rr < rows; ++rr) {
        float* srow = &s[size_t(rr) * nk];
        float* wrow = &w[size_t(rr) * nk];
        Split& sp = qsplit[rr];
        for (int j = 0; j < np; ++j) {
          const int first = (j == 0) ? Lfirst.masked_prefix : 0;
          float tmax = kNegInf;
          for (int t = first; t < P; ++t) tmax = std::max(tmax, srow[j * P + t]);
          const double alpha = sp.raise_max(tmax);
          const float m_new = sp.m;
          double psum = 0;
          for (int t = 0; t < P; ++t) {
            pbuf[t] = t < first ? 0.0f : std::exp2f((srow[j * P + t] - m_new) + log2c);
            psum += pbuf[t];
          }
          sp.l = sp.l * alpha + psum;
          const float f = ref::quantize_tile_probs(pbuf.data(), r, pq.data(), st);
          for (int t = 0; t < P; ++t) wrow[j * P + t] = pq[t] * f;
          tile_m[j] = m_new;
        }
        // Each tile's P was taken relative to its own running max: bring all to the last.
        for (int j = 0; j < np; ++j) {
          const float sc = std::exp2f(tile_m[j] - sp.m);
          for (int t = 0; t < P; ++t) wrow[j * P + t] *= sc;
        }
      }
      std::vector<float> o(size_t(rows) * d);
      gemm_ab(rows, d, nk, w.data(), vq.data(), o.data());
      for (int rr = 0; rr < rows; ++rr) std::copy_n(&o[size_t(rr) * d], d, qsplit[rr].o.data());
    }
    if (quantized && !r.bf16_recent) {
      // The open page, quantized as it stands at each query's step (last tile of the split).
      std::vector<float> kp(size_t(P) * d), vp(size_t(P) * d), pbuf(P), pq(P);
      for (int i = 0; i < nb; ++i) {
        const int pos = first_pos + i0 + i, len = pos - page * P + 1;
        const ref::QuantPage qp = ref::quantize_page(&seq.bf16_keys()[size_t(page) * P * d],
                                                     &seq.bf16_values()[size_t(page) * P * d], len, d, r);
        for (int t = 0; t < len; ++t)
          for (int c = 0; c < d; ++c) {
            kp[size_t(t) * d + c] = qp.k_value(t, c);
            vp[size_t(t) * d + c] = qp.v_value(t, c);
          }
        for (int h = 0; h < G; ++h) {
          const int rr = h * nb + i;
          Split& sp = qsplit[rr];
          float tmax = kNegInf;
          std::vector<float> sv(len, kNegInf);
          const int first = page == 0 ? Lfirst.masked_prefix : 0;  // the sink's copy in page 0
          for (int t = first; t < len; ++t) {
            double dot = 0;
            for (int c = 0; c < d; ++c) dot += double(qe[size_t(rr) * d + c]) * kp[size_t(t) * d + c];
            sv[t] = float(dot) * gamma;
            tmax = std::max(tmax, sv[t]);
          }
          const float m_new = std::max(sp.m, tmax);
          const float alpha = sp.m == kNegInf ? 0.0f : std::exp2f(sp.m - m_new);
          sp.m = m_new;
          double psum = 0;
          for (int t = 0; t < P; ++t) {
            pbuf[t] = t < len && t >= first ? std::exp2f((sv[t] - m_new) + log2c) : 0.0f;
            psum += pbuf[t];
          }
          sp.l = sp.l * alpha + psum;
          const float f = ref::quantize_tile_probs(pbuf.data(), r, pq.data(), st);
          for (int c = 0; c < d; ++c) {
            double acc = 0;
            for (int t = 0; t < len; ++t) acc += double(pq[t]) * vp[size_t(t) * d + c];
            sp.o[c] = sp.o[c] * alpha + float(acc) * f;
          }
        }
      }
    }

    // --- BF16 split: the sink and the unfinished page (everything for BF16/FP32 caches) ---
    const int last_pos = first_pos + i1 - 1;
    std::vector<int> keys;  // BF16 tokens attended by some query of the block
    if (!quantized || (r.bf16_recent && page == 0)) {
      for (int t = 0; t <= last_pos; ++t) keys.push_back(t);  // nothing promoted yet
    } else {
      if (r.bf16_sink)
        for (int t = 0; t < kSinkTokens && t <= last_pos; ++t) keys.push_back(t);
      if (r.bf16_recent)
        for (int t = page * P; t <= last_pos; ++t) keys.push_back(t);
    }
    if (!keys.empty()) {
      const int nk = int(keys.size());
      std::vector<float> kg(size_t(nk) * d), vg(size_t(nk) * d), s(size_t(rows) * nk), pm(size_t(rows) * nk);
      for (int j = 0; j < nk; ++j) {
        std::copy_n(&kb[size_t(keys[j]) * d], d, &kg[size_t(j) * d]);
        std::copy_n(&vb[size_t(keys[j]) * d], d, &vg[size_t(j) * d]);
      }
      gemm_abt(rows, nk, d, gamma, qf.data(), kg.data(), s.data());
      for (int rr = 0; rr < rows; ++rr) {
        const int pos = first_pos + i0 + rr % nb;
        float m = kNegInf;
        for (int j = 0; j < nk; ++j)
          if (keys[j] <= pos) m = std::max(m, s[size_t(rr) * nk + j]);
        double l = 0;
        for (int j = 0; j < nk; ++j) {
          const float p = keys[j] <= pos ? std::exp2f(s[size_t(rr) * nk + j] - m) : 0.0f;
          pm[size_t(rr) * nk + j] = p;
          l += p;
        }
        bsplit[rr].m = m;
        bsplit[rr].l = l;
      }
      std::vector<float> o(size_t(rows) * d);
      gemm_ab(rows, d, nk, pm.data(), vg.data(), o.data());
      for (int rr = 0; rr < rows; ++rr) std::copy_n(&o[size_t(rr) * d], d, bsplit[rr].o.data());
    }

    for (int h = 0; h < G; ++h)
      for (int i = 0; i < nb; ++i) {
        const int rr = h * nb + i;
        const ref::MergedSoftmax merged = ref::merge(qsplit[rr], bsplit[rr], d);
        float* row = out + (size_t(h) * nq + i0 + i) * d;
        for (int c = 0; c < d; ++c) row[c] = float(merged.o[c]);
      }
    if (stats) {
      std::lock_guard<std::mutex> lock(stats_mutex);
      stats->blocks += local.blocks;
      stats->zero_scale_blocks += local.zero_scale_blocks;
      for (size_t b = 0; b < local.pmax_log2_hist.size(); ++b) stats->pmax_log2_hist[b] += local.pmax_log2_hist[b];
    }
  });
  openblas_set_num_threads(saved_threads);
}

}  // namespace fp4kv::eval
