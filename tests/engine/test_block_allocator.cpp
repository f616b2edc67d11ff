// The block pool: blocks per token count, allocate/extend/free with the bookkeeping checked,
// errors for over-allocation and double frees; the capacity a budget buys per KV format
// (nvfp4 holds ~3.5x the tokens of bf16, exactly the ratio of their page bytes).
#include "fp4kv/engine/block_allocator.h"

#include <gtest/gtest.h>

#include "fp4kv/cache/layout.h"
#include "fp4kv/core/error.h"

namespace fp4kv::engine {
namespace {

TEST(BlockAllocator, BlocksForTokens) {
  EXPECT_EQ(blocks_for_tokens(0), 0);
  EXPECT_EQ(blocks_for_tokens(1), 1);
  EXPECT_EQ(blocks_for_tokens(kBlockTokens), 1);
  EXPECT_EQ(blocks_for_tokens(kBlockTokens + 1), 2);
  EXPECT_THROW(blocks_for_tokens(-1), Error);
}

TEST(BlockAllocator, AllocateExtendFree) {
  BlockAllocator a(4);
  EXPECT_EQ(a.free_count(), 4);
  a.reserve(7, 100);
  EXPECT_EQ(a.held(7), 1);
  a.reserve(7, 129);  // extend
  EXPECT_EQ(a.held(7), 2);
  a.reserve(7, 50);  // already held: no change
  EXPECT_EQ(a.held(7), 2);
  a.reserve(9, 256);
  EXPECT_EQ(a.free_count(), 0);
  EXPECT_FALSE(a.fits(11, 1));
  EXPECT_THROW(a.reserve(11, 1), Error);
  a.check();
  a.release(7);
  EXPECT_EQ(a.free_count(), 2);
  EXPECT_THROW(a.release(7), Error);  // no double free
  a.release(9);
  EXPECT_EQ(a.free_count(), 4);
  a.check();
  EXPECT_THROW(BlockAllocator(0), Error);
}

TEST(BlockAllocator, CapacityPerFormat) {
  const CacheShape shape{28, 8, 128};
  const long long budget = 8ll << 30;
  const int requests = 16;
  const CacheCapacity bf16 = cache_capacity(KvFormat::bf16, shape, budget, requests);
  const CacheCapacity fp4 = cache_capacity(KvFormat::nvfp4, shape, budget, requests);
  EXPECT_EQ(bf16.block_bytes, 2ll * 2 * 128 * kBlockTokens * 8 * 28);
  EXPECT_EQ(fp4.block_bytes, (long long)cache::PageLayout::make(KvFormat::nvfp4, 128).bytes * 8 * 28);
  EXPECT_EQ(bf16.slot_bytes_per_request, (long long)cache::kSlotRows * 128 * 2 * 2 * 8 * 28);
  const double ratio = double(fp4.tokens()) / double(bf16.tokens());
  const double bytes_ratio = double(bf16.block_bytes) / double(fp4.block_bytes);
  EXPECT_NEAR(ratio, bytes_ratio, 0.01 * bytes_ratio);  // within the floor of whole blocks
  EXPECT_GT(ratio, 3.4);
  EXPECT_LT(ratio, 3.6);
  EXPECT_THROW(cache_capacity(KvFormat::fp32, shape, budget, requests), Error);
  EXPECT_THROW(cache_capacity(KvFormat::nvfp4, shape, 1000, requests), Error);
}

}  // namespace
}  // namespace fp4kv::engine
