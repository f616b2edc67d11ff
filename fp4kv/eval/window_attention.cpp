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

// What every query block of a window reads: the recipe's constants, the full pages
// dequantized, the BF16 rows, and the queries as each product sees them.
struct Window {
  const Recipe& r;
  const ref::HeadSequence& seq;
  int G, nq, d;
  int full;       // full pages of the sequence
  int first_pos;  // position of query 0
  bool quantized;
  float gamma, log2c;
  std::vector<float> kq{}, vq{};         // [full * P][d]: every full page's keys and values (value * g)
  std::vector<float> q_eff{}, q_full{};  // [G][nq][d]: queries for the quantized and the exact products
};

// The dequantized full pages and the queries of a window.
void prepare_window(const float* q, Window& w) {
  const int d = w.d, G = w.G, nq = w.nq;
  w.kq.resize(size_t(w.full) * P * d);
  w.vq.resize(size_t(w.full) * P * d);
  for (int pg = 0; pg < w.full; ++pg)
    for (int i = 0; i < P; ++i)
      for (int c = 0; c < d; ++c) {
        w.kq[(size_t(pg) * P + i) * d + c] = w.seq.pages()[pg].k_value(i, c);
        w.vq[(size_t(pg) * P + i) * d + c] = w.seq.pages()[pg].v_value(i, c);
      }
  Recipe exact = w.r;
  exact.kv = KvFormat::fp32;
  exact.query = QueryFormat::full;
  w.q_eff.resize(size_t(G) * nq * d);
  w.q_full.resize(size_t(G) * nq * d);
  std::vector<float> one(size_t(G) * d);
  for (int i = 0; i < nq; ++i) {
    for (int h = 0; h < G; ++h) std::copy_n(q + (size_t(h) * nq + i) * d, d, &one[size_t(h) * d]);
    const auto e = ref::effective_query(one.data(), G, d, w.r);
    const auto f = ref::effective_query(one.data(), G, d, exact);
    for (int h = 0; h < G; ++h) {
      std::copy_n(&e[size_t(h) * d], d, &w.q_eff[(size_t(h) * nq + i) * d]);
      std::copy_n(&f[size_t(h) * d], d, &w.q_full[(size_t(h) * nq + i) * d]);
    }
  }
}

// Queries [i0, i1) of a window whose positions share a page: they attend to the same full
// pages. Their rows are head-major: row h * nb + i is head h's query i0 + i.
struct QueryBlock {
  int i0, i1, nb, rows;
  int page;                   // the page their positions fall in
  int np;                     // full quantized pages every query of the block attends
  DecodeLayout first;         // the layout at the block's first query
  std::vector<float> qe, qf;  // [rows][d]: the block's rows of q_eff and q_full
};

QueryBlock make_block(const Window& w, int i0, int i1) {
  QueryBlock b;
  b.i0 = i0;
  b.i1 = i1;
  b.nb = i1 - i0;
  b.rows = w.G * b.nb;
  b.page = (w.first_pos + i0) / P;
  b.first = decode_layout(w.first_pos + i0 + 1, w.quantized, w.r.bf16_sink, w.r.bf16_recent);
  b.np = w.quantized ? std::min(b.page, w.full) : 0;
  const int d = w.d;
  b.qe.resize(size_t(b.rows) * d);
  b.qf.resize(size_t(b.rows) * d);
  for (int h = 0; h < w.G; ++h)
    for (int i = 0; i < b.nb; ++i) {
      std::copy_n(&w.q_eff[(size_t(h) * w.nq + i0 + i) * d], d, &b.qe[(size_t(h) * b.nb + i) * d]);
      std::copy_n(&w.q_full[(size_t(h) * w.nq + i0 + i) * d], d, &b.qf[(size_t(h) * b.nb + i) * d]);
    }
  return b;
}

// The quantized split over the block's full pages 0 .. np - 1, each page one tile of the
// online softmax with its P quantized, the products by BLAS: into qsplit.
void full_pages_split(const Window& w, const QueryBlock& b, std::vector<Split>& qsplit, ref::PBlockStats* st) {
  const int rows = b.rows, np = b.np, d = w.d, nk = np * P;
  std::vector<float> s(size_t(rows) * nk), wp(size_t(rows) * nk), pbuf(P), pq(P);
  std::vector<float> tile_m(np);
  gemm_abt(rows, nk, d, w.gamma, b.qe.data(), w.kq.data(), s.data());
  for (int rr = 0; rr < rows; ++rr) {
    float* srow = &s[size_t(rr) * nk];
    float* wrow = &wp[size_t(rr) * nk];
    Split& sp = qsplit[rr];
    for (int j = 0; j < np; ++j) {
      const int first = (j == 0) ? b.first.masked_prefix : 0;
      float tmax = kNegInf;
      for (int t = first; t < P; ++t) tmax = std::max(tmax, srow[j * P + t]);
      const double alpha = sp.raise_max(tmax);
      const float m_new = sp.m;
      double psum = 0;
      for (int t = 0; t < P; ++t) {
        pbuf[t] = t < first ? 0.0f : std::exp2f((srow[j * P + t] - m_new) + w.log2c);
        psum += pbuf[t];
      }
      sp.l = sp.l * alpha + psum;
      const float f = ref::quantize_tile_probs(pbuf.data(), w.r, pq.data(), st);
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
  gemm_ab(rows, d, nk, wp.data(), w.vq.data(), o.data());
  for (int rr = 0; rr < rows; ++rr) std::copy_n(&o[size_t(rr) * d], d, qsplit[rr].o.data());
}

// The open page (caches without BF16 recent rows), quantized as it stands at each query's
// step: the last tile of each row's quantized split.
void open_page_tile(const Window& w, const QueryBlock& b, std::vector<Split>& qsplit, ref::PBlockStats* st) {
  const int d = w.d, page = b.page;
  std::vector<float> kp(size_t(P) * d), vp(size_t(P) * d), pbuf(P), pq(P);
  for (int i = 0; i < b.nb; ++i) {
    const int pos = w.first_pos + b.i0 + i, len = pos - page * P + 1;
    const ref::QuantPage qp = ref::quantize_page(&w.seq.bf16_keys()[size_t(page) * P * d],
                                                 &w.seq.bf16_values()[size_t(page) * P * d], len, d, w.r);
    for (int t = 0; t < len; ++t)
      for (int c = 0; c < d; ++c) {
        kp[size_t(t) * d + c] = qp.k_value(t, c);
        vp[size_t(t) * d + c] = qp.v_value(t, c);
      }
    for (int h = 0; h < w.G; ++h) {
      const int rr = h * b.nb + i;
      Split& sp = qsplit[rr];
      float tmax = kNegInf;
      std::vector<float> sv(len, kNegInf);
      const int first = page == 0 ? b.first.masked_prefix : 0;  // the sink's copy in page 0
      for (int t = first; t < len; ++t) {
        double dot = 0;
        for (int c = 0; c < d; ++c) dot += double(b.qe[size_t(rr) * d + c]) * kp[size_t(t) * d + c];
        sv[t] = float(dot) * w.gamma;
        tmax = std::max(tmax, sv[t]);
      }
      const float m_new = std::max(sp.m, tmax);
      const float alpha = sp.m == kNegInf ? 0.0f : std::exp2f(sp.m - m_new);
      sp.m = m_new;
      double psum = 0;
      for (int t = 0; t < P; ++t) {
        pbuf[t] = t < len && t >= first ? std::exp2f((sv[t] - m_new) + w.log2c) : 0.0f;
        psum += pbuf[t];
      }
      sp.l = sp.l * alpha + psum;
      const float f = ref::quantize_tile_probs(pbuf.data(), w.r, pq.data(), st);
      for (int c = 0; c < d; ++c) {
        double acc = 0;
        for (int t = 0; t < len; ++t) acc += double(pq[t]) * vp[size_t(t) * d + c];
        sp.o[c] = sp.o[c] * alpha + float(acc) * f;
      }
    }
  }
}

// The BF16 tokens some query of the block attends: the sink and the unfinished page
// (everything for BF16/FP32 caches, and before anything is promoted).
std::vector<int> bf16_keys_of(const Window& w, const QueryBlock& b) {
  const int last_pos = w.first_pos + b.i1 - 1;
  std::vector<int> keys;
  if (!w.quantized || (w.r.bf16_recent && b.page == 0)) {
    for (int t = 0; t <= last_pos; ++t) keys.push_back(t);
  } else {
    if (w.r.bf16_sink)
      for (int t = 0; t < kSinkTokens && t <= last_pos; ++t) keys.push_back(t);
    if (w.r.bf16_recent)
      for (int t = b.page * P; t <= last_pos; ++t) keys.push_back(t);
  }
  return keys;
}

// The BF16 split over `keys` (each row masked to the keys at or before its position), exact
// queries, the products by BLAS: into bsplit.
void bf16_split(const Window& w, const QueryBlock& b, const std::vector<int>& keys, std::vector<Split>& bsplit) {
  const int rows = b.rows, d = w.d, nk = int(keys.size());
  const std::vector<float>& kb = w.seq.bf16_keys();
  const std::vector<float>& vb = w.seq.bf16_values();
  std::vector<float> kg(size_t(nk) * d), vg(size_t(nk) * d), s(size_t(rows) * nk), pm(size_t(rows) * nk);
  for (int j = 0; j < nk; ++j) {
    std::copy_n(&kb[size_t(keys[j]) * d], d, &kg[size_t(j) * d]);
    std::copy_n(&vb[size_t(keys[j]) * d], d, &vg[size_t(j) * d]);
  }
  gemm_abt(rows, nk, d, w.gamma, b.qf.data(), kg.data(), s.data());
  for (int rr = 0; rr < rows; ++rr) {
    const int pos = w.first_pos + b.i0 + rr % b.nb;
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

// Queries [i0, i1) of the window: both splits, merged into out [G][nq][d]; P-block
// statistics into *st when given.
void attend_block(const Window& w, int i0, int i1, float* out, ref::PBlockStats* st) {
  const QueryBlock b = make_block(w, i0, i1);
  std::vector<Split> qsplit(b.rows), bsplit(b.rows);
  for (int rr = 0; rr < b.rows; ++rr) {
    qsplit[rr].o.assign(w.d, 0.0f);
    qsplit[rr].log2c = w.log2c;
    bsplit[rr].o.assign(w.d, 0.0f);
  }
  if (b.np > 0) full_pages_split(w, b, qsplit, st);
  if (w.quantized && !w.r.bf16_recent) open_page_tile(w, b, qsplit, st);
  const std::vector<int> keys = bf16_keys_of(w, b);
  if (!keys.empty()) bf16_split(w, b, keys, bsplit);
  for (int h = 0; h < w.G; ++h)
    for (int i = 0; i < b.nb; ++i) {
      const int rr = h * b.nb + i;
      const ref::MergedSoftmax merged = ref::merge(qsplit[rr], bsplit[rr], w.d);
      float* row = out + (size_t(h) * w.nq + i0 + i) * w.d;
      for (int c = 0; c < w.d; ++c) row[c] = float(merged.o[c]);
    }
}

void add_stats(const ref::PBlockStats& from, ref::PBlockStats& to) {
  to.blocks += from.blocks;
  to.zero_scale_blocks += from.zero_scale_blocks;
  for (size_t b = 0; b < from.pmax_log2_hist.size(); ++b) to.pmax_log2_hist[b] += from.pmax_log2_hist[b];
}

}  // namespace

void window_attention(const float* q, int G, int nq, const float* k, const float* v, int n, int d,
                      const Recipe& r, const float* mu_k, float* out, ref::PBlockStats* stats) {
  require(nq >= 1 && nq <= n, "window_attention: need 1 <= queries <= keys");
  const ref::HeadSequence seq(k, v, n, d, r, mu_k);  // transform, BF16 copies, full pages
  Window w{.r = r,
           .seq = seq,
           .G = G,
           .nq = nq,
           .d = d,
           .full = int(seq.pages().size()),
           .first_pos = n - nq,
           .quantized = r.fp4() || r.kv == KvFormat::fp8,
           .gamma = log2e_over_sqrt_d_any(d),
           .log2c = r.prob == ProbFormat::fp4_underflow ? std::log2(r.c) : 0.0f};
  prepare_window(q, w);

  std::vector<std::pair<int, int>> blocks;  // [i0, i1): queries whose positions share a page
  for (int i = 0; i < nq;) {
    const int page = (w.first_pos + i) / P;
    const int i1 = std::min(nq, (page + 1) * P - w.first_pos);
    blocks.push_back({i, i1});
    i = i1;
  }
  std::mutex stats_mutex;
  const int saved_threads = openblas_get_num_threads();
  openblas_set_num_threads(1);
  parallel_for(int(blocks.size()), [&](int bi) {
    const auto [i0, i1] = blocks[blocks.size() - 1 - size_t(bi)];  // largest first
    ref::PBlockStats local;
    attend_block(w, i0, i1, out, stats ? &local : nullptr);
    if (stats) {
      std::lock_guard<std::mutex> lock(stats_mutex);
      add_stats(local, *stats);
    }
  });
  openblas_set_num_threads(saved_threads);
}

}  // namespace fp4kv::eval
