// The CPU backend of the scheduler: the float32 Qwen3 runner with one KvState per request,
// attention through the given AttentionFn (eval::recipe_attention for a recipe: every step
// attends over the quantized pages and BF16 sink/recent rows, as the GPU cache holds them).
// Decode runs the batch's requests one after another: the CPU twin, not a fast path.
#pragma once

#include <unordered_map>

#include "fp4kv/engine/backend.h"
#include "fp4kv/model/qwen3.h"

namespace fp4kv::engine {

class CpuBackend : public Backend {
 public:
  // `model` must outlive the backend.
  CpuBackend(const model::Qwen3Model& model, model::AttentionFn attend);

  int vocab_size() const override { return model_.config().vocab_size; }
  bool is_eos(int token) const override { return model_.config().is_eos(token); }
  int max_positions() const override { return model_.config().max_position_embeddings; }
  std::vector<float> prefill(uint64_t request, const std::vector<int>& tokens) override;
  std::vector<float> decode(const std::vector<uint64_t>& requests, const std::vector<int>& tokens) override;
  void drop(uint64_t request) override { states_.erase(request); }

  int live_states() const { return int(states_.size()); }

 private:
  const model::Qwen3Model& model_;
  model::AttentionFn attend_;
  std::unordered_map<uint64_t, model::KvState> states_;
};

}  // namespace fp4kv::engine
