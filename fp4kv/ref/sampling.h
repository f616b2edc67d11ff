// The CPU sampler: the token the sampling rule (core/sampling_rule.h) picks from one row of
// logits, by the GPU kernel's summation order and prefix search, so it equals the GPU
// sampler's choice (ops/sampling.h) bit for bit; the CPU engine draws its tokens with it.
#pragma once

#include <cstdint>

#include "fp4kv/core/sampling_rule.h"

namespace fp4kv::ref {

// The token of logits[0..vocab) under p (temperature <= 0: greedy).
int32_t sample_token(const float* logits, int vocab, const SamplingRow& p);

// What a user may ask for: throws fp4kv::Error naming the field unless temperature is
// finite and >= 0, top_k >= 0 and top_p in (0, 1] (the rule itself accepts any values).
void check_sampling(const SamplingRow& p);

}  // namespace fp4kv::ref
