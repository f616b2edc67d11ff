#include "fp4kv/engine/backend.h"

#include <algorithm>
#include <cmath>

#include "fp4kv/ref/sampling.h"

namespace fp4kv::engine {

TokenLogprobs token_logprobs(const float* logits, int vocab, int token, int top) {
  double m = logits[0];
  for (int i = 1; i < vocab; ++i) m = std::max(m, double(logits[i]));
  double sum = 0;
  for (int i = 0; i < vocab; ++i) sum += std::exp(double(logits[i]) - m);
  const double log_z = m + std::log(sum);
  TokenLogprobs out;
  out.logprob = float(double(logits[token]) - log_z);
  std::vector<int> order(vocab);
  for (int i = 0; i < vocab; ++i) order[i] = i;
  const int k = std::min(std::max(top, 0), vocab);
  std::partial_sort(order.begin(), order.begin() + k, order.end(),
                    [logits](int a, int b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); });
  for (int i = 0; i < k; ++i) out.top.emplace_back(order[i], float(double(logits[order[i]]) - log_z));
  return out;
}

namespace {

TokenDraw draw_on_host(const float* logits, int vocab, const DrawSpec& d) {
  TokenDraw t;
  t.token = ref::sample_token(logits, vocab, d.sampling);
  if (d.logprobs >= 0) t.logprobs = token_logprobs(logits, vocab, t.token, d.logprobs);
  return t;
}

}  // namespace

std::vector<TokenDraw> Backend::decode_and_draw(const std::vector<uint64_t>& requests, const std::vector<int>& tokens,
                                                const std::vector<DrawSpec>& draws) {
  const std::vector<float> logits = decode(requests, tokens);
  const size_t vocab = size_t(vocab_size());
  std::vector<TokenDraw> out;
  for (size_t i = 0; i < requests.size(); ++i) out.push_back(draw_on_host(logits.data() + i * vocab, int(vocab), draws[i]));
  return out;
}

TokenDraw Backend::prefill_and_draw(uint64_t request, const std::vector<int>& tokens, const DrawSpec& draw) {
  const std::vector<float> logits = prefill(request, tokens);
  return draw_on_host(logits.data(), vocab_size(), draw);
}

}  // namespace fp4kv::engine
