#include "fp4kv/engine/cpu_backend.h"

#include <string>
#include <utility>

#include "fp4kv/core/error.h"

namespace fp4kv::engine {

CpuBackend::CpuBackend(const model::Qwen3Model& model, model::AttentionFn attend)
    : model_(model), attend_(std::move(attend)) {}

std::vector<float> CpuBackend::prefill(uint64_t request, const std::vector<int>& tokens) {
  require(!tokens.empty(), "CpuBackend::prefill: no tokens for request " + std::to_string(request));
  model::KvState& state = states_[request];
  // A fresh state runs from position 0 exactly as the CPU generator's prompt prefill does.
  const model::KvState* prefix = state.length > 0 ? &state : nullptr;
  return model_.last_logits(prefix, tokens, attend_, &state);
}

std::vector<float> CpuBackend::decode(const std::vector<uint64_t>& requests, const std::vector<int>& tokens) {
  require(requests.size() == tokens.size(), "CpuBackend::decode: " + std::to_string(requests.size()) +
                                                " requests but " + std::to_string(tokens.size()) + " tokens");
  const size_t vocab = size_t(vocab_size());
  std::vector<float> rows(requests.size() * vocab);
  for (size_t i = 0; i < requests.size(); ++i) {
    const auto it = states_.find(requests[i]);
    require(it != states_.end() && it->second.length > 0,
            "CpuBackend::decode: request " + std::to_string(requests[i]) + " has no state");
    const std::vector<float> logits = model_.last_logits(&it->second, {tokens[i]}, attend_, &it->second);
    std::copy(logits.begin(), logits.end(), rows.begin() + long(i * vocab));
  }
  return rows;
}

}  // namespace fp4kv::engine
