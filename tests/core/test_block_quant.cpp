// NVFP4 / MXFP4 block quantizers: the standard rule from first principles, scale search,
// clamping, all-zero blocks and non-finite input.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "fp4kv/core/block_quant.h"
#include "fp4kv/core/error.h"
#include "fp4kv/core/operand_quant.h"
#include "fp4kv/core/tensor_quant.h"

namespace fp4kv {
namespace {

std::vector<float> random_block(std::mt19937& rng, int n, bool outlier) {
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> x(n);
  for (auto& v : x) v = nd(rng);
  if (outlier) x[rng() % n] *= 20.0f;
  return x;
}

// Sum of squared errors of a candidate, written independently of the quantizer (float32,
// the same definition as SPEC section 3).
float nvfp4_candidate_error(const std::vector<float>& x, float g, uint8_t s) {
  const float sg = e4m3_value(s) * g;
  float err = 0.0f;
  for (float xi : x) {
    const float v = sg > 0 ? e2m1_value(e2m1_encode(xi / sg)) * sg : 0.0f;
    err = err + (v - xi) * (v - xi);
  }
  return err;
}

float mxfp4_candidate_error(const std::vector<float>& x, int e) {
  float err = 0.0f;
  for (float xi : x) {
    const float v = e2m1_value(e2m1_encode(xi * std::ldexp(1.0f, -e))) * std::ldexp(1.0f, e);
    err = err + (v - xi) * (v - xi);
  }
  return err;
}

TEST(Nvfp4Block, StandardRuleFromFirstPrinciples) {
  std::mt19937 rng(1);
  for (int trial = 0; trial < 2000; ++trial) {
    const auto x = random_block(rng, 16, trial % 3 == 0);
    const float g = std::ldexp(1.0f, -int(rng() % 12)) * 1.37f;
    uint8_t codes[16];
    const uint8_t s = nvfp4_quantize_block(x.data(), 1, g, false, codes);
    float amax = 0;
    for (float v : x) amax = std::max(amax, std::fabs(v));
    ASSERT_EQ(s, e4m3_encode(amax / (6.0f * g)));
    const float sg = e4m3_value(s) * g;
    for (int i = 0; i < 16; ++i) ASSERT_EQ(codes[i], sg > 0 ? e2m1_encode(x[i] / sg) : 0) << i;
  }
}

TEST(Nvfp4Block, SearchKeepsTheLowerErrorCandidate) {
  std::mt19937 rng(2);
  int switched = 0;
  for (int trial = 0; trial < 5000; ++trial) {
    const auto x = random_block(rng, 16, trial % 2 == 0);
    const float g = 0.01f;
    float amax = 0;
    for (float v : x) amax = std::max(amax, std::fabs(v));
    const uint8_t s6 = e4m3_encode(amax / (6.0f * g)), s4 = e4m3_encode(amax / (4.0f * g));
    const float e6 = nvfp4_candidate_error(x, g, s6), e4 = nvfp4_candidate_error(x, g, s4);
    uint8_t codes[16];
    const uint8_t s = nvfp4_quantize_block(x.data(), 1, g, true, codes);
    ASSERT_EQ(s, e4 < e6 ? s4 : s6) << trial;
    switched += s == s4 && s4 != s6;
  }
  EXPECT_GT(switched, 100);  // the search is not a no-op on Gaussian blocks
}

TEST(Nvfp4Block, SearchTieKeepsKappa6) {
  // {6, 0, ...} with g = 1 is exact under both kappa 6 (s = 1) and kappa 4 (s = 1.5).
  std::vector<float> x(16, 0.0f);
  x[3] = 6.0f;
  uint8_t codes[16];
  EXPECT_EQ(nvfp4_quantize_block(x.data(), 1, 1.0f, true, codes), e4m3_encode(1.0f));
  EXPECT_EQ(codes[3], 7);
}

TEST(Nvfp4Block, AllZeroAndUnderflowingBlocksAreZero) {
  std::vector<float> x(16, 0.0f);
  uint8_t codes[16];
  EXPECT_EQ(nvfp4_quantize_block(x.data(), 1, 1.0f, true, codes), 0);
  for (uint8_t c : codes) EXPECT_EQ(c & 7, 0);
  x[0] = 1e-6f;  // amax / 6 far below the smallest E4M3 subnormal
  EXPECT_EQ(nvfp4_quantize_block(x.data(), 1, 1.0f, false, codes), 0);
  EXPECT_EQ(codes[0], 0);
}

TEST(Nvfp4Block, StridedReadQuantizesChannelWise) {
  std::mt19937 rng(4);
  const auto x = random_block(rng, 16 * 5, false);
  std::vector<float> column(16);
  for (int i = 0; i < 16; ++i) column[i] = x[i * 5 + 2];
  uint8_t a[16], b[16];
  EXPECT_EQ(nvfp4_quantize_block(&x[2], 5, 0.1f, true, a), nvfp4_quantize_block(column.data(), 1, 0.1f, true, b));
  for (int i = 0; i < 16; ++i) EXPECT_EQ(a[i], b[i]);
}

TEST(Nvfp4Block, NonFiniteInputIsZeroAndCounted) {
  std::vector<float> x(16, 1.0f);
  x[2] = std::numeric_limits<float>::quiet_NaN();
  x[5] = std::numeric_limits<float>::infinity();
  x[9] = 3.0f;
  uint8_t codes[16];
  int bad = 0;
  const uint8_t s = nvfp4_quantize_block(x.data(), 1, 1.0f, true, codes, &bad);
  EXPECT_EQ(bad, 2);
  EXPECT_EQ(codes[2], 0);
  EXPECT_EQ(codes[5], 0);
  EXPECT_EQ(s, e4m3_encode(3.0f / 6.0f));  // scale from the finite values only
  EXPECT_EQ(e2m1_value(codes[9]) * e4m3_value(s), 3.0f);
}

TEST(Nvfp4GlobalScale, AmaxOver2688AndOneForZero) {
  EXPECT_EQ(nvfp4_global_scale(2688.0f), 1.0f);
  EXPECT_EQ(nvfp4_global_scale(5.0f), 5.0f / 2688.0f);
  EXPECT_EQ(nvfp4_global_scale(0.0f), 1.0f);
}

TEST(Mxfp4Block, OcpExponentAndClamping) {
  EXPECT_EQ(mxfp4_ocp_exponent(6.0f), 0);    // floor(log2 6) - 2 = 0
  EXPECT_EQ(mxfp4_ocp_exponent(8.0f), 1);
  EXPECT_EQ(mxfp4_ocp_exponent(7.99f), 0);
  EXPECT_EQ(mxfp4_ocp_exponent(0.75f), -3);
  EXPECT_EQ(mxfp4_ocp_exponent(1e-40f), -127);  // subnormal amax: clamped at the E8M0 floor
  EXPECT_EQ(mxfp4_ocp_exponent(std::ldexp(1.0f, -125)), -127);
  EXPECT_EQ(mxfp4_ocp_exponent(std::ldexp(1.0f, -124)), -126);
  EXPECT_EQ(mxfp4_ocp_exponent(3e38f), 125);  // float's largest binade; 127 is out of reach
}

TEST(Mxfp4Block, AllZeroBlockGetsCode127) {
  std::vector<float> x(32, 0.0f);
  uint8_t codes[32];
  EXPECT_EQ(mxfp4_quantize_block(x.data(), 1, true, codes), 127);
  for (uint8_t c : codes) EXPECT_EQ(c & 7, 0);
}

TEST(Mxfp4Block, StandardRuleFromFirstPrinciples) {
  std::mt19937 rng(5);
  for (int trial = 0; trial < 2000; ++trial) {
    auto x = random_block(rng, 32, trial % 2 == 0);
    for (auto& v : x) v *= std::ldexp(1.0f, int(rng() % 40) - 20);
    uint8_t codes[32];
    const uint8_t s = mxfp4_quantize_block(x.data(), 1, false, codes);
    float amax = 0;
    for (float v : x) amax = std::max(amax, std::fabs(v));
    const int e = int(std::floor(std::log2(double(amax)))) - 2;
    ASSERT_EQ(int(s), e + 127);
    for (int i = 0; i < 32; ++i) ASSERT_EQ(codes[i], e2m1_encode(std::ldexp(x[i], -e)));
  }
}

// The GPU query quantizer streams a block through mxfp4_element_code with e taken from
// mxfp4_ocp_exponent and the residual against e8m0_value(e + 127): the same scale, codes
// and residual as mxfp4_quantize_block (no search) + mxfp4_block_residual, including
// all-zero, clamped-exponent and non-finite blocks.
TEST(Mxfp4Block, ElementCodesAndResidualStreamTheBlockQuantizer) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 3000; ++trial) {
    auto x = random_block(rng, 32, trial % 2 == 0);
    const int shift = trial % 5 == 0 ? -140 + int(rng() % 20) : int(rng() % 60) - 30;
    for (auto& v : x) v = std::ldexp(v, shift);
    if (trial % 7 == 0) x.assign(32, 0.0f);
    if (trial % 11 == 0) x[rng() % 32] = std::numeric_limits<float>::quiet_NaN();
    uint8_t codes[32];
    const uint8_t s = mxfp4_quantize_block(x.data(), 1, false, codes);
    const int e = mxfp4_ocp_exponent(finite_amax(x.data(), 32, 1));
    ASSERT_EQ(int(s), e + kE8M0Bias);
    float residual[32];
    mxfp4_block_residual(x.data(), codes, s, residual);
    const float inv = pow2f(-e), sc = e8m0_value(uint8_t(e + kE8M0Bias));
    for (int i = 0; i < 32; ++i) {
      const uint8_t c = mxfp4_element_code(x[i], inv);
      ASSERT_EQ(c, codes[i]) << "trial " << trial << " element " << i;
      const float r = sub_rn(x[i], mul_rn(e2m1_value(c), sc));
      ASSERT_TRUE(std::memcmp(&r, &residual[i], 4) == 0) << "trial " << trial << " element " << i;
    }
  }
}

TEST(Mxfp4Block, SearchNeverWorseThanEitherFixedRule) {
  std::mt19937 rng(6);
  int switched = 0;
  for (int trial = 0; trial < 5000; ++trial) {
    const auto x = random_block(rng, 32, trial % 2 == 0);
    uint8_t codes[32];
    const int e = int(mxfp4_quantize_block(x.data(), 1, true, codes)) - 127;
    float amax = 0;
    for (float v : x) amax = std::max(amax, std::fabs(v));
    const int e_ocp = int(std::floor(std::log2(double(amax)))) - 2;
    ASSERT_TRUE(e == e_ocp || e == e_ocp + 1);
    const float chosen = mxfp4_candidate_error(x, e);
    ASSERT_LE(chosen, mxfp4_candidate_error(x, e_ocp));
    ASSERT_LE(chosen, mxfp4_candidate_error(x, e_ocp + 1));
    if (e == e_ocp + 1) {
      ASSERT_LT(chosen, mxfp4_candidate_error(x, e_ocp));  // ties keep e_ocp
      ++switched;
    }
    for (int i = 0; i < 32; ++i) ASSERT_EQ(codes[i], e2m1_encode(std::ldexp(x[i], -e)));
  }
  EXPECT_GT(switched, 100);
}

TEST(Fp8Slice, ScaleAndRoundTrip) {
  EXPECT_EQ(fp8_slice_scale(448.0f), 1.0f);
  EXPECT_EQ(fp8_slice_scale(0.0f), 1.0f);
  const float s = fp8_slice_scale(10.0f);
  EXPECT_EQ(fp8_value(fp8_encode(10.0f, s), s), 10.0f / 448.0f * 448.0f);
  EXPECT_EQ(fp8_encode(std::numeric_limits<float>::quiet_NaN(), s), 0);
}

TEST(TensorQuant, SerializeParseRoundTripAndLayout) {
  std::mt19937 rng(8);
  const auto x = random_block(rng, 64, true);
  for (KvFormat f : {KvFormat::nvfp4, KvFormat::mxfp4}) {
    const QuantizedTensor t = quantize_tensor(x.data(), x.size(), f, true);
    const auto bytes = t.serialize();
    ASSERT_EQ(bytes.size(), 32 + 64 / t.block() + (f == KvFormat::nvfp4 ? 4 : 0));
    const QuantizedTensor u = QuantizedTensor::parse(bytes, f, x.size());
    EXPECT_EQ(u.codes, t.codes);
    EXPECT_EQ(u.scales, t.scales);
    EXPECT_EQ(u.g, t.g);
    // Byte i holds elements 2i (low) and 2i+1 (high) of the block quantizer's codes.
    uint8_t codes[32];
    if (f == KvFormat::nvfp4) nvfp4_quantize_block(x.data(), 1, t.g, true, codes);
    else mxfp4_quantize_block(x.data(), 1, true, codes);
    EXPECT_EQ(t.codes[0], pack_e2m1(codes[0], codes[1]));
    EXPECT_EQ(t.codes[5], pack_e2m1(codes[10], codes[11]));
  }
}

TEST(TensorQuant, BadInputIsAClearError) {
  std::vector<float> x(20, 1.0f);
  EXPECT_THROW(quantize_tensor(x.data(), 20, KvFormat::nvfp4, false), Error);
  EXPECT_THROW(quantize_tensor(x.data(), 0, KvFormat::nvfp4, false), Error);
  EXPECT_THROW(quantize_tensor(x.data(), 16, KvFormat::nvfp4, false, 0.0f), Error);
  EXPECT_THROW(quantize_tensor(x.data(), 16, KvFormat::nvfp4, false, std::numeric_limits<float>::infinity()), Error);
  EXPECT_THROW(quantize_tensor(x.data(), 16, KvFormat::mxfp4, false), Error);  // 16 is not a multiple of 32
  try {
    quantize_tensor(x.data(), 20, KvFormat::nvfp4, false);
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("not a multiple"), std::string::npos);
  }
}

}  // namespace
}  // namespace fp4kv
