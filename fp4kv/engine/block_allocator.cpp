#include "fp4kv/engine/block_allocator.h"

#include <climits>
#include <string>

#include "fp4kv/cache/layout.h"
#include "fp4kv/core/error.h"

namespace fp4kv::engine {

namespace {

constexpr int64_t kFree = -1;
constexpr long long kBf16Bytes = 2;
constexpr long long kKeyAndValue = 2;

const std::vector<int> kNoBlocks;

}  // namespace

int blocks_for_tokens(long long tokens) {
  require(tokens >= 0, "blocks_for_tokens: negative token count " + std::to_string(tokens));
  const long long blocks = (tokens + kBlockTokens - 1) / kBlockTokens;
  require(blocks <= INT_MAX, "blocks_for_tokens: " + std::to_string(tokens) + " tokens is too many");
  return int(blocks);
}

BlockAllocator::BlockAllocator(int total_blocks) {
  require(total_blocks >= 1, "BlockAllocator: the pool needs >= 1 block, got " + std::to_string(total_blocks));
  used_by_.assign(size_t(total_blocks), kFree);
  free_.reserve(size_t(total_blocks));
  // Pushed in reverse so block 0 is handed out first (easier to read in a debugger).
  for (int b = total_blocks - 1; b >= 0; --b) free_.push_back(b);
}

int BlockAllocator::held(uint64_t request) const {
  const auto it = lists_.find(request);
  return it == lists_.end() ? 0 : int(it->second.size());
}

int BlockAllocator::extra_for(uint64_t request, long long tokens) const {
  const int need = blocks_for_tokens(tokens) - held(request);
  return need > 0 ? need : 0;
}

void BlockAllocator::reserve(uint64_t request, long long tokens) {
  const int extra = extra_for(request, tokens);
  require(extra <= free_count(), "BlockAllocator: request " + std::to_string(request) + " needs " +
                                     std::to_string(extra) + " more blocks for " + std::to_string(tokens) +
                                     " tokens; " + std::to_string(free_count()) + " are free");
  if (extra == 0) return;
  std::vector<int>& list = lists_[request];
  for (int i = 0; i < extra; ++i) {
    const int b = free_.back();
    free_.pop_back();
    used_by_[size_t(b)] = int64_t(request);
    list.push_back(b);
  }
}

void BlockAllocator::release(uint64_t request) {
  const auto it = lists_.find(request);
  require(it != lists_.end(), "BlockAllocator: request " + std::to_string(request) + " holds no blocks to free");
  for (int b : it->second) {
    require(used_by_[size_t(b)] == int64_t(request),
            "BlockAllocator: block " + std::to_string(b) + " is not held by request " + std::to_string(request));
    used_by_[size_t(b)] = kFree;
    free_.push_back(b);
  }
  lists_.erase(it);
}

const std::vector<int>& BlockAllocator::blocks(uint64_t request) const {
  const auto it = lists_.find(request);
  return it == lists_.end() ? kNoBlocks : it->second;
}

void BlockAllocator::check() const {
  std::vector<int> seen(used_by_.size(), 0);
  for (int b : free_) {
    require(used_by_[size_t(b)] == kFree, "BlockAllocator: free block " + std::to_string(b) + " is marked used");
    ++seen[size_t(b)];
  }
  for (const auto& [request, list] : lists_) {
    for (int b : list) {
      require(used_by_[size_t(b)] == int64_t(request),
              "BlockAllocator: block " + std::to_string(b) + " listed for request " + std::to_string(request) +
                  " is owned by another");
      ++seen[size_t(b)];
    }
  }
  for (size_t b = 0; b < seen.size(); ++b)
    require(seen[b] == 1, "BlockAllocator: block " + std::to_string(b) + " appears " + std::to_string(seen[b]) +
                              " times (leaked or double-owned)");
}

CacheCapacity cache_capacity(KvFormat format, const CacheShape& shape, long long budget_bytes, int max_requests) {
  require(cache::gpu_format_supported(format), "cache_capacity: the cache does not store this KV format (fp32?)");
  require(shape.layers >= 1 && shape.kv_heads >= 1 && shape.head_dim >= 1,
          "cache_capacity: bad model shape (layers " + std::to_string(shape.layers) + ", kv_heads " +
              std::to_string(shape.kv_heads) + ", head_dim " + std::to_string(shape.head_dim) + ")");
  require(max_requests >= 0, "cache_capacity: max_requests must be >= 0, got " + std::to_string(max_requests));
  const long long per_head_layer = (long long)shape.kv_heads * shape.layers;
  CacheCapacity c;
  c.block_bytes = (long long)cache::PageLayout::make(format, shape.head_dim).bytes * per_head_layer;
  c.slot_bytes_per_request = (long long)cache::kSlotRows * shape.head_dim * kBf16Bytes * kKeyAndValue * per_head_layer;
  const long long pool_bytes = budget_bytes - c.slot_bytes_per_request * max_requests;
  require(pool_bytes >= 0, "cache_capacity: a budget of " + std::to_string(budget_bytes) + " bytes does not hold the " +
                               "BF16 slots of " + std::to_string(max_requests) + " requests");
  const long long blocks = pool_bytes / c.block_bytes;
  c.blocks = int(blocks > INT_MAX ? INT_MAX : blocks);
  return c;
}

}  // namespace fp4kv::engine
