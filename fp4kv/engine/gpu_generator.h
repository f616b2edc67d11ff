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

GenerateStats generate_on_gpu(StepModel& model, const std::vector<int>& prompt, const GenerateOptions& options,
                              const std::function<void(int token)>& on_token);

// Teacher-forced logits through the engine: sequence s's first token is its first step,
// every later one a decode step with the text's token forced (cache writes, promotions and
// the decode kernel exactly as in serving). Up to max_batch sequences (any lengths) run
// together, one row each, while they last: step t has the rows of the sequences longer than
// t. on_step(t, rows, logits) receives the step's sequence indices and logits
// [rows.size()][vocab] (row i: the distribution after sequences[rows[i]][0..t]). The
// evaluation path of `fp4kv eval --device cuda`.
void forced_logits_on_gpu(
    StepModel& model, const std::vector<std::vector<int>>& sequences,
    const std::function<void(int position, const std::vector<int>& rows, const std::vector<float>& logits)>& on_step);

// The same, collecting every sequence's logits [length][vocab]; more sequences than
// max_batch run in consecutive groups.
std::vector<std::vector<float>> forced_logits_on_gpu(StepModel& model, const std::vector<std::vector<int>>& sequences);

}  // namespace fp4kv::engine
