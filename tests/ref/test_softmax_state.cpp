// The online-softmax state and its log-sum-exp merge (ref/softmax_state.h) against a
// one-pass softmax computed here in long double.
#include <gtest/gtest.h>

#include <cmath>
#include <numbers>
#include <random>
#include <vector>

#include "fp4kv/ref/softmax_state.h"

namespace fp4kv::ref {
namespace {

constexpr int kKeys = 64, kDim = 8;

struct Problem {
  std::vector<float> s;  // base-2 logits [kKeys]
  std::vector<float> v;  // values [kKeys][kDim]
};

Problem make_problem(unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> logit(-16.0f, 16.0f), value(-1.0f, 1.0f);
  Problem p{std::vector<float>(kKeys), std::vector<float>(size_t(kKeys) * kDim)};
  for (auto& x : p.s) x = logit(rng);
  for (auto& x : p.v) x = value(rng);
  return p;
}

// The partial of keys [b, e) built directly from the invariants: p_i = exp2(s_i - m + log2c).
SoftmaxPartial<double> partial_of(const Problem& pr, int b, int e, float log2c) {
  SoftmaxPartial<double> st;
  st.log2c = log2c;
  st.o.assign(kDim, 0.0);
  for (int i = b; i < e; ++i) st.m = std::max(st.m, pr.s[i]);
  for (int i = b; i < e; ++i) {
    const double p = std::exp2(double(pr.s[i]) - double(st.m) + double(log2c));
    st.l += p;
    for (int c = 0; c < kDim; ++c) st.o[c] += p * pr.v[size_t(i) * kDim + c];
  }
  return st;
}

struct OnePass {
  std::vector<long double> out;
  long double lse2;
};

OnePass one_pass(const Problem& pr) {
  long double m = pr.s[0];
  for (float x : pr.s) m = std::max(m, (long double)x);
  long double l = 0;
  std::vector<long double> o(kDim, 0);
  for (int i = 0; i < kKeys; ++i) {
    const long double p = std::exp2(pr.s[i] - m);
    l += p;
    for (int c = 0; c < kDim; ++c) o[c] += p * pr.v[size_t(i) * kDim + c];
  }
  for (auto& x : o) x /= l;
  return {o, m + std::log2(l)};
}

TEST(SoftmaxState, ConstantsAreLn2AndLog2e) {
  EXPECT_DOUBLE_EQ(kLn2, std::numbers::ln2);
  EXPECT_DOUBLE_EQ(kLog2e, std::numbers::log2e);
}

TEST(SoftmaxState, RaiseMaxRescalesByTheMaxDifference) {
  SoftmaxPartial<double> st;
  EXPECT_EQ(st.raise_max(2.0f), 0.0);  // empty: nothing to keep
  EXPECT_EQ(st.m, 2.0f);
  EXPECT_EQ(st.raise_max(5.0f), 0.125);  // exp2(2 - 5)
  EXPECT_EQ(st.m, 5.0f);
  EXPECT_EQ(st.raise_max(1.0f), 1.0);  // a lower tile keeps the maximum
  EXPECT_EQ(st.m, 5.0f);
}

// Error bound: each weight passes through < 2 * kKeys double additions and exp2/log2 of
// arguments below 40, so its relative error is below ~200 double epsilons (4.4e-14); the
// output is a convex combination of |v| <= 1, so it is off by at most about twice that.
// 1e-12 leaves margin; a merge that forgot the folded factor c (8x) or a 1/l would be off
// by far more than 1e-2.
constexpr double kMergeTolerance = 1e-12;

TEST(SoftmaxState, MergingTwoPartsEqualsTheOnePassSoftmax) {
  for (unsigned seed = 1; seed <= 20; ++seed) {
    const Problem pr = make_problem(seed);
    const OnePass want = one_pass(pr);
    for (int split : {1, 7, kKeys / 2, kKeys - 1}) {
      // The first part has the P factor c = 8 folded into its exponents, as the quantized
      // split has; the merge must divide it out.
      const auto a = partial_of(pr, 0, split, 3.0f), b = partial_of(pr, split, kKeys, 0.0f);
      const MergedSoftmax got = merge(a, b, kDim);
      for (int c = 0; c < kDim; ++c)
        EXPECT_NEAR(got.o[c], double(want.out[c]), kMergeTolerance) << "seed " << seed << " split " << split;
      EXPECT_NEAR(got.lse2, double(want.lse2), kMergeTolerance * 40) << "seed " << seed << " split " << split;
    }
  }
}

TEST(SoftmaxState, MergingManyPartsEqualsTheOnePassSoftmax) {
  const Problem pr = make_problem(99);
  const OnePass want = one_pass(pr);
  std::vector<SoftmaxPartial<double>> parts;
  for (int b = 0; b < kKeys; b += 10) parts.push_back(partial_of(pr, b, std::min(kKeys, b + 10), b % 20 ? 3.0f : 0.0f));
  std::vector<const SoftmaxPartial<double>*> ptrs;
  for (const auto& p : parts) ptrs.push_back(&p);
  const MergedSoftmax got = merge<double>(ptrs, kDim);
  for (int c = 0; c < kDim; ++c) EXPECT_NEAR(got.o[c], double(want.out[c]), kMergeTolerance);
  EXPECT_NEAR(got.lse2, double(want.lse2), kMergeTolerance * 40);
}

TEST(SoftmaxState, NaturalLseIsTheBaseTwoLseTimesLn2PlusTheShift) {
  const Problem pr = make_problem(7);
  const auto a = partial_of(pr, 0, 20, 0.0f), b = partial_of(pr, 20, kKeys, 3.0f);
  const MergedSoftmax got = merge(a, b, kDim);
  // The natural-log LSE of the natural logits s * ln 2, plus the shift.
  long double sum = 0;
  for (float x : pr.s) sum += std::exp((long double)x * std::numbers::ln2_v<long double>);
  const float want = float(std::log(sum) + 0.25L);
  EXPECT_NEAR(got.lse(0.25), want, 2 * std::abs(want) * 1.2e-7);  // float rounding of the result
}

TEST(SoftmaxState, AnEmptyPartIsTheIdentity) {
  const Problem pr = make_problem(3);
  const auto a = partial_of(pr, 0, kKeys, 3.0f);
  SoftmaxPartial<double> empty;  // l = 0: attended to nothing; stale m and o must not leak in
  empty.m = 100.0f;
  empty.o.assign(kDim, NAN);
  EXPECT_EQ(empty.lse2(), -INFINITY);
  for (const MergedSoftmax& got : {merge(a, empty, kDim), merge(empty, a, kDim)}) {
    for (int c = 0; c < kDim; ++c) EXPECT_EQ(got.o[c], a.o[c] / a.l) << c;
    EXPECT_EQ(got.lse2, double(a.m) + std::log2(a.l) - 3.0);
  }
}

}  // namespace
}  // namespace fp4kv::ref
