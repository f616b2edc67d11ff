// The cuBLASLt GEMM plan against a double-precision product of the same BF16 inputs.
// Tolerance: FP32 accumulation of k exact BF16 products in any order is off by at most
// (k - 1) 2^-24 sum|x w| (the bound of recursive summation), plus, for BF16 output, half a
// BF16 ulp of the result (2^-9 |y|).
#include <gtest/gtest.h>

#include <cmath>

#include "fp4kv/ops/gemm.h"
#include "fp4kv/ops/reference.h"
#include "ops_test_util.h"

namespace fp4kv::ops::test {
namespace {

void check_gemm(const GemmShape& s, uint32_t seed) {
  const auto x = random_bf16(size_t(s.m) * s.k, 0.0f, 1.0f, seed);
  const auto w = random_bf16(size_t(s.n) * s.k, 0.0f, 0.05f, seed + 1);
  const GemmReference ref = ref_gemm(x, w, s.m, s.n, s.k);
  DeviceBuffer<uint16_t> dx(x), dw(w);
  const Gemm gemm(s);
  std::vector<float> got(ref.y.size());
  if (s.output == GemmOutput::f32) {
    DeviceBuffer<float> dy(ref.y.size());
    gemm.run(as_bf16(dx), as_bf16(dw), dy.get(), nullptr);
    got = dy.download();
  } else {
    DeviceBuffer<uint16_t> dy(ref.y.size());
    gemm.run(as_bf16(dx), as_bf16(dw), as_bf16(dy), nullptr);
    const auto bits = dy.download();
    for (size_t i = 0; i < bits.size(); ++i) got[i] = bf16_bits_to_float(bits[i]);
  }
  const double u = std::ldexp(1.0, -24);
  for (size_t i = 0; i < got.size(); ++i) {
    double tol = double(s.k) * u * ref.abs_sum[i] + 1e-30;
    if (s.output == GemmOutput::bf16) tol += std::ldexp(std::fabs(ref.y[i]), -8);
    ASSERT_LE(std::fabs(got[i] - ref.y[i]), tol) << "m " << s.m << " n " << s.n << " k " << s.k << " at " << i;
  }
}

TEST(GemmGpu, MatchesDoubleProductOverShapes) {
  SKIP_WITHOUT_GPU();
  uint32_t seed = 1;
  for (const GemmShape s : {GemmShape{1, 8, 8, GemmOutput::bf16}, GemmShape{3, 24, 40, GemmOutput::bf16},
                            GemmShape{1, 6144, 2560, GemmOutput::bf16},   // Qwen3-4B QKV, one token
                            GemmShape{16, 19456, 2560, GemmOutput::bf16},  // gate_up
                            GemmShape{5, 2560, 9728, GemmOutput::bf16},    // down
                            GemmShape{7, 40, 24, GemmOutput::f32}}) {
    check_gemm(s, seed);
    seed += 2;
  }
}

TEST(GemmGpu, LmHeadWithQwen3VocabInFp32) {
  SKIP_WITHOUT_GPU();
  check_gemm(GemmShape{2, 151936, 2560, GemmOutput::f32}, 77);
}

TEST(GemmGpu, RejectsBadShapesAndMismatchedOutput) {
  EXPECT_THROW(Gemm(GemmShape{0, 8, 8}), Error);
  SKIP_WITHOUT_GPU();
  const Gemm g(GemmShape{2, 8, 8, GemmOutput::bf16});
  DeviceBuffer<uint16_t> x(16), w(64);
  DeviceBuffer<float> y(16);
  EXPECT_THROW(g.run(as_bf16(x), as_bf16(w), y.get(), nullptr), Error);
  EXPECT_THROW(g.run(as_bf16(x) + 1, as_bf16(w), as_bf16(x), nullptr), Error);  // misaligned
}

}  // namespace
}  // namespace fp4kv::ops::test
