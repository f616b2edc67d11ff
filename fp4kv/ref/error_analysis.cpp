#include "fp4kv/ref/error_analysis.h"

#include <algorithm>
#include <cmath>

#include "fp4kv/core/error.h"
#include "fp4kv/core/half.h"
#include "fp4kv/core/transform.h"

namespace fp4kv::ref {

LogitError logit_error(const float* q, int G, const float* k, int n, int d, const Recipe& r, const float* mu_k) {
  require(n >= 1, "empty sequence: logit error needs at least one key");
  // Exact transformed keys and their cached (dequantized) values.
  std::vector<float> kt(size_t(n) * d), kq(size_t(n) * d);
  for (int t = 0; t < n; ++t) transform_key(k + size_t(t) * d, mu_k, d, r.smooth_keys, r.rotate_keys, &kt[size_t(t) * d]);
  if (r.fp4() || r.kv == KvFormat::fp8) {
    const std::vector<float> zeros(size_t(kPageTokens) * d, 0.0f);
    for (int p0 = 0; p0 < n; p0 += kPageTokens) {
      const int len = std::min(kPageTokens, n - p0);
      const QuantPage page = quantize_page(&kt[size_t(p0) * d], zeros.data(), len, d, r);
      for (int i = 0; i < len; ++i)
        for (int c = 0; c < d; ++c) kq[size_t(p0 + i) * d + c] = page.k_value(i, c);
    }
  } else {
    for (size_t i = 0; i < kt.size(); ++i) kq[i] = r.kv == KvFormat::fp32 ? kt[i] : round_bf16(kt[i]);
  }
  const std::vector<float> qe = effective_query(q, G, d, r);  // q~ (transformed, quantized)
  Recipe exact_q = r;
  exact_q.query = QueryFormat::full;
  exact_q.kv = KvFormat::fp32;  // the unrounded transformed query q'
  const std::vector<float> qx = effective_query(q, G, d, exact_q);

  LogitError e;
  const double inv = 1.0 / std::sqrt(double(d));
  for (int h = 0; h < G; ++h) {
    for (int t = 0; t < n; ++t) {
      double tot = 0, kterm = 0, qterm = 0;
      for (int c = 0; c < d; ++c) {
        const double a = qe[size_t(h) * d + c], x = qx[size_t(h) * d + c];
        const double kk = kq[size_t(t) * d + c], kx = kt[size_t(t) * d + c];
        tot += a * kk - x * kx;
        kterm += a * (kk - kx);
        qterm += (a - x) * kx;
      }
      e.total += tot * tot * inv * inv;
      e.key_term += kterm * kterm * inv * inv;
      e.query_term += qterm * qterm * inv * inv;
    }
  }
  const double count = double(G) * n;
  e.total /= count;
  e.key_term /= count;
  e.query_term /= count;
  return e;
}

OutputError output_error(const float* q, int G, const float* k, const float* v, int n, int d, const Recipe& r,
                         const float* mu_k, const SplitBounds& bounds) {
  OutputError e;
  const AttentionOutput exact = exact_attention(q, G, k, v, n, d);
  const AttentionOutput got = decode_attention(q, G, k, v, n, d, r, mu_k, bounds, &e.p_blocks);
  double num = 0.0, den = 0.0;
  for (size_t i = 0; i < exact.out.size(); ++i) {
    num += double(got.out[i] - exact.out[i]) * double(got.out[i] - exact.out[i]);
    den += double(exact.out[i]) * double(exact.out[i]);
  }
  e.relative_error = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
  for (int h = 0; h < G; ++h) e.max_lse_error = std::max(e.max_lse_error, double(std::fabs(got.lse[h] - exact.lse[h])));
  return e;
}

}  // namespace fp4kv::ref
