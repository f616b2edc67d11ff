// The Qwen3-MoE block's kernels (ops/moe.h) against their CPU twins on random inputs: the
// routing bit for bit (every expert count up to 256, top_k up to 16, ties, a bad logit), the
// expert products within bounds derived below, grouped so experts receive 1 to many pairs.
//
// Tolerances. A product of BF16 numbers is exact in FP32, so the kernel's FP32 sum of n of
// them is within n 2^-24 S of the exact sum (S = sum |terms|, any order), and both sides then
// round to BF16: a gate or up value differs from the twin's by at most one BF16 ulp plus twice
// that sum error (dg below). act = bf16(bf16(silu(g)) u): silu' is at most 1.1 in magnitude,
// each side's rounding of silu and of the product adds at most one ulp of difference:
//   |d act| <= (1.1 dg + ulp(silu)) |u| + |silu| du + (1.1 dg + ulp(silu)) du + ulp(act).
// The combine folds bf16(bf16(y_j) w_j) over the experts: each y_j differs by dy_j (as dg),
// each term by w_j dy_j + ulp(term), each partial sum's rounding by one more ulp of it.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "fp4kv/ops/common.h"
#include "fp4kv/ops/moe.h"
#include "fp4kv/ops/reference.h"
#include "ops_test_util.h"

namespace fp4kv::ops::test {
namespace {

constexpr double kFp32Unit = 5.9604644775390625e-08;  // 2^-24

double sum_error(int n, double abs_sum) { return double(n) * kFp32Unit * abs_sum; }

struct RouteCase {
  int rows, experts, top_k;
};

TEST(MoeGpu, RouteMatchesTwinBitForBit) {
  SKIP_WITHOUT_GPU();
  uint32_t seed = 1;
  for (const RouteCase c : {RouteCase{1, 8, 2}, RouteCase{3, 40, 5}, RouteCase{8, 128, 8}, RouteCase{64, 128, 8},
                            RouteCase{5, 256, 16}, RouteCase{17, 64, 1}, RouteCase{2, 16, 16}}) {
    for (const bool normalize : {false, true}) {
      auto logits = random_bf16(size_t(c.rows) * c.experts, 0.0f, 3.0f, seed++);
      if (c.rows > 2) {  // a row of equal logits: ties go to the lower expert index
        for (int e = 0; e < c.experts; ++e) logits[size_t(c.experts) + e] = float_to_bf16_bits(0.5f);
      }
      const MoeRouteReference want = ref_moe_route(logits, c.rows, c.experts, c.top_k, normalize);
      DeviceBuffer<uint16_t> d_logits(logits);
      DeviceBuffer<int32_t> d_experts(size_t(c.rows) * c.top_k), flags(1);
      DeviceBuffer<float> d_weights(size_t(c.rows) * c.top_k);
      moe_route({as_bf16(d_logits), d_experts.get(), d_weights.get(), c.rows, c.experts, c.top_k, normalize,
                 flags.get()},
                nullptr);
      const std::string what = "rows " + std::to_string(c.rows) + " experts " + std::to_string(c.experts) + " top_k " +
                               std::to_string(c.top_k) + (normalize ? " normalized" : "");
      EXPECT_EQ(d_experts.download(), want.experts) << what;
      EXPECT_EQ(d_weights.download(), want.weights) << what;
      EXPECT_EQ(flags.download()[0], 0) << what;
      if (c.rows > 2) {
        for (int j = 0; j < c.top_k; ++j) EXPECT_EQ(want.experts[size_t(c.top_k) + j], j) << what;
      }
    }
  }
}

TEST(MoeGpu, RouteFlagsANonFiniteLogit) {
  SKIP_WITHOUT_GPU();
  auto logits = random_bf16(3 * 16, 0.0f, 1.0f, 5);
  logits[16 + 7] = 0x7FC0;  // NaN in row 1
  const MoeRouteReference want = ref_moe_route(logits, 3, 16, 4, true);
  DeviceBuffer<uint16_t> d_logits(logits);
  DeviceBuffer<int32_t> d_experts(12), flags(1);
  DeviceBuffer<float> d_weights(12);
  moe_route({as_bf16(d_logits), d_experts.get(), d_weights.get(), 3, 16, 4, true, flags.get()}, nullptr);
  EXPECT_EQ(flags.download()[0], kErrorRouterLogit);
  EXPECT_EQ(want.error_flags, kErrorRouterLogit);
  EXPECT_EQ(d_experts.download(), want.experts);
  EXPECT_EQ(d_weights.download(), want.weights);
  const std::vector<float> w = d_weights.download();
  for (int j = 0; j < 4; ++j) EXPECT_EQ(w[4 + size_t(j)], 0.0f);
}

TEST(MoeGpu, RejectsBadArguments) {
  MoeRouteArgs r;
  r.rows = 1, r.num_experts = 300, r.top_k = 2;
  EXPECT_THROW(moe_route(r, nullptr), Error);
  r.num_experts = 8, r.top_k = 9;
  EXPECT_THROW(moe_route(r, nullptr), Error);
  MoeExpertsArgs e;
  e.rows = 1, e.top_k = 2, e.num_experts = 8, e.hidden = 12, e.intermediate = 16;  // hidden not a multiple of 8
  EXPECT_THROW(moe_experts(e, MoeWorkspace{}, nullptr), Error);
  MoeCombineArgs c;
  c.rows = 1, c.top_k = 17, c.num_experts = 32, c.hidden = 16, c.intermediate = 16;
  EXPECT_THROW(moe_combine(c, MoeWorkspace{}, nullptr), Error);
}

struct BlockCase {
  int rows, experts, top_k, hidden, intermediate;
};

// act and out of the expert kernels on the GPU: the c.rows rows of x routed as `route`, with
// only the `held` experts' weights (a tensor-parallel rank's).
struct BlockOutput {
  std::vector<uint16_t> act, out;
};
BlockOutput run_block(const BlockCase& c, const MoeRouteReference& route, const std::vector<uint16_t>& x,
                      const DeviceBuffer<uint16_t>& d_gate_up, const DeviceBuffer<uint16_t>& d_down,
                      ExpertRange held = {}) {
  const int first = held.first, count = held.count == 0 ? c.experts : held.count;
  DeviceBuffer<uint16_t> d_x(x);
  DeviceBuffer<int32_t> d_experts(route.experts);
  DeviceBuffer<float> d_weights(route.weights);
  DeviceBuffer<uint16_t> d_act(size_t(c.rows) * c.top_k * c.intermediate), d_out(size_t(c.rows) * c.hidden);
  DeviceBuffer<uint8_t> scratch(moe_workspace_bytes(c.rows, c.top_k, c.hidden, count));
  const MoeWorkspace ws = moe_workspace(scratch.get(), c.rows, c.top_k, count);
  const __nv_bfloat16* held_gate_up = as_bf16(d_gate_up) + size_t(first) * 2 * c.intermediate * c.hidden;
  const __nv_bfloat16* held_down = as_bf16(d_down) + size_t(first) * c.hidden * c.intermediate;
  moe_experts({as_bf16(d_x), held_gate_up, d_experts.get(), as_bf16(d_act), c.rows, c.top_k, count, c.hidden,
               c.intermediate, first},
              ws, nullptr);
  moe_combine({as_bf16(d_act), held_down, d_experts.get(), d_weights.get(), as_bf16(d_out), c.rows, c.top_k, count,
               c.hidden, c.intermediate, first},
              ws, nullptr);
  return {d_act.download(), d_out.download()};
}

// Routes random logits with the twin (the route test covers the kernel), then runs the expert
// kernels and checks act and out against the twins within the bounds of the file comment.
// With a `held` range the kernels get only those experts' weights (a tensor-parallel rank's).
void check_block(const BlockCase& c, uint32_t seed, ExpertRange held = {}) {
  const std::string what = "rows " + std::to_string(c.rows) + " experts " + std::to_string(c.experts) + " top_k " +
                           std::to_string(c.top_k) + " hidden " + std::to_string(c.hidden) + " intermediate " +
                           std::to_string(c.intermediate) + " held from " + std::to_string(held.first) + " count " +
                           std::to_string(held.count);
  const int first = held.first, count = held.count == 0 ? c.experts : held.count;
  const auto logits = random_bf16(size_t(c.rows) * c.experts, 0.0f, 2.0f, seed);
  const MoeRouteReference route = ref_moe_route(logits, c.rows, c.experts, c.top_k, true);
  const auto x = random_bf16(size_t(c.rows) * c.hidden, 0.0f, 1.0f, seed + 1);
  const auto gate_up = random_bf16(size_t(c.experts) * 2 * c.intermediate * c.hidden, 0.0f,
                                   1.0f / std::sqrt(float(c.hidden)), seed + 2);
  const auto down = random_bf16(size_t(c.experts) * c.hidden * c.intermediate, 0.0f,
                                1.0f / std::sqrt(float(c.intermediate)), seed + 3);
  const DeviceBuffer<uint16_t> d_gate_up(gate_up), d_down(down);
  const auto [act, out] = run_block(c, route, x, d_gate_up, d_down, held);

  const size_t expert_elements = size_t(2) * c.intermediate * c.hidden;  // of gate_up; down has half
  const std::vector<uint16_t> held_gate_up_bits(gate_up.begin() + long(first * expert_elements),
                                                gate_up.begin() + long((first + count) * expert_elements));
  const std::vector<uint16_t> held_down_bits(down.begin() + long(first * expert_elements / 2),
                                             down.begin() + long((first + count) * expert_elements / 2));
  const MoeExpertsReference er =
      ref_moe_experts(x, held_gate_up_bits, route.experts, c.rows, c.top_k, c.hidden, c.intermediate, held);
  for (size_t i = 0; i < act.size(); ++i) {
    if (!held.holds(route.experts[i / size_t(c.intermediate)])) continue;  // another rank's pair: not written
    const double g = er.gate[i], u = er.up[i];
    const double dg = bf16_ulp(float(std::fabs(g))) + 2 * sum_error(c.hidden, er.gate_abs[i]);
    const double du = bf16_ulp(float(std::fabs(u))) + 2 * sum_error(c.hidden, er.up_abs[i]);
    const double s = std::fabs(g) / (1.0 + std::exp(-g));  // |silu(g)| (g < 0: |g| sigmoid(g))
    const double ds = 1.1 * dg + bf16_ulp(float(s + 1.1 * dg));
    const double want = bf16_bits_to_float(er.act[i]);
    const double tol = ds * std::fabs(u) + s * du + ds * du + bf16_ulp(float(std::fabs(want)) + 1e-30f) +
                       bf16_ulp(float((s + ds) * (std::fabs(u) + du)));
    ASSERT_LE(std::fabs(bf16_bits_to_float(act[i]) - want), tol) << what << ": act " << i;
  }
  // The combine from the kernel's own act: its bound covers the down products and the fold.
  const MoeCombineReference cr =
      ref_moe_combine(act, held_down_bits, route.experts, route.weights, c.rows, c.top_k, c.hidden, c.intermediate,
                      held);
  for (int r = 0; r < c.rows; ++r) {
    for (int h = 0; h < c.hidden; ++h) {
      double tol = 0, running = 0;
      for (int j = 0; j < c.top_k; ++j) {
        if (!held.holds(route.experts[size_t(r) * c.top_k + j])) continue;
        const size_t k = (size_t(r) * c.top_k + j) * c.hidden + h;
        const double w = route.weights[size_t(r) * c.top_k + j];
        const double dy = bf16_ulp(float(std::fabs(cr.y[k]))) + 2 * sum_error(c.intermediate, cr.y_abs[k]);
        const double term = w * (std::fabs(cr.y[k]) + dy);
        running += term;
        tol += w * dy + bf16_ulp(float(term) + 1e-30f) + bf16_ulp(float(running) + 1e-30f);
      }
      const size_t o = size_t(r) * c.hidden + h;
      ASSERT_LE(std::fabs(bf16_bits_to_float(out[o]) - bf16_bits_to_float(cr.out[o])), tol) << what << ": out " << o;
    }
  }
}

TEST(MoeGpu, ExpertsAndCombineMatchTwins) {
  SKIP_WITHOUT_GPU();
  uint32_t seed = 100;
  for (const BlockCase c : {BlockCase{1, 8, 2, 64, 48}, BlockCase{1, 128, 8, 256, 96}, BlockCase{5, 16, 4, 64, 48},
                            BlockCase{33, 16, 4, 128, 64}, BlockCase{64, 32, 8, 64, 32}, BlockCase{2, 16, 8, 1024, 256},
                            BlockCase{3, 4, 4, 8, 8}, BlockCase{1, 16, 8, 2048, 768}}) {
    check_block(c, seed);
    seed += 10;
  }
}

// One row takes the latency form of the kernels, several rows the throughput form (moe.cu):
// a row's act and out must be the same bits alone and inside a batch, whichever pairs share
// its experts there.
TEST(MoeGpu, OneRowMatchesTheSameRowInABatch) {
  SKIP_WITHOUT_GPU();
  const BlockCase c{6, 8, 4, 1024, 256};  // 6 rows x 4 of 8 experts: the experts are shared
  const auto logits = random_bf16(size_t(c.rows) * c.experts, 0.0f, 2.0f, 900);
  const auto x = random_bf16(size_t(c.rows) * c.hidden, 0.0f, 1.0f, 901);
  const DeviceBuffer<uint16_t> d_gate_up(random_bf16(size_t(c.experts) * 2 * c.intermediate * c.hidden, 0.0f,
                                                     1.0f / std::sqrt(float(c.hidden)), 902));
  const DeviceBuffer<uint16_t> d_down(random_bf16(size_t(c.experts) * c.hidden * c.intermediate, 0.0f,
                                                  1.0f / std::sqrt(float(c.intermediate)), 903));
  const BlockOutput batch = run_block(c, ref_moe_route(logits, c.rows, c.experts, c.top_k, true), x, d_gate_up, d_down);
  BlockCase one = c;
  one.rows = 1;  // the batch's first row
  const std::vector<uint16_t> x0(x.begin(), x.begin() + c.hidden);
  const BlockOutput alone = run_block(one, ref_moe_route(logits, 1, c.experts, c.top_k, true), x0, d_gate_up, d_down);
  for (size_t i = 0; i < alone.act.size(); ++i) ASSERT_EQ(alone.act[i], batch.act[i]) << "act " << i;
  for (size_t i = 0; i < alone.out.size(); ++i) ASSERT_EQ(alone.out[i], batch.out[i]) << "out " << i;
}

// A tensor-parallel rank's experts: pairs of other experts are skipped, out sums only its own
// (rows whose chosen experts all live elsewhere come out zero).
TEST(MoeGpu, HeldExpertRangeMatchesTwin) {
  SKIP_WITHOUT_GPU();
  uint32_t seed = 500;
  for (const BlockCase c : {BlockCase{1, 8, 2, 64, 48}, BlockCase{5, 16, 4, 64, 48}, BlockCase{64, 32, 8, 64, 32},
                            BlockCase{9, 128, 8, 256, 96}}) {
    for (const int ranks : {2, 4}) {
      for (int r = 0; r < ranks; ++r) check_block(c, seed++, ExpertRange{r * c.experts / ranks, c.experts / ranks});
    }
  }
}

}  // namespace
}  // namespace fp4kv::ops::test
