// Text generation on the GPU engine (gpu_model.h): one request, its prompt fed as decode
// steps into the recipe's cache, then one token per step drawn by the GPU sampler (the rule
// of core/sampling_rule.h, the same draws as the CPU generator for the same logits).
//
// Invariants: the request owns blocks 0 .. pages - 1 of the model's cache and releases its
// slot at the end; the options are checked as the CPU generator checks them, and the
// sequence must fit the model's max_context.
#pragma once

#include <functional>
#include <vector>

#include "fp4kv/engine/cpu_generator.h"
#include "fp4kv/engine/gpu_model.h"

namespace fp4kv::engine {

GenerateStats generate_on_gpu(GpuModel& model, const std::vector<int>& prompt, const GenerateOptions& options,
                              const std::function<void(int token)>& on_token);

// Teacher-forced logits of `tokens` through the engine: the first token is the first step,
// every later one a decode step with the text's token forced; returns [tokens.size()][vocab]
// (row t: the distribution after tokens[0..t]). Rows of `batch` sequences run as one step
// each, so sequences must have equal lengths. The evaluation path of `fp4kv eval --device
// cuda`; `on_step(t, logits[batch][vocab])` receives each step's logits instead of storing them
// when given.
void forced_logits_on_gpu(GpuModel& model, const std::vector<std::vector<int>>& sequences,
                          const std::function<void(int position, const std::vector<float>& logits)>& on_step);

}  // namespace fp4kv::engine
