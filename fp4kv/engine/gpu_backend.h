// The GPU engine as the scheduler's backend (backend.h): each request's K/V lives in the
// GpuModel's paged cache, in blocks it takes from a pool of the cache's own blocks as it
// grows (a BlockAllocator over the cache's num_blocks, the same count the scheduler's pool
// is given, so the scheduler's admission guarantees every reserve here). A prefill chunk
// runs as decode steps of its one request (gpu_model.h: prefill is decode steps); a decode
// step runs every request of the batch as one row.
//
// Invariants: a request's block-table row is its block list padded with its first block
// (the cache names a request by its first block); drop() frees its BF16 slot and blocks, and
// the next prefill of that request starts again at position 0.
#pragma once

#include <unordered_map>

#include "fp4kv/engine/backend.h"
#include "fp4kv/engine/block_allocator.h"
#include "fp4kv/engine/gpu_model.h"

namespace fp4kv::engine {

class GpuBackend : public Backend {
 public:
  // `model` must outlive the backend.
  explicit GpuBackend(GpuModel& model);

  int vocab_size() const override { return model_.config().vocab_size; }
  bool is_eos(int token) const override { return model_.config().is_eos(token); }
  int max_positions() const override { return model_.options().max_context; }
  std::vector<float> prefill(uint64_t request, const std::vector<int>& tokens) override;
  std::vector<float> decode(const std::vector<uint64_t>& requests, const std::vector<int>& tokens) override;
  void drop(uint64_t request) override;

  int live_requests() const { return int(lengths_.size()); }
  const BlockAllocator& blocks() const { return blocks_; }

 private:
  // Reserves the block for one more token of `request` and appends its row to `rows`.
  void add_row(uint64_t request, int token, StepRows& rows);

  GpuModel& model_;
  BlockAllocator blocks_;
  std::unordered_map<uint64_t, int> lengths_;  // tokens fed to each live request
};

}  // namespace fp4kv::engine
