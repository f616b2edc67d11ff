#include "fp4kv/engine/gpu_backend.h"

#include <chrono>
#include <string>

#include "fp4kv/core/error.h"

namespace fp4kv::engine {

GpuBackend::GpuBackend(StepModel& model, bool synthetic_prefill)
    : model_(model), synthetic_prefill_(synthetic_prefill), blocks_(model.num_blocks()) {}

void GpuBackend::append_table(uint64_t request, std::vector<int32_t>& tables) const {
  const std::vector<int>& held = blocks_.blocks(request);
  for (int p = 0; p < model_.max_pages(); ++p) tables.push_back(p < int(held.size()) ? held[p] : held[0]);
}

StepRows GpuBackend::table_of(uint64_t request) const {
  StepRows rows;
  append_table(request, rows.block_tables);
  rows.tokens = {0};
  rows.seq_lens = {1};
  return rows;
}

// Every step: the message is built only on failure.
void GpuBackend::require_fits(uint64_t request, long long end) const {
  if (end > model_.options().max_context)
    throw Error("GpuBackend: request " + std::to_string(request) + " would pass the engine's max_context of " +
                std::to_string(model_.options().max_context) + " tokens");
}

void GpuBackend::add_row(uint64_t request, int token, StepRows& rows) {
  int& length = lengths_[request];
  require_fits(request, (long long)length + 1);
  blocks_.reserve(request, length + 1);
  ++length;
  rows.tokens.push_back(token);
  rows.seq_lens.push_back(length);
  append_table(request, rows.block_tables);
}

std::vector<float> GpuBackend::prefill(uint64_t request, const std::vector<int>& tokens) {
  run_prefill(request, tokens);
  return model_.read_logits();
}

TokenDraw GpuBackend::prefill_and_draw(uint64_t request, const std::vector<int>& tokens, const DrawSpec& draw) {
  run_prefill(request, tokens);
  return draw_last_step({draw})[0];
}

std::vector<TokenDraw> GpuBackend::draw_last_step(const std::vector<DrawSpec>& draws) {
  std::vector<SamplingRow> rows;
  bool want_logprobs = false;
  for (const DrawSpec& d : draws) {
    rows.push_back(d.sampling);
    want_logprobs |= d.logprobs >= 0;
  }
  const std::vector<int32_t> drawn = model_.sample(rows);
  std::vector<TokenDraw> out(draws.size());
  std::vector<float> logits;
  if (want_logprobs) logits = model_.read_logits();
  const int vocab = vocab_size();
  for (size_t i = 0; i < draws.size(); ++i) {
    out[i].token = drawn[i];
    if (draws[i].logprobs >= 0)
      out[i].logprobs = token_logprobs(logits.data() + i * size_t(vocab), vocab, drawn[i], draws[i].logprobs);
  }
  return out;
}

std::vector<float> GpuBackend::decode(const std::vector<uint64_t>& requests, const std::vector<int>& tokens) {
  run_decode(requests, tokens);
  return model_.read_logits();
}

std::vector<TokenDraw> GpuBackend::decode_and_draw(const std::vector<uint64_t>& requests, const std::vector<int>& tokens,
                                                   const std::vector<DrawSpec>& draws) {
  run_decode(requests, tokens);
  return draw_last_step(draws);
}

void GpuBackend::run_prefill(uint64_t request, const std::vector<int>& tokens) {
  require(!tokens.empty(), "GpuBackend::prefill: no tokens");
  if (synthetic_prefill_ && tokens.size() > 1) {
    const int first = lengths_[request], count = int(tokens.size()) - 1;
    require_fits(request, (long long)first + count + 1);  // and the last token's step
    blocks_.reserve(request, first + count);
    const auto t0 = std::chrono::steady_clock::now();
    model_.fill_random_tokens(table_of(request), first, count, request);
    synthetic_fill_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    lengths_[request] = first + count;
    StepRows rows;
    add_row(request, tokens.back(), rows);
    model_.step(rows);
    return;
  }
  if (model_.options().prefill_chunk > 0) {  // the tensor-core prefill, chunk by chunk
    int& length = lengths_[request];
    const long long end = (long long)length + (long long)tokens.size();
    require_fits(request, end);
    blocks_.reserve(request, int(end));
    std::vector<int32_t> row;
    append_table(request, row);
    model_.prefill(std::vector<int32_t>(tokens.begin(), tokens.end()), length, row);
    length = int(end);
    return;
  }
  for (int token : tokens) {
    StepRows rows;
    add_row(request, token, rows);
    model_.step(rows);
  }
}

void GpuBackend::run_decode(const std::vector<uint64_t>& requests, const std::vector<int>& tokens) {
  require(requests.size() == tokens.size() && !requests.empty(),
          "GpuBackend::decode: one token per request, at least one request");
  StepRows rows;
  for (size_t i = 0; i < requests.size(); ++i) {
    if (lengths_.count(requests[i]) == 0)
      throw Error("GpuBackend::decode: request " + std::to_string(requests[i]) + " has no state (prefill it first)");
    add_row(requests[i], tokens[i], rows);
  }
  model_.step(rows);
}

void GpuBackend::drop(uint64_t request) {
  if (lengths_.erase(request) == 0) return;
  if (blocks_.held(request) > 0) {
    model_.release(blocks_.blocks(request)[0]);
    blocks_.release(request);
  }
}

}  // namespace fp4kv::engine
