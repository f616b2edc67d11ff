#include <gtest/gtest.h>

#include "fp4kv/core/decode_layout.h"

namespace fp4kv {
namespace {

TEST(DecodeLayout, SinkAndRecent) {
  // Until a page has been promoted, everything is BF16.
  for (int n : {1, 15, 16, 17, 127, 128}) {
    const DecodeLayout l = decode_layout(n, true, true, true);
    EXPECT_EQ(l.quant_pages, 0) << n;
    EXPECT_EQ(l.bf16_tokens(), n) << n;
  }
  // 129 tokens: page 0 was promoted after the step that wrote token 127.
  DecodeLayout l = decode_layout(129, true, true, true);
  EXPECT_EQ(l.quant_pages, 1);
  EXPECT_EQ(l.masked_prefix, 16);
  EXPECT_EQ(l.sink_tokens, 16);
  EXPECT_EQ(l.recent_begin, 128);
  EXPECT_EQ(l.recent_end, 129);
  // 256 tokens: the step that writes token 255 still sees page 1 in BF16 (128 recent).
  l = decode_layout(256, true, true, true);
  EXPECT_EQ(l.quant_pages, 1);
  EXPECT_EQ(l.recent_end - l.recent_begin, 128);
  l = decode_layout(4096 + 7, true, true, true);
  EXPECT_EQ(l.quant_pages, 32);
  EXPECT_EQ(l.last_page_tokens, 128);
  EXPECT_EQ(l.bf16_tokens(), 16 + 7);
}

TEST(DecodeLayout, RecentWithoutSink) {
  const DecodeLayout l = decode_layout(300, true, false, true);
  EXPECT_EQ(l.quant_pages, 2);
  EXPECT_EQ(l.masked_prefix, 0);
  EXPECT_EQ(l.sink_tokens, 0);
  EXPECT_EQ(l.bf16_tokens(), 300 - 256);
  EXPECT_EQ(decode_layout(100, true, false, true).bf16_tokens(), 100);
}

TEST(DecodeLayout, EverythingQuantizedWithoutRecent) {
  DecodeLayout l = decode_layout(129, true, false, false);
  EXPECT_EQ(l.quant_pages, 2);
  EXPECT_EQ(l.last_page_tokens, 1);
  EXPECT_EQ(l.bf16_tokens(), 0);
  l = decode_layout(128, true, false, false);
  EXPECT_EQ(l.quant_pages, 1);
  EXPECT_EQ(l.last_page_tokens, 128);
  l = decode_layout(1, true, false, false);
  EXPECT_EQ(l.quant_pages, 1);
  EXPECT_EQ(l.last_page_tokens, 1);
  // With the sink: its tokens are BF16 and masked in page 0.
  l = decode_layout(40, true, true, false);
  EXPECT_EQ(l.quant_pages, 1);
  EXPECT_EQ(l.masked_prefix, 16);
  EXPECT_EQ(l.bf16_tokens(), 16);
  EXPECT_EQ(decode_layout(5, true, true, false).bf16_tokens(), 5);
}

TEST(DecodeLayout, UnquantizedCacheIsAllBf16) {
  const DecodeLayout l = decode_layout(1000, false, true, true);
  EXPECT_EQ(l.quant_pages, 0);
  EXPECT_EQ(l.bf16_tokens(), 1000);
  EXPECT_EQ(decode_layout(0, true, true, true).bf16_tokens(), 0);
}

}  // namespace
}  // namespace fp4kv
