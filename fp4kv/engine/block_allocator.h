// The engine's cache blocks: a fixed pool of blocks of cache::kPageTokens (128) tokens, each
// request holding a list of them for the tokens whose K/V it keeps, and the capacity a memory
// budget buys per KV format. Backend-neutral: the GPU cache's pool blocks (cache/kv_cache.h)
// are these blocks; the CPU backend only counts them, so scheduling is the same on both.
//
// Invariants: every block is either free or held by exactly one request (check() verifies
// it); a request's list only grows until it is released whole; releasing frees every block
// of the request once (a second release, or one for an unknown request, is an error).
#pragma once

#include <cstdint>
#include <unordered_map>
#include <vector>

#include "fp4kv/core/recipe.h"

namespace fp4kv::engine {

inline constexpr int kBlockTokens = kPageTokens;

// Blocks that hold `tokens` tokens (0 for none). Throws Error for a negative count.
int blocks_for_tokens(long long tokens);

class BlockAllocator {
 public:
  // A pool of `total_blocks` (>= 1) blocks, all free.
  explicit BlockAllocator(int total_blocks);

  int total() const { return int(used_by_.size()); }
  int free_count() const { return int(free_.size()); }
  int used_count() const { return total() - free_count(); }

  // Blocks `request` holds (0 when it holds none).
  int held(uint64_t request) const;
  // Further blocks `request` needs to hold `tokens` tokens (0 when it already does).
  int extra_for(uint64_t request, long long tokens) const;
  bool fits(uint64_t request, long long tokens) const { return extra_for(request, tokens) <= free_count(); }
  // Grows the request's list to hold `tokens` tokens. Throws Error (changing nothing) when
  // the free blocks do not suffice.
  void reserve(uint64_t request, long long tokens);
  // Frees every block of `request`. Throws Error when it holds none.
  void release(uint64_t request);
  const std::vector<int>& blocks(uint64_t request) const;

  // Throws Error unless every block is free or held by exactly one request (no leak, no
  // double ownership).
  void check() const;

 private:
  std::vector<int> free_;       // stack of free block ids
  std::vector<int64_t> used_by_;  // per block: its request, or kFree
  std::unordered_map<uint64_t, std::vector<int>> lists_;
};

// How many cache blocks (and tokens) a memory budget holds for a KV format on a model shape.
// Bytes per block: PageLayout::make(format, head_dim).bytes x kv_heads x layers. Every running
// request also keeps BF16 slot rows (cache::kSlotRows per head and layer, K and V, 2 bytes
// each), taken from the budget first for `max_requests` requests.
struct CacheShape {
  int layers = 0;
  int kv_heads = 0;
  int head_dim = 0;
};

struct CacheCapacity {
  long long block_bytes = 0;         // one block, all layers and KV heads
  long long slot_bytes_per_request = 0;
  int blocks = 0;
  long long tokens() const { return (long long)blocks * kBlockTokens; }
};

// Throws Error for a format the cache does not store (fp32), a bad shape, or a budget that
// does not hold the slots of max_requests requests.
CacheCapacity cache_capacity(KvFormat format, const CacheShape& shape, long long budget_bytes, int max_requests);

}  // namespace fp4kv::engine
