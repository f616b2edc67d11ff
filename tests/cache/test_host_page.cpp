// The layout packer: a bijection between logical pages and cache bytes.
#include <gtest/gtest.h>

#include <random>
#include <set>

#include "fp4kv/cache/host_page.h"
#include "fp4kv/core/error.h"
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
          k.insert(a.byte * 2 + a.odd);
          v.insert(b.byte * 2 + b.odd);
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
  // half2 register r = (a_2r, a_2r+1) comes from slots r and r + 4.
  for (int j = 0; j < 8; ++j) EXPECT_EQ(fp4_word_slot(j), (j % 2) * 4 + j / 2);
}

// A stored FP4 byte holds its two codes without loss, in the documented bits, and the word
// forms agree with the byte form on every byte.
TEST(Layout, StoredFp4BytesHoldBothCodes) {
  std::set<int> bytes;
  for (uint32_t even = 0; even < 16; ++even)
    for (uint32_t odd = 0; odd < 16; ++odd) {
      const uint8_t b = fp4_stored_byte(even, odd);
      bytes.insert(b);
      EXPECT_EQ(fp4_code_of_stored(b, 0), even);
      EXPECT_EQ(fp4_code_of_stored(b, 1), odd);
      EXPECT_EQ((b >> 7) & 1u, even >> 3);        // even sign at bit 7
      EXPECT_EQ((b >> 1) & 7u, even & 7u);        // even e1 e0 m at bits 1..3
      EXPECT_EQ((b >> 4) & 7u, odd & 7u);         // odd e1 e0 m at bits 4..6
      EXPECT_EQ(b & 1u, odd >> 3);                // odd sign at bit 0
      const uint32_t nibbles = even | (odd << 4);
      for (int i = 0; i < 4; ++i) {
        const uint32_t w = nibbles << (8 * i);
        EXPECT_EQ(fp4_stored_word(w), uint32_t(b) << (8 * i));
        EXPECT_EQ(fp4_nibble_word(uint32_t(b) << (8 * i)), w);
      }
    }
  EXPECT_EQ(bytes.size(), 256u);
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

// The MLA latent page (DeepSeek: latent 512, positional keys 64): sub-arrays where the layout
// says, 128-byte aligned, and 416 bytes per token for NVFP4 (256 of codes, 32 of scales, 128
// of BF16 r) plus one 128-byte page-scale slot per page.
TEST(LatentLayout, SizesAndOffsets) {
  const LatentPageLayout nv = LatentPageLayout::make(KvFormat::nvfp4, 512, 64);
  EXPECT_EQ(nv.c_scales, 128 * 256);
  EXPECT_EQ(nv.r_rows, nv.c_scales + 128 * 32);
  EXPECT_EQ(nv.page_scales, nv.r_rows + 128 * 128);
  EXPECT_EQ(nv.bytes, 128 * 416 + 128);
  const LatentPageLayout mx = LatentPageLayout::make(KvFormat::mxfp4, 512, 64);
  EXPECT_EQ(mx.r_rows, 128 * 256 + 128 * 16);
  const LatentPageLayout f8 = LatentPageLayout::make(KvFormat::fp8, 512, 64);
  EXPECT_EQ(f8.r_rows, 128 * 512);
  EXPECT_EQ(f8.bytes, 128 * (512 + 128) + 128);
  const LatentPageLayout b16 = LatentPageLayout::make(KvFormat::bf16, 512, 64);
  EXPECT_EQ(b16.bytes, 128 * (1024 + 128));  // no page scales
  for (const LatentPageLayout& l : {nv, mx, f8, b16}) {
    EXPECT_EQ(l.bytes % 128 + l.c_scales % 128 + l.r_rows % 128 + l.page_scales % 128, 0);
    const PageLayout k = l.latent_part();
    std::set<int> codes, scales;
    for (int t = 0; t < kPage; ++t)
      for (int c = 0; c < l.latent_dim; ++c) {
        if (l.format == KvFormat::nvfp4 || l.format == KvFormat::mxfp4) {
          const CodeAddress a = k_code_address(k, t, c);
          codes.insert(a.byte * 2 + a.odd);
          ASSERT_LT(a.byte, l.c_scales);
          const int s = k_scale_offset(k, t, c);
          scales.insert(s);
          ASSERT_GE(s, l.c_scales);
          ASSERT_LT(s, l.r_rows);
        } else {
          const int o = l.format == KvFormat::fp8 ? k_fp8_offset(k, t, c) : bf16_k_offset(k, t, c);
          codes.insert(o);
          ASSERT_LT(o, l.r_rows);
        }
      }
    EXPECT_EQ(codes.size(), size_t(kPage * l.latent_dim));
    if (l.block) {
      EXPECT_EQ(scales.size(), size_t(kPage * l.latent_dim / l.block));
    }
    EXPECT_GE(latent_r_offset(l, 0, 0), l.r_rows);
    EXPECT_EQ(latent_r_offset(l, kPage - 1, l.rope_dim - 1) + 2, l.r_rows + kPage * l.rope_dim * 2);
  }
}

TEST(LatentPage, PackUnpackRoundTrip) {
  const int dc = 512, dr = 64, tokens = 100;  // an unfinished page: rows past 100 are zero
  const auto c = randn(kPage * dc, 7, 2.0f), v = randn(kPage * dc, 8);
  auto r = randn(kPage * dr, 9);
  for (auto& x : r) x = round_bf16(x);
  for (const char* name : {"nvfp4", "mxfp4", "fp8"}) {
    const Recipe rec = parse_recipe(name);
    const ref::QuantPage p = ref::quantize_page(c.data(), v.data(), tokens, dc, rec);
    const LatentPageLayout l = LatentPageLayout::make(rec.kv, dc, dr);
    std::vector<uint8_t> bytes(l.bytes);
    pack_latent_page(p, r.data(), tokens, l, bytes.data());
    std::vector<float> r2(kPage * dr);
    const ref::QuantPage u = unpack_latent_page(bytes.data(), l, r2.data(), tokens);
    EXPECT_EQ(u.k_codes, p.k_codes) << name;
    EXPECT_EQ(u.k_scales, p.k_scales) << name;
    EXPECT_EQ(u.k_g, p.k_g) << name;
    for (int t = 0; t < kPage; ++t)
      for (int x = 0; x < dr; ++x)
        ASSERT_EQ(r2[t * dr + x], t < tokens ? r[t * dr + x] : 0.0f) << name << " r row " << t;
  }
  const LatentPageLayout l = LatentPageLayout::make(KvFormat::bf16, dc, dr);
  auto cb = c;
  for (auto& x : cb) x = round_bf16(x);
  std::vector<uint8_t> bytes(l.bytes);
  pack_bf16_latent_page(cb.data(), r.data(), kPage, l, bytes.data());
  std::vector<float> c2(cb.size()), r2(r.size());
  unpack_bf16_latent_page(bytes.data(), l, c2.data(), r2.data());
  EXPECT_EQ(c2, cb);
  EXPECT_EQ(r2, r);
  EXPECT_THROW(pack_latent_page(ref::quantize_page(c.data(), v.data(), kPage, dc, parse_recipe("nvfp4")), r.data(),
                                kPage, LatentPageLayout::make(KvFormat::mxfp4, dc, dr), bytes.data()),
               Error);
}

}  // namespace
}  // namespace fp4kv::cache
