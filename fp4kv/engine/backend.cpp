#include "fp4kv/engine/backend.h"

#include "fp4kv/ref/sampling.h"

namespace fp4kv::engine {

std::vector<int> Backend::decode_and_draw(const std::vector<uint64_t>& requests, const std::vector<int>& tokens,
                                          const std::vector<SamplingRow>& draws) {
  const std::vector<float> logits = decode(requests, tokens);
  const size_t vocab = size_t(vocab_size());
  std::vector<int> out;
  for (size_t i = 0; i < requests.size(); ++i) out.push_back(ref::sample_token(logits.data() + i * vocab, int(vocab), draws[i]));
  return out;
}

int Backend::prefill_and_draw(uint64_t request, const std::vector<int>& tokens, const SamplingRow& draw) {
  const std::vector<float> logits = prefill(request, tokens);
  return ref::sample_token(logits.data(), vocab_size(), draw);
}

}  // namespace fp4kv::engine
