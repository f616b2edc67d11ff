// The GPU engine as the scheduler's backend (backend.h), over a StepModel (one GPU's
// GpuModel, or a tensor-parallel group whose ranks share one block numbering): each
// request's K/V lives in the model's paged cache, in blocks it takes from a pool of the
// cache's own blocks as it grows (a BlockAllocator over the cache's num_blocks, the same count the scheduler's pool
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
  // `model` must outlive the backend. With `synthetic_prefill` (benchmarks only: `fp4kv bench
  // e2e`), a prefill chunk's tokens but the last get random K/V written straight into the
  // cache through its real quantization path (GpuModel::fill_random_tokens) instead of their
  // forward passes; the last token runs as a real step, so decoding, the block pool, the
  // slots and preemption behave as in serving. The generated text is then noise.
  explicit GpuBackend(StepModel& model, bool synthetic_prefill = false);

  int vocab_size() const override { return model_.config().vocab_size; }
  bool is_eos(int token) const override { return model_.config().is_eos(token); }
  int max_positions() const override { return model_.options().max_context; }
  std::vector<float> prefill(uint64_t request, const std::vector<int>& tokens) override;
  std::vector<float> decode(const std::vector<uint64_t>& requests, const std::vector<int>& tokens) override;
  void drop(uint64_t request) override;
  // The same steps, the tokens drawn on the GPU (ops/sampling.h: the rule of the host
  // sampler, so the same tokens), only the tokens copied back.
  std::vector<TokenDraw> decode_and_draw(const std::vector<uint64_t>& requests, const std::vector<int>& tokens,
                                         const std::vector<DrawSpec>& draws) override;
  TokenDraw prefill_and_draw(uint64_t request, const std::vector<int>& tokens, const DrawSpec& draw) override;

  int live_requests() const { return int(lengths_.size()); }
  const BlockAllocator& blocks() const { return blocks_; }
  // Wall seconds spent in synthetic fills so far (each ends with the device idle), so a
  // benchmark can tell the stand-in for prompt forward passes from the work it measures.
  double synthetic_fill_seconds() const { return synthetic_fill_seconds_; }

 private:
  // Draws the last step's tokens on the GPU; copies the logits too when a row asks for
  // log-probabilities.
  std::vector<TokenDraw> draw_last_step(const std::vector<DrawSpec>& draws);
  // Feeds the steps of prefill/decode without reading anything back.
  void run_prefill(uint64_t request, const std::vector<int>& tokens);
  void run_decode(const std::vector<uint64_t>& requests, const std::vector<int>& tokens);
  // Reserves the block for one more token of `request` and appends its row to `rows`.
  // Throws fp4kv::Error when the request would hold more than max_context tokens.
  void require_fits(uint64_t request, long long end) const;
  void add_row(uint64_t request, int token, StepRows& rows);
  // Appends `request`'s block-table row: its blocks, padded with its first.
  void append_table(uint64_t request, std::vector<int32_t>& tables) const;
  // The one-row step rows of `request` (its block table; token and length not set).
  StepRows table_of(uint64_t request) const;

  StepModel& model_;
  bool synthetic_prefill_ = false;
  double synthetic_fill_seconds_ = 0;
  BlockAllocator blocks_;
  std::unordered_map<uint64_t, int> lengths_;  // tokens fed to each live request
};

}  // namespace fp4kv::engine
