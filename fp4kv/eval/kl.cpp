#include "fp4kv/eval/kl.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "fp4kv/core/error.h"

namespace fp4kv::eval {

namespace {
// log-softmax of one row, in double.
void log_softmax(const float* x, int n, std::vector<double>& out) {
  double m = -std::numeric_limits<double>::infinity();
  for (int i = 0; i < n; ++i) m = std::max(m, double(x[i]));
  double s = 0;
  for (int i = 0; i < n; ++i) s += std::exp(double(x[i]) - m);
  const double lse = m + std::log(s);
  out.resize(n);
  for (int i = 0; i < n; ++i) out[i] = double(x[i]) - lse;
}
}  // namespace

KlStats teacher_forced_kl(const std::vector<float>& ref_logits, const std::vector<float>& logits, int L, int vocab,
                          int skip, int topk) {
  require(ref_logits.size() == size_t(L) * vocab && logits.size() == ref_logits.size(),
          "teacher_forced_kl: logits sizes do not match");
  topk = std::min(topk, vocab);
  KlStats st;
  std::vector<double> lp, lq;
  std::vector<int> idx(vocab);
  double kl_sum = 0;
  long mismatch = 0;
  for (int t = skip; t < L; ++t) {
    const float* a = &ref_logits[size_t(t) * vocab];
    const float* b = &logits[size_t(t) * vocab];
    log_softmax(a, vocab, lp);
    log_softmax(b, vocab, lq);
    std::iota(idx.begin(), idx.end(), 0);
    std::partial_sort(idx.begin(), idx.begin() + topk, idx.end(), [&](int i, int j) { return lp[i] > lp[j]; });
    double d = 0;
    for (int r = 0; r < topk; ++r) d += std::exp(lp[idx[r]]) * (lp[idx[r]] - lq[idx[r]]);
    kl_sum += d;
    mismatch += int(std::max_element(a, a + vocab) - a) != int(std::max_element(b, b + vocab) - b);
    ++st.steps;
  }
  if (st.steps > 0) {
    st.kl = kl_sum / double(st.steps);
    st.top1_mismatch = double(mismatch) / double(st.steps);
  }
  return st;
}

double paired_t(const std::vector<double>& a, const std::vector<double>& b) {
  require(a.size() == b.size() && !a.empty(), "paired_t: need matched, non-empty samples");
  const size_t n = a.size();
  double mean = 0;
  for (size_t i = 0; i < n; ++i) mean += a[i] - b[i];
  mean /= double(n);
  double var = 0;
  for (size_t i = 0; i < n; ++i) var += (a[i] - b[i] - mean) * (a[i] - b[i] - mean);
  if (n < 2) return NAN;  // one window: no spread, no statistic
  if (mean == 0.0) return 0.0;
  if (var == 0.0) return mean > 0 ? INFINITY : -INFINITY;
  var /= double(n - 1);
  return mean / std::sqrt(var / double(n));
}

}  // namespace fp4kv::eval
