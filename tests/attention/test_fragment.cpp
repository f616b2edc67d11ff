// CPU replay of what each lane of the decode kernel reads from a page in shared memory:
// the 16-byte parts of the stored page, the fragment words, the block-scale pairs and
// the FP4 expansion trick must give exactly code * block scale at the (row, column) the
// PTX fragment layout assigns to that register. Runs without a GPU.
#include <gtest/gtest.h>

#include <cstring>
#include <limits>
#include <random>
#include <set>
#include <vector>

#include "fp4kv/attention/fragment.h"
#include "fp4kv/cache/host_page.h"
#include "fp4kv/core/block_quant.h"
#include "fp4kv/core/half.h"
#include "fp4kv/core/minifloat.h"
#include "fp4kv/ref/quant_page.h"

namespace fp4kv::attention {
namespace {

using cache::PageLayout;

std::vector<float> randn(size_t n, unsigned seed, float scale) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, scale);
  std::vector<float> x(n);
  for (auto& v : x) v = nd(rng);
  return x;
}

float half_value(uint32_t bits) { return fp16_bits_to_float(uint16_t(bits & 0xFFFFu)); }
// mul.rn.f16x2 on one half: the product of two FP16 values rounded to FP16.
float hmul(float a, float b) { return round_fp16(a * b); }

uint32_t load_u32(const std::vector<uint8_t>& s, int off) {
  uint32_t w;
  std::memcpy(&w, s.data() + off, 4);
  return w;
}

TEST(Fragment, Fp4ExpansionIsValueTimes2PowMinus14) {
  for (uint32_t lo = 0; lo < 16; ++lo)
    for (uint32_t hi = 0; hi < 16; ++hi) {
      const uint32_t h2 = fp4x2_to_half2_bits(lo | (hi << 16) | 0xFFF0FFF0u);  // junk bits ignored
      EXPECT_EQ(half_value(h2), e2m1_value(uint8_t(lo)) * pow2f(-14)) << lo;
      EXPECT_EQ(half_value(h2 >> 16), e2m1_value(uint8_t(hi)) * pow2f(-14)) << hi;
      EXPECT_EQ((h2 & 0x8000u) != 0, (lo & 8u) != 0);
    }
}

// The kernel's four-register expansion equals the one-register reference bit for bit.
TEST(Fragment, Fp4WordToFourRegistersMatchesPerRegister) {
  std::mt19937 rng(5);
  std::vector<uint32_t> words = {0u, 0xFFFFFFFFu, 0x88888888u, 0x77777777u, 0x01234567u, 0x89ABCDEFu};
  for (int i = 0; i < 200000; ++i) words.push_back(uint32_t(rng()));
  for (uint32_t w : words) {
    uint32_t a[4];
    fp4_word_to_a_regs(w, a);
    for (int r = 0; r < 4; ++r) ASSERT_EQ(a[r], fp4_word_to_a_reg_bits(w, r)) << std::hex << w << " r " << r;
  }
}

// Every code the MXFP4 quantizer writes (0..253) as twice its scale, alone and in pairs whose
// upper 16 bits hold another pair.
TEST(Fragment, E8M0ScaleValueIsTwiceTheScale) {
  constexpr uint32_t kMaxWrittenCode = 253;
  // The largest block the quantizer sees, with the search's step up: the largest code.
  float largest[kMxfp4Block];
  for (float& x : largest) x = std::numeric_limits<float>::max();
  uint8_t codes[kMxfp4Block];
  EXPECT_LE(mxfp4_quantize_block(largest, 1, true, codes), kMaxWrittenCode);
  for (uint32_t c = 0; c <= kMaxWrittenCode; ++c) EXPECT_EQ(e8m0_scale_value_x2(c), 2.0f * e8m0_value(uint8_t(c))) << c;
  for (uint32_t lo = 0; lo <= kMaxWrittenCode; ++lo)
    for (uint32_t hi = 0; hi <= kMaxWrittenCode; ++hi) {
      float f[2];
      e8m0_pair_values_x2((((hi * 7 + lo) & 0xFFFFu) << 16) | (hi << 8) | lo, f);
      ASSERT_EQ(f[0], e8m0_scale_value_x2(lo)) << lo << " " << hi;
      ASSERT_EQ(f[1], e8m0_scale_value_x2(hi)) << lo << " " << hi;
    }
}

// Every lane's K and V fragments of a packed page, expanded as the kernel does.
void check_page(KvFormat f, int d, bool search) {
  Recipe r = parse_recipe(f == KvFormat::nvfp4 ? "nvfp4" : f == KvFormat::mxfp4 ? "mxfp4" : "fp8");
  r.key_search = search;
  const auto k = randn(size_t(kPageTokens) * d, 11 + d, 3.0f), v = randn(size_t(kPageTokens) * d, 12 + d, 1.0f);
  const ref::QuantPage p = ref::quantize_page(k.data(), v.data(), kPageTokens, d, r);
  const PageLayout l = PageLayout::make(f, d);
  std::vector<uint8_t> bytes(l.bytes);
  cache::pack_page(p, l, bytes.data());
  const bool fp4 = f != KvFormat::fp8;
  const int KS = d / 16;
  const int kcpl = (fp4 ? KS * 4 : KS * 8) / 16, vcpl = (fp4 ? 32 : 64) / 16;
  const auto& st = bytes;  // the kernel's stage is the page as stored (one bulk copy)
  // FP4: the A registers hold value x 2^-14. NVFP4 multiplies them by the FP16 block scale
  // (HMUL2, exact); MXFP4 multiplies the MMA's FP32 block product by twice the FP32 block
  // scale, emulated here per element (exact: a power of two). g is applied outside, as in
  // the kernel.
  const float unit = !fp4 ? 1.0f : (f == KvFormat::mxfp4 ? pow2f(13) : pow2f(14));

  // Registers of the A fragment of tile (rg, ks) of a code array with `cpl` parts per lane.
  auto a_regs = [&](int codes_off, int scales_off, int blocks, int cpl, int rg, int lane, int ks, float out[4][2]) {
    if (fp4) {
      const int per_part = 4;
      const uint32_t word = load_u32(st, codes_off + code_part_offset(rg, ks / per_part, lane, cpl) + (ks % per_part) * 4);
      const int blk = l.format == KvFormat::nvfp4 ? ks : ks / 2;
      const int so = scales_off + scale_row_offset(rg, lane, blocks) + 2 * blk;
      float sc[2];
      for (int h = 0; h < 2; ++h) {
        const uint8_t code = st[so + h];
        sc[h] = l.format == KvFormat::nvfp4 ? round_fp16(e4m3_value(code)) : e8m0_scale_value_x2(code);
      }
      for (int reg = 0; reg < 4; ++reg) {
        const uint32_t h2 = fp4_word_to_a_reg_bits(word, reg);
        for (int e = 0; e < 2; ++e) {
          const float a = half_value(h2 >> (16 * e));
          out[reg][e] = l.format == KvFormat::nvfp4 ? hmul(a, sc[reg % 2]) : a * sc[reg % 2];
        }
      }
    } else {
      const int off = codes_off + code_part_offset(rg, ks / 2, lane, cpl) + (ks % 2) * 8;
      for (int reg = 0; reg < 4; ++reg) {
        out[reg][0] = round_fp16(e4m3_value(st[off + 2 * reg]));
        out[reg][1] = round_fp16(e4m3_value(st[off + 2 * reg + 1]));
      }
    }
  };
  const int kblocks = fp4 ? d / l.block : 0, vblocks = fp4 ? kPageTokens / l.block : 0;
  for (int lane = 0; lane < 32; ++lane) {
    for (int kg = 0; kg < kPageTokens / 16; ++kg)
      for (int ks = 0; ks < KS; ++ks) {
        float a[4][2];
        a_regs(l.k_codes, l.k_scales, kblocks, kcpl, kg, lane, ks, a);
        for (int reg = 0; reg < 4; ++reg)
          for (int e = 0; e < 2; ++e) {
            const int t = kg * 16 + a_frag_row(lane, reg), c = ks * 16 + a_frag_col(lane, reg) + e;
            ASSERT_EQ(a[reg][e] * unit, p.k_expanded(t, c))
                << to_string(f) << " d=" << d << " K t=" << t << " c=" << c;
          }
      }
    for (int cg = 0; cg < d / 16; ++cg)
      for (int ks = 0; ks < 8; ++ks) {
        float a[4][2];
        a_regs(l.v_codes, l.v_scales, vblocks, vcpl, cg, lane, ks, a);
        for (int reg = 0; reg < 4; ++reg)
          for (int e = 0; e < 2; ++e) {
            const int c = cg * 16 + a_frag_row(lane, reg), t = ks * 16 + a_frag_col(lane, reg) + e;
            ASSERT_EQ(a[reg][e] * unit, p.v_expanded(t, c)) << to_string(f) << " d=" << d << " V t=" << t << " c=" << c;
          }
      }
  }
}

TEST(Fragment, LaneViewOfPackedPagesMatchesExpandedValues) {
  for (int d : {64, 128, 256}) {
    check_page(KvFormat::nvfp4, d, true);
    check_page(KvFormat::mxfp4, d, true);
    check_page(KvFormat::fp8, d, false);
  }
}

TEST(Fragment, QueryOperandIsTheBFragment) {
  for (int NT : {1, 2, 4})
    for (int d : {64, 128, 256}) {
      std::set<int> seen;
      for (int col = 0; col < 8 * NT; ++col)
        for (int c = 0; c < d; ++c) seen.insert(qfrag_half_index(col, c, NT));
      ASSERT_EQ(int(seen.size()), 8 * NT * d);
      // lane `lane` reads uint2 number (ks * NT + nt) * 32 + lane: halves 4 * that + 2 reg + e
      for (int ks = 0; ks < d / 16; ++ks)
        for (int nt = 0; nt < NT; ++nt)
          for (int lane = 0; lane < 32; ++lane)
            for (int reg = 0; reg < 2; ++reg)
              for (int e = 0; e < 2; ++e) {
                const int k = ks * 16 + b_frag_k(lane, reg) + e, n = nt * 8 + b_frag_n(lane);
                ASSERT_EQ(qfrag_half_index(n, k, NT), (((ks * NT + nt) * 32 + lane) * 2 + reg) * 2 + e);
              }
    }
}

// Query columns: every (head, term) of a tile set gets its own column; two terms in one tile
// sit in one thread's C fragment pair (2h, 2h + 1); two terms in NT >= 2 tiles sit in the
// same fragment column of tiles nt and nt + NT / 2, the column of the head's P.V slot.
TEST(Fragment, QueryColumnsPutAHeadsTermsWhereItsThreadJoinsThem) {
  for (int T : {1, 2})
    for (int NT : {1, 2, 4}) {
      const int heads = 8 * NT / T;
      std::set<int> seen;
      for (int h = 0; h < heads; ++h)
        for (int t = 0; t < T; ++t) {
          const int col = query_column(h, t, T, NT);
          ASSERT_GE(col, 0);
          ASSERT_LT(col, 8 * NT);
          seen.insert(col);
        }
      ASSERT_EQ(int(seen.size()), heads * T);
      if (T == 1) continue;
      for (int h = 0; h < heads; ++h) {
        const int c1 = query_column(h, 0, T, NT), c2 = query_column(h, 1, T, NT);
        if (NT == 1) {
          EXPECT_EQ(c1, 2 * h);
          EXPECT_EQ(c2, c1 + 1);
        } else {
          EXPECT_EQ(c1 % 8, h % 8);  // c_frag_col of the P.V slot's head
          EXPECT_EQ(c1 / 8, h / 8);
          EXPECT_EQ(c2, c1 + 8 * (NT / 2));
        }
      }
    }
}

TEST(Fragment, ProbabilityOperandIsTheBFragment) {
  for (int j = 0; j < 2; ++j)
    for (int ks = 0; ks < 8; ++ks)
      for (int lane = 0; lane < 32; ++lane)
        for (int reg = 0; reg < 2; ++reg) {
          const int w = ps_word_index(j, lane, ks, reg);
          const int head = j * 8 + b_frag_n(lane), key = ks * 16 + b_frag_k(lane, reg);
          EXPECT_EQ(2 * w, head * kPsStride + key);
        }
}

// The k32 channel permutation is a bijection of each 32-channel step that keeps both
// 16-channel halves (NVFP4 blocks) in place, and k32_channel is its inverse.
TEST(Fragment, K32PermutationKeepsTheHalvesAndInverts) {
  std::set<int> seen;
  for (int c = 0; c < 32; ++c) {
    const int k = k32_position(c);
    EXPECT_EQ(k / 16, c / 16) << c;
    EXPECT_EQ(k32_channel(k), c) << c;
    seen.insert(k);
  }
  EXPECT_EQ(seen.size(), 32u);
}

// Each lane's two FP4 words of a k32 step (in nibble form), converted to E4M3 bytes, are the
// m16n8k32 A fragment of the permuted tile: byte i of register r holds the code of (row
// a8_frag_row, channel k32_channel(a8_frag_k)) as e2m1_as_e4m3, for every lane, row group
// and k32 step of a random K page (d = 128 and 256).
TEST(Fragment, Fp4WordsAreTheE4m3K32Fragment) {
  for (int d : {128, 256}) {
    const PageLayout l = PageLayout::make(KvFormat::nvfp4, d);
    std::mt19937 rng(d);
    std::vector<uint8_t> codes(size_t(kPageTokens) * d);
    for (auto& c : codes) c = uint8_t(rng() & 0xFu);
    std::vector<uint8_t> bytes(l.bytes, 0);
    for (int t = 0; t < kPageTokens; ++t)
      for (int c = 0; c < d; ++c) {
        const cache::CodeAddress a = cache::k_code_address(l, t, c);
        bytes[a.byte] |= uint8_t(codes[size_t(t) * d + c] << (4 * a.odd));  // nibble form (the route's input)
      }
    const int cpl = d / 16 * 4 / 16;  // 16-byte parts per lane and row group
    for (int rg = 0; rg < kPageTokens / 16; ++rg)
      for (int p = 0; p < d / 32; ++p)
        for (int lane = 0; lane < 32; ++lane) {
          auto word = [&](int ks) { return load_u32(bytes, l.k_codes + code_part_offset(rg, ks / 4, lane, cpl) + (ks % 4) * 4); };
          uint32_t a[4];
          fp4_words_to_e4m3_a_regs(word(2 * p), word(2 * p + 1), a);
          for (int r = 0; r < 4; ++r)
            for (int i = 0; i < 4; ++i) {
              const int row = rg * 16 + a8_frag_row(lane, r), ch = 32 * p + k32_channel(a8_frag_k(lane, r, i));
              ASSERT_EQ((a[r] >> (8 * i)) & 0xFFu, e2m1_as_e4m3(codes[size_t(row) * d + ch]))
                  << "d " << d << " rows " << rg << " k32 step " << p << " lane " << lane << " reg " << r << " byte " << i;
            }
        }
  }
}

}  // namespace
}  // namespace fp4kv::attention
