#include "fp4kv/engine/gpu_backend.h"

#include <string>

#include "fp4kv/core/error.h"

namespace fp4kv::engine {

GpuBackend::GpuBackend(GpuModel& model) : model_(model), blocks_(model.num_blocks()) {}

void GpuBackend::add_row(uint64_t request, int token, StepRows& rows) {
  int& length = lengths_[request];
  require(length < model_.options().max_context,
          "GpuBackend: request " + std::to_string(request) + " would pass the engine's max_context of " +
              std::to_string(model_.options().max_context) + " tokens");
  blocks_.reserve(request, length + 1);
  ++length;
  const std::vector<int>& held = blocks_.blocks(request);
  rows.tokens.push_back(token);
  rows.seq_lens.push_back(length);
  for (int p = 0; p < model_.max_pages(); ++p) rows.block_tables.push_back(p < int(held.size()) ? held[p] : held[0]);
}

std::vector<float> GpuBackend::prefill(uint64_t request, const std::vector<int>& tokens) {
  require(!tokens.empty(), "GpuBackend::prefill: no tokens");
  for (int token : tokens) {
    StepRows rows;
    add_row(request, token, rows);
    model_.step(rows);
  }
  return model_.read_logits();
}

std::vector<float> GpuBackend::decode(const std::vector<uint64_t>& requests, const std::vector<int>& tokens) {
  require(requests.size() == tokens.size() && !requests.empty(),
          "GpuBackend::decode: one token per request, at least one request");
  StepRows rows;
  for (size_t i = 0; i < requests.size(); ++i) {
    require(lengths_.count(requests[i]) != 0,
            "GpuBackend::decode: request " + std::to_string(requests[i]) + " has no state (prefill it first)");
    add_row(requests[i], tokens[i], rows);
  }
  model_.step(rows);
  return model_.read_logits();
}

void GpuBackend::drop(uint64_t request) {
  if (lengths_.erase(request) == 0) return;
  if (blocks_.held(request) > 0) {
    model_.release(blocks_.blocks(request)[0]);
    blocks_.release(request);
  }
}

}  // namespace fp4kv::engine
