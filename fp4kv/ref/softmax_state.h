// The online-softmax state of one split of attention for one query row, and the
// log-sum-exp merge of several splits: the CPU form shared by the reference decoder
// (ref/attention.cpp) and the whole-window evaluator (eval/window_attention.cpp).
//
// Invariants, all in base 2 (logits already multiplied by log2(e) / sqrt(d)):
// - m is the running maximum of the logits the split has seen (-inf while empty);
// - l = sum_i exp2(s_i - m + log2c) and o = sum_i exp2(s_i - m + log2c) * v_i, where
//   log2c is the log2 of the P scaling factor c folded into the exponent (0 when none),
//   so the split's base-2 LSE is m + log2(l) - log2c;
// - a split with l == 0 attended to nothing: its LSE is -inf and the merge skips it.
// The merge works in double with one common maximum over all splits; it needs at least
// one non-empty split (all empty: NaN output, LSE -inf).
#pragma once

#include <algorithm>
#include <cmath>
#include <limits>
#include <span>
#include <vector>

namespace fp4kv::ref {

inline constexpr double kLn2 = 0.69314718055994531;    // ln 2: base-2 LSE -> natural log
inline constexpr double kLog2e = 1.4426950408889634;   // log2 e: natural logits -> base 2

// One split's running state. T is the accumulator type of o (double in the reference,
// float where BLAS products fill it).
template <class T>
struct SoftmaxPartial {
  float m = -std::numeric_limits<float>::infinity();
  double l = 0.0;
  float log2c = 0.0f;
  std::vector<T> o;  // unnormalized, [d]

  bool empty() const { return !(l > 0.0); }

  // Base-2 log-sum-exp of the split's logits (c divided out); -inf when empty.
  double lse2() const { return empty() ? -INFINITY : double(m) + std::log2(l) - log2c; }

  // Moves the running maximum up to cover a tile whose maximum logit is tile_max and
  // returns the factor alpha = exp2(m_old - m_new) that l and o must be multiplied by
  // (0 when the split was empty, so stale values vanish).
  double raise_max(float tile_max) {
    const float m_new = std::max(m, tile_max);
    const double alpha = m == -std::numeric_limits<float>::infinity() ? 0.0 : std::exp2(double(m) - double(m_new));
    m = m_new;
    return alpha;
  }
};

// The merged attention of one query row.
struct MergedSoftmax {
  std::vector<double> o;  // normalized output, [d]
  double lse2 = -INFINITY;  // base-2 log-sum-exp over every split's logits
  // The natural-log LSE; `shift` is added in nats (a logit offset the splits left out).
  float lse(double shift = 0.0) const { return float(lse2 * kLn2 + shift); }
};

// Log-sum-exp merge: each non-empty split s is weighted by w_s = exp2(lse2_s - big) / l_s,
// big the largest split LSE, and the sum is divided by sum_s exp2(lse2_s - big).
template <class T>
MergedSoftmax merge(std::span<const SoftmaxPartial<T>* const> parts, int d) {
  double big = -INFINITY;
  for (const SoftmaxPartial<T>* p : parts) big = std::max(big, p->lse2());
  MergedSoftmax r;
  r.o.assign(size_t(d), 0.0);
  double wsum = 0.0;
  for (const SoftmaxPartial<T>* p : parts) {
    if (p->empty()) continue;
    const double w = std::exp2(p->lse2() - big);
    wsum += w;
    for (int c = 0; c < d; ++c) r.o[size_t(c)] += w * double(p->o[size_t(c)]) / p->l;
  }
  for (int c = 0; c < d; ++c) r.o[size_t(c)] /= wsum;
  r.lse2 = big + std::log2(wsum);
  return r;
}

// Ground-truth softmax average in double: out[c] = sum_i softmax(s)_i v[i * stride + c] for
// c < d, natural-log logits s [n] (n >= 1); returns the natural LSE.
inline double exact_softmax_average(const std::vector<double>& s, const float* v, size_t stride, int d, float* out) {
  double m = -INFINITY;
  for (double x : s) m = std::max(m, x);
  double l = 0.0;
  std::vector<double> o(size_t(d), 0.0);
  for (size_t i = 0; i < s.size(); ++i) {
    const double p = std::exp(s[i] - m);
    l += p;
    for (int c = 0; c < d; ++c) o[size_t(c)] += p * double(v[i * stride + size_t(c)]);
  }
  for (int c = 0; c < d; ++c) out[c] = float(o[size_t(c)] / l);
  return m + std::log(l);
}

// The two-split form (quantized pages + BF16 tokens).
template <class T>
MergedSoftmax merge(const SoftmaxPartial<T>& a, const SoftmaxPartial<T>& b, int d) {
  const SoftmaxPartial<T>* both[] = {&a, &b};
  return merge<T>(std::span<const SoftmaxPartial<T>* const>(both), d);
}

}  // namespace fp4kv::ref
