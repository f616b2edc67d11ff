// The cuBLASLt GEMM plan, the small-batch GEMV and a tuned plan against a double-precision
// product of the same BF16 inputs; the GEMV's SwiGLU epilogue and Gemm::run_swiglu against the
// product followed by the SwiGLU kernel, bit for bit.
// Tolerance: FP32 accumulation of k exact BF16 products in any order is off by at most
// (k - 1) 2^-24 sum|x w| (the bound of recursive summation), plus, for BF16 output, half a
// BF16 ulp of the result (2^-9 |y|).
#include <gtest/gtest.h>

#include <cmath>

#include "fp4kv/ops/gemm.h"
#include "fp4kv/ops/gemv.h"
#include "fp4kv/ops/reference.h"
#include "fp4kv/ops/swiglu.h"
#include "ops_test_util.h"

namespace fp4kv::ops::test {
namespace {

// How a test runs the product: y = x w^T into a BF16 or FP32 device array.
enum class Runner { plan, tuned_plan, gemv, gemv_plan };

void run_product(Runner how, const GemmShape& s, const DeviceBuffer<uint16_t>& dx, const DeviceBuffer<uint16_t>& dw,
                 void* y) {
  const bool f32 = s.output == GemmOutput::f32;
  if (how == Runner::gemv) {
    gemv(as_bf16(dx), as_bf16(dw), y, f32, s.m, s.n, s.k, nullptr);
    return;
  }
  Gemm gemm(s);
  if (how == Runner::tuned_plan) gemm.tune(as_bf16(dx), {as_bf16(dw)}, y, nullptr);
  if (how == Runner::gemv_plan) {
    ASSERT_TRUE(gemm.use_gemv());
  }
  if (f32)
    gemm.run(as_bf16(dx), as_bf16(dw), static_cast<float*>(y), nullptr);
  else
    gemm.run(as_bf16(dx), as_bf16(dw), static_cast<__nv_bfloat16*>(y), nullptr);
}

void check_gemm(const GemmShape& s, uint32_t seed, Runner how = Runner::plan) {
  const auto x = random_bf16(size_t(s.m) * s.k, 0.0f, 1.0f, seed);
  const auto w = random_bf16(size_t(s.n) * s.k, 0.0f, 0.05f, seed + 1);
  const GemmReference ref = ref_gemm(x, w, s.m, s.n, s.k);
  DeviceBuffer<uint16_t> dx(x), dw(w);
  std::vector<float> got(ref.y.size());
  if (s.output == GemmOutput::f32) {
    DeviceBuffer<float> dy(ref.y.size());
    run_product(how, s, dx, dw, dy.get());
    got = dy.download();
  } else {
    DeviceBuffer<uint16_t> dy(ref.y.size());
    run_product(how, s, dx, dw, dy.get());
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

// The GEMV at every row count it takes (W staged in shared memory up to 3 rows of X, in
// registers beyond), short and Qwen3-4B rows, both outputs; odd n (a partial last CTA), k of
// one 16-byte chunk per lane or less, a staged row past 48 KiB of shared memory and one too
// long to stage.
TEST(GemmGpu, GemvMatchesDoubleProduct) {
  SKIP_WITHOUT_GPU();
  EXPECT_FALSE(gemv_supports(9, 64));
  EXPECT_FALSE(gemv_supports(1, 12));
  EXPECT_TRUE(gemv_stages_weights(3, 2560));
  EXPECT_FALSE(gemv_stages_weights(4, 2560));
  EXPECT_FALSE(gemv_stages_weights(1, 49160));  // a row of 98 KiB
  EXPECT_EQ(gemv_cta_rows(1, 2560), 4);         // staged: 4 rows, halved past 40 KiB
  EXPECT_EQ(gemv_cta_rows(1, 4096), 4);
  EXPECT_EQ(gemv_cta_rows(2, 9728), 2);
  EXPECT_EQ(gemv_cta_rows(3, 30000), 1);
  EXPECT_EQ(gemv_cta_rows(4, 1280), 8);  // registers: 160 chunks, one warp a row
  EXPECT_EQ(gemv_cta_rows(4, 1288), 4);
  EXPECT_EQ(gemv_cta_rows(4, 4096), 2);
  EXPECT_EQ(gemv_cta_rows(8, 9728), 1);
  EXPECT_EQ(gemv_cta_rows(1, 1 << 20), 1);
  uint32_t seed = 101;
  for (int m = 1; m <= kGemvMaxRows; ++m) {
    for (const GemmShape s : {GemmShape{m, 13, 8, GemmOutput::bf16}, GemmShape{m, 37, 264, GemmOutput::f32},
                              GemmShape{m, 6144, 2560, GemmOutput::bf16}, GemmShape{m, 2560, 9728, GemmOutput::bf16},
                              // a last CTA of 1 row of 2 or 4; two passes of loads in registers
                              GemmShape{m, 37, 4096, GemmOutput::f32}, GemmShape{m, 5, 17000, GemmOutput::bf16},
                              // staged: 59 KiB of shared memory; too long to stage
                              GemmShape{m, 3, 30000, GemmOutput::bf16}, GemmShape{m, 3, 49160, GemmOutput::f32}}) {
      check_gemm(s, seed, Runner::gemv);
      seed += 2;
    }
  }
}

// A tuned plan (whichever of cuBLASLt's candidates or the GEMV won) stays within the bound.
TEST(GemmGpu, TunedPlanMatchesDoubleProduct) {
  SKIP_WITHOUT_GPU();
  uint32_t seed = 301;
  for (const GemmShape s : {GemmShape{1, 6144, 2560, GemmOutput::bf16}, GemmShape{8, 19456, 2560, GemmOutput::bf16},
                            GemmShape{2, 151936, 2560, GemmOutput::f32}, GemmShape{33, 2560, 4096, GemmOutput::bf16}}) {
    check_gemm(s, seed, Runner::tuned_plan);
    seed += 2;
  }
}

// A plan told to use the GEMV (GpuModel's GemmPlans::gemv) does where the GEMV applies.
TEST(GemmGpu, GemvPlanMatchesDoubleProduct) {
  SKIP_WITHOUT_GPU();
  EXPECT_FALSE(Gemm(GemmShape{9, 8, 8}).use_gemv());
  EXPECT_FALSE(Gemm(GemmShape{1, 8, 12}).use_gemv());
  check_gemm(GemmShape{1, 6144, 2560, GemmOutput::bf16}, 401, Runner::gemv_plan);
  check_gemm(GemmShape{3, 151, 512, GemmOutput::f32}, 403, Runner::gemv_plan);
}

// A GEMV plan whose staged rows need more than the default 48 KiB of shared memory (k = 30000
// at 2 rows of X: one row of 59 KiB a CTA) runs inside a captured CUDA graph: use_gemv()
// reserves that memory before the capture, which could not. The replay gives the eager bits.
TEST(GemmGpu, GemvPlanPastDefaultSharedMemoryIsCapturable) {
  SKIP_WITHOUT_GPU();
  const GemmShape s{2, 7, 30000, GemmOutput::f32};
  ASSERT_TRUE(gemv_stages_weights(s.m, s.k));
  DeviceBuffer<uint16_t> dx(random_bf16(size_t(s.m) * s.k, 0.0f, 1.0f, 701));
  DeviceBuffer<uint16_t> dw(random_bf16(size_t(s.n) * s.k, 0.0f, 0.05f, 702));
  DeviceBuffer<float> replayed(size_t(s.m) * s.n), eager(size_t(s.m) * s.n);
  Gemm gemm(s);
  ASSERT_TRUE(gemm.use_gemv());
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), cudaSuccess);
  gemm.run(as_bf16(dx), as_bf16(dw), replayed.get(), stream);
  ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
  gemm.run(as_bf16(dx), as_bf16(dw), eager.get(), stream);
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  EXPECT_EQ(replayed.download(), eager.download());
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

// The GEMV with the SwiGLU epilogue gives the bits of the GEMV's BF16 product followed by the
// SwiGLU kernel (itself bit-identical to its CPU twin, test_ops_gpu.cpp) at every row count it
// takes and every CTA shape that holds whole (gate, up) pairs: staged 4 rows (Qwen3-4B's
// gate/up, a last CTA of one pair) and 2 (k = 9728); in registers 8 rows (1 slice), 4
// (Qwen3-4B's gate/up) and 2 (4 slices). Shapes that leave one row a CTA are refused.
std::vector<uint16_t> gemv_then_swiglu(const DeviceBuffer<uint16_t>& dx, const DeviceBuffer<uint16_t>& dw, int m,
                                       int inter, int k) {
  DeviceBuffer<uint16_t> product(size_t(m) * 2 * inter), act(size_t(m) * inter);
  gemv(as_bf16(dx), as_bf16(dw), product.get(), false, m, 2 * inter, k, nullptr);
  swiglu({as_bf16(product), as_bf16(act), m, inter}, nullptr);
  return act.download();
}

TEST(GemmGpu, GemvSwigluEqualsGemvThenSwiglu) {
  SKIP_WITHOUT_GPU();
  EXPECT_TRUE(gemv_swiglu_supports(8, 5120));    // registers, 4 slices: 2 rows a CTA
  EXPECT_FALSE(gemv_swiglu_supports(4, 5128));   // registers, 8 slices: 1 row a CTA
  EXPECT_TRUE(gemv_swiglu_supports(1, 9728));    // staged: 2 rows of 19 KiB
  EXPECT_FALSE(gemv_swiglu_supports(3, 10248));  // staged: 1 row
  EXPECT_FALSE(gemv_swiglu_supports(9, 64));
  uint32_t seed = 501;
  struct Mlp {
    int inter, k;
  };
  for (int m = 1; m <= kGemvMaxRows; ++m) {
    for (const Mlp s : {Mlp{5, 8}, Mlp{37, 264}, Mlp{9728, 2560}, Mlp{3, 4096}, Mlp{21, 5120}, Mlp{7, 9728}}) {
      const auto x = random_bf16(size_t(m) * s.k, 0.0f, 1.0f, seed);
      const auto w = random_bf16(size_t(2) * s.inter * s.k, 0.0f, 0.05f, seed + 1);
      seed += 2;
      DeviceBuffer<uint16_t> dx(x), dw(w), act(size_t(m) * s.inter);
      if (!gemv_swiglu_supports(m, s.k)) {  // k = 9728 from 4 rows of X on: one row a CTA
        EXPECT_THROW(gemv_swiglu(as_bf16(dx), as_bf16(dw), as_bf16(act), m, s.inter, s.k, nullptr), Error);
        continue;
      }
      gemv_swiglu(as_bf16(dx), as_bf16(dw), as_bf16(act), m, s.inter, s.k, nullptr);
      ASSERT_EQ(act.download(), gemv_then_swiglu(dx, dw, m, s.inter, s.k))
          << "m " << m << " intermediate " << s.inter << " k " << s.k;
    }
  }
}

// Gemm::run_swiglu: the fused kernel with a GEMV plan, the product and the SwiGLU kernel with a
// cuBLASLt plan (or a GEMV plan whose k leaves one row a CTA); the same bits as run() + swiglu.
TEST(GemmGpu, RunSwigluEqualsRunThenSwiglu) {
  SKIP_WITHOUT_GPU();
  uint32_t seed = 601;
  for (const GemmShape s : {GemmShape{1, 2 * 9728, 2560}, GemmShape{3, 2 * 37, 264}, GemmShape{2, 2 * 7, 9728},
                            GemmShape{33, 2 * 96, 256}}) {
    for (const bool gemv_plan : {false, true}) {
      const auto x = random_bf16(size_t(s.m) * s.k, 0.0f, 1.0f, seed);
      const auto w = random_bf16(size_t(s.n) * s.k, 0.0f, 0.05f, seed + 1);
      seed += 2;
      Gemm gemm(s);
      if (gemv_plan && !gemm.use_gemv()) continue;  // m > 8: cuBLASLt only
      DeviceBuffer<uint16_t> dx(x), dw(w), product(size_t(s.m) * s.n), act(size_t(s.m) * s.n / 2);
      DeviceBuffer<uint16_t> want_product(size_t(s.m) * s.n), want(size_t(s.m) * s.n / 2);
      gemm.run_swiglu(as_bf16(dx), as_bf16(dw), as_bf16(product), as_bf16(act), nullptr);
      gemm.run(as_bf16(dx), as_bf16(dw), as_bf16(want_product), nullptr);
      swiglu({as_bf16(want_product), as_bf16(want), s.m, s.n / 2}, nullptr);
      ASSERT_EQ(act.download(), want.download()) << "m " << s.m << " n " << s.n << " k " << s.k << " gemv " << gemv_plan;
    }
  }
  const Gemm f32(GemmShape{1, 8, 8, GemmOutput::f32}), odd(GemmShape{1, 7, 8});
  DeviceBuffer<uint16_t> x(8), w(64), p(8), act(8);
  EXPECT_THROW(f32.run_swiglu(as_bf16(x), as_bf16(w), as_bf16(p), as_bf16(act), nullptr), Error);
  EXPECT_THROW(odd.run_swiglu(as_bf16(x), as_bf16(w), as_bf16(p), as_bf16(act), nullptr), Error);
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
