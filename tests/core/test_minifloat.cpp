// Exhaustive tests of the scalar codecs against first-principles definitions.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>

#include "fp4kv/core/minifloat.h"

namespace fp4kv {
namespace {

// E2M1 from the definition: 1 sign, 2 exponent (bias 1), 1 mantissa bit, subnormal at e=0.
double e2m1_first_principles(int code) {
  const int s = (code >> 3) & 1, e = (code >> 1) & 3, m = code & 1;
  const double mag = e == 0 ? m * 0.5 : (1.0 + m / 2.0) * std::ldexp(1.0, e - 1);
  return s ? -mag : mag;
}

// E4M3FN from the definition: bias 7, subnormals at e=0, S.1111.111 is NaN.
double e4m3_first_principles(int code) {
  const int s = (code >> 7) & 1, e = (code >> 3) & 15, m = code & 7;
  if (e == 15 && m == 7) return std::numeric_limits<double>::quiet_NaN();
  const double mag = e == 0 ? (m / 8.0) * std::ldexp(1.0, -6) : (1.0 + m / 8.0) * std::ldexp(1.0, e - 7);
  return s ? -mag : mag;
}

// Nearest code by brute force over all codes, ties to the even code (lsb 0): an oracle
// independent of the encoders' comparison chains.
template <typename F>
int nearest_code(double x, int n_codes, F value) {
  int best = -1;
  double best_d = 0;
  for (int c = 0; c < n_codes; ++c) {
    const double v = value(c);
    if (std::isnan(v) || std::signbit(v)) continue;
    const double d = std::fabs(std::fabs(x) - v);
    if (best < 0 || d < best_d || (d == best_d && (c & 1) == 0)) {
      best = c;
      best_d = d;
    }
  }
  return best;
}

TEST(FloorLog2, MatchesIlogbForSubnormalsAndNormals) {
  for (uint32_t u = 1; u < 0x00800000u; u = u * 3 / 2 + 1)  // subnormals, every msb position
    EXPECT_EQ(floor_log2(bits_float(u)), std::ilogb(bits_float(u))) << u;
  std::mt19937 rng(5);
  for (int i = 0; i < 100000; ++i) {
    const float x = bits_float(1u + rng() % 0x7f7fffffu);
    ASSERT_EQ(floor_log2(x), std::ilogb(x)) << x;
  }
}

TEST(E2M1, AllCodesDecodeToFirstPrinciples) {
  for (int c = 0; c < 16; ++c) {
    EXPECT_EQ(double(e2m1_value(uint8_t(c))), e2m1_first_principles(c)) << "code " << c;
    EXPECT_EQ(std::signbit(e2m1_value(uint8_t(c))), bool(c & 8)) << "code " << c;
  }
  const float grid[8] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6};
  for (int c = 0; c < 8; ++c) EXPECT_EQ(e2m1_value(uint8_t(c)), grid[c]);
}

TEST(E2M1, EncodeRoundTripsEveryCode) {
  for (int c = 0; c < 16; ++c) EXPECT_EQ(e2m1_encode(e2m1_value(uint8_t(c))), c) << "code " << c;
}

TEST(E2M1, TiesGoToTheEvenCode) {
  // The SPEC's list: 0.25 -> 0, 0.75 -> 1, 1.25 -> 1, 1.75 -> 2, 2.5 -> 2, 3.5 -> 4, 5 -> 4.
  const struct { float x, want; } ties[] = {{0.25f, 0}, {0.75f, 1}, {1.25f, 1}, {1.75f, 2}, {2.5f, 2}, {3.5f, 4}, {5.0f, 4}};
  for (const auto& t : ties) {
    EXPECT_EQ(e2m1_value(e2m1_encode(t.x)), t.want) << t.x;
    EXPECT_EQ(e2m1_value(e2m1_encode(-t.x)), -t.want) << -t.x;
  }
}

TEST(E2M1, EveryRoundingBoundaryMatchesBruteForce) {
  for (int c = 0; c < 7; ++c) {
    const float mid = 0.5f * (e2m1_value(uint8_t(c)) + e2m1_value(uint8_t(c + 1)));
    for (float x : {std::nextafter(mid, 0.0f), mid, std::nextafter(mid, 10.0f)}) {
      EXPECT_EQ(e2m1_encode(x), nearest_code(x, 8, [](int k) { return e2m1_first_principles(k); })) << x;
      EXPECT_EQ(e2m1_encode(-x), 8 | nearest_code(x, 8, [](int k) { return e2m1_first_principles(k); })) << -x;
    }
  }
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(0.0f, 7.0f);
  for (int i = 0; i < 20000; ++i) {
    const float x = u(rng);
    ASSERT_EQ(e2m1_encode(x), nearest_code(x, 8, [](int k) { return e2m1_first_principles(k); })) << x;
  }
}

TEST(E2M1, SaturatesSignedZeroAndNaN) {
  EXPECT_EQ(e2m1_encode(6.5f), 7);
  EXPECT_EQ(e2m1_encode(1e30f), 7);
  EXPECT_EQ(e2m1_encode(std::numeric_limits<float>::infinity()), 7);
  EXPECT_EQ(e2m1_encode(-std::numeric_limits<float>::infinity()), 0xF);
  EXPECT_EQ(e2m1_encode(-0.1f), 0x8);  // small negative: negative zero
  EXPECT_EQ(e2m1_encode(-0.0f), 0x8);
  EXPECT_EQ(e2m1_encode(0.0f), 0x0);
  EXPECT_EQ(e2m1_encode(std::numeric_limits<float>::quiet_NaN()), 0x0);
}

TEST(E2M1, PackingOrder) {
  EXPECT_EQ(pack_e2m1(0x1, 0x2), 0x21);  // element 2i low nibble, 2i+1 high nibble
  EXPECT_EQ(pack_e2m1(0xF, 0x0), 0x0F);
  EXPECT_EQ(unpack_e2m1(0x21, 0), 0x1);
  EXPECT_EQ(unpack_e2m1(0x21, 1), 0x2);
  for (int a = 0; a < 16; ++a)
    for (int b = 0; b < 16; ++b) {
      const uint8_t byte = pack_e2m1(uint8_t(a), uint8_t(b));
      EXPECT_EQ(unpack_e2m1(byte, 0), a);
      EXPECT_EQ(unpack_e2m1(byte, 1), b);
    }
}

TEST(E4M3, All256CodesDecodeToFirstPrinciples) {
  for (int c = 0; c < 256; ++c) {
    const double want = e4m3_first_principles(c);
    const float got = e4m3_value(uint8_t(c));
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(got)) << c;
    } else {
      EXPECT_EQ(double(got), want) << "code " << c;
      EXPECT_EQ(std::signbit(got), bool(c & 0x80)) << c;
    }
  }
  EXPECT_EQ(e4m3_value(0x7E), 448.0f);
  EXPECT_EQ(e4m3_value(0x01), std::ldexp(1.0f, -9));
  EXPECT_EQ(e4m3_value(0x08), std::ldexp(1.0f, -6));
}

TEST(E4M3, EncodeRoundTripsEveryFiniteCode) {
  for (int c = 0; c < 256; ++c) {
    if ((c & 0x7F) == 0x7F) continue;
    EXPECT_EQ(e4m3_encode(e4m3_value(uint8_t(c))), c) << c;
  }
}

TEST(E4M3, EveryRoundingBoundaryMatchesBruteForce) {
  auto oracle = [](double x) { return nearest_code(x, 127, [](int k) { return e4m3_first_principles(k); }); };
  for (int c = 0; c < 126; ++c) {
    const float lo = e4m3_value(uint8_t(c)), hi = e4m3_value(uint8_t(c + 1));
    const float mid = 0.5f * (lo + hi);  // exact: a few significant bits
    for (float x : {std::nextafter(mid, 0.0f), mid, std::nextafter(mid, 1e9f)}) {
      EXPECT_EQ(e4m3_encode(x), oracle(x)) << x;
      EXPECT_EQ(e4m3_encode(-x), 0x80 | oracle(x)) << -x;
    }
  }
  std::mt19937 rng(3);
  for (int i = 0; i < 20000; ++i) {
    const float x = std::ldexp(std::uniform_real_distribution<float>(1.0f, 2.0f)(rng),
                               std::uniform_int_distribution<int>(-12, 8)(rng));
    if (x >= 448.0f) continue;
    ASSERT_EQ(e4m3_encode(x), oracle(x)) << x;
  }
}

TEST(E4M3, SaturatesAndHandlesNaN) {
  EXPECT_EQ(e4m3_encode(448.0f), 0x7E);
  EXPECT_EQ(e4m3_encode(464.0f), 0x7E);  // would round to 480, which E4M3FN lacks
  EXPECT_EQ(e4m3_encode(1e20f), 0x7E);
  EXPECT_EQ(e4m3_encode(std::numeric_limits<float>::infinity()), 0x7E);
  EXPECT_EQ(e4m3_encode(-std::numeric_limits<float>::infinity()), 0xFE);
  EXPECT_EQ(e4m3_encode(std::numeric_limits<float>::quiet_NaN()), 0x7F);
  EXPECT_EQ(e4m3_encode(std::ldexp(1.0f, -10)), 0x00);  // half the smallest subnormal: tie to even (0)
  EXPECT_EQ(e4m3_encode(std::nextafter(std::ldexp(1.0f, -10), 1.0f)), 0x01);
  EXPECT_EQ(e4m3_encode(1e-30f), 0x00);
  EXPECT_EQ(e4m3_encode(-0.0f), 0x80);
}

TEST(E8M0, AllCodes) {
  for (int c = 0; c < 255; ++c) EXPECT_EQ(double(e8m0_value(uint8_t(c))), std::ldexp(1.0, c - 127)) << c;
  EXPECT_TRUE(std::isnan(e8m0_value(255)));
}

}  // namespace
}  // namespace fp4kv
