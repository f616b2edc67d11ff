// The layout packer: a bijection between logical pages and cache bytes.
#include <gtest/gtest.h>

#include <random>
#include <set>

#include "fp4kv/cache/host_page.h"
#include "fp4kv/core/half.h"
#include "fp4kv/core/minifloat.h"

namespace fp4kv::cache {
namespace {

std::vector<float> randn(size_t n, unsigned seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, scale);
  std::vector<float> x(n);
  for (auto& v : x) v = nd(rng);
  return x;
}

TEST(Layout, AddressingIsABijection) {
  for (int d : {64, 128, 256})
    for (KvFormat f : {KvFormat::nvfp4, KvFormat::mxfp4}) {
      const PageLayout l = PageLayout::make(f, d);
      std::set<int> k, v, ks, vs;
      for (int t = 0; t < kPage; ++t)
        for (int c = 0; c < d; ++c) {
          const auto a = k_code_address(l, t, c), b = v_code_address(l, t, c);
          k.insert(a.byte * 2 + a.nibble);
          v.insert(b.byte * 2 + b.nibble);
          ks.insert(k_scale_offset(l, t, c));
          vs.insert(v_scale_offset(l, t, c));
          ASSERT_LT(a.byte, l.k_scales);
          ASSERT_GE(b.byte, l.v_codes);
          ASSERT_LT(b.byte, l.v_scales);
        }
      EXPECT_EQ(k.size(), size_t(kPage * d));
      EXPECT_EQ(v.size(), size_t(kPage * d));
      EXPECT_EQ(ks.size(), size_t(kPage * d / l.block));
      EXPECT_EQ(vs.size(), size_t(kPage * d / l.block));
      EXPECT_EQ(l.bytes % 128, 0);
      EXPECT_EQ(l.k_scales % 128 + l.v_codes % 128 + l.v_scales % 128 + l.page_scales % 128, 0);
    }
}

TEST(Layout, FragmentOrderOfOneLane) {
  // Lane 5 (row group 1, column pair 1): a0 = (1, 2), a1 = (1, 3), a2 = (9, 2), a4 = (1, 10).
  EXPECT_EQ(fragment_slot(1, 2).lane, 5);
  EXPECT_EQ(fragment_slot(1, 2).j, 0);
  EXPECT_EQ(fragment_slot(1, 3).j, 1);
  EXPECT_EQ(fragment_slot(9, 2).j, 2);
  EXPECT_EQ(fragment_slot(9, 3).j, 3);
  EXPECT_EQ(fragment_slot(1, 10).j, 4);
  EXPECT_EQ(fragment_slot(9, 11).j, 7);
  // half2 register r = (a_2r, a_2r+1) comes from nibble slots r and r + 4.
  for (int j = 0; j < 8; ++j) EXPECT_EQ(fp4_nibble_slot(j), (j % 2) * 4 + j / 2);
}

TEST(HostPage, PackUnpackRoundTrip) {
  const int d = 128;
  const auto k = randn(kPage * d, 1, 3.0f), v = randn(kPage * d, 2);
  for (const char* name : {"nvfp4", "mxfp4", "fp8"}) {
    const Recipe r = parse_recipe(name);
    const ref::QuantPage p = ref::quantize_page(k.data(), v.data(), kPage, d, r);
    const PageLayout l = PageLayout::make(r.kv, d);
    std::vector<uint8_t> bytes(l.bytes);
    pack_page(p, l, bytes.data());
    const ref::QuantPage u = unpack_page(bytes.data(), l);
    EXPECT_EQ(u.k_codes, p.k_codes) << name;
    EXPECT_EQ(u.v_codes, p.v_codes) << name;
    EXPECT_EQ(u.k_scales, p.k_scales) << name;
    EXPECT_EQ(u.v_scales, p.v_scales) << name;
    EXPECT_EQ(u.k_g, p.k_g) << name;
    EXPECT_EQ(u.v_g, p.v_g) << name;
  }
}

TEST(HostPage, Mxfp4PageScaleKeepsBlockScalesInFp16Range) {
  const int d = 128;
  auto k = randn(kPage * d, 3);
  for (int c = 0; c < 32; ++c) k[c] *= 1e6f;  // one huge block, the rest near 1
  const auto v = randn(kPage * d, 4);
  const ref::QuantPage p = ref::quantize_page(k.data(), v.data(), kPage, d, parse_recipe("mxfp4"));
  const float ps = mxfp4_page_scale(p.k_scales.data(), int(p.k_scales.size()));
  int emax = -127;
  for (uint8_t s : p.k_scales) emax = std::max(emax, int(s) - 127);
  EXPECT_EQ(ps, std::ldexp(1.0f, emax - 15));
  for (uint8_t s : p.k_scales) EXPECT_LE(e8m0_value(s) / ps, 32768.0f);
}

TEST(HostPage, Bf16RoundTrip) {
  const int d = 64;
  const PageLayout l = PageLayout::make(KvFormat::bf16, d);
  auto k = randn(kPage * d, 5), v = randn(kPage * d, 6);
  for (auto& x : k) x = round_bf16(x);
  for (auto& x : v) x = round_bf16(x);
  std::vector<uint8_t> bytes(l.bytes);
  pack_bf16_page(k.data(), v.data(), kPage, l, bytes.data());
  std::vector<float> k2(k.size()), v2(v.size());
  unpack_bf16_page(bytes.data(), l, k2.data(), v2.data());
  EXPECT_EQ(k2, k);
  EXPECT_EQ(v2, v);
}

}  // namespace
}  // namespace fp4kv::cache
