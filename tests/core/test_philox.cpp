// Philox4x32-10 against Random123's published known-answer vectors (tests/kat_vectors of
// github.com/DEShawResearch/random123): counter words, key words, expected output words.
#include <gtest/gtest.h>

#include "fp4kv/core/philox.h"

namespace {

struct Kat {
  fp4kv::Philox4x32 counter;
  fp4kv::PhiloxKey key;
  fp4kv::Philox4x32 expected;
};

TEST(Philox, KnownAnswerVectors) {
  const Kat kats[] = {
      {{{0x00000000u, 0x00000000u, 0x00000000u, 0x00000000u}},
       {{0x00000000u, 0x00000000u}},
       {{0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}}},
      {{{0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu}},
       {{0xffffffffu, 0xffffffffu}},
       {{0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}}},
      {{{0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}},
       {{0xa4093822u, 0x299f31d0u}},
       {{0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}}},
  };
  for (const Kat& k : kats) {
    const fp4kv::Philox4x32 out = fp4kv::philox4x32_10(k.counter, k.key);
    for (int i = 0; i < 4; ++i) EXPECT_EQ(out.v[i], k.expected.v[i]) << "word " << i;
  }
}

TEST(Philox, UniformIsInUnitIntervalAndExact) {
  EXPECT_EQ(fp4kv::uniform_from_bits(0u), 0.0f);
  EXPECT_EQ(fp4kv::uniform_from_bits(0xffffffffu), 1.0f - 1.0f / 16777216.0f);
  EXPECT_EQ(fp4kv::uniform_from_bits(0x80000000u), 0.5f);
  EXPECT_EQ(fp4kv::uniform_from_bits(0x000000ffu), 0.0f);  // the low 8 bits are dropped
}

}  // namespace
