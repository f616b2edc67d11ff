// Token sampling on the GPU, one row of FP32 logits [rows][vocab] per CTA, by the rule of
// core/sampling_rule.h (the CPU sampler ref/sampling.h picks the same token for the same
// inputs). The kernel finds each prefix by binary search over (weight bits, index) with one
// fixed sum (or count) per probe, which the CPU sampler follows probe for probe.
//
// Invariants: no host synchronization in run (graph-capturable); the weights workspace is
// owned by the Sampler, allocated once for max_rows x vocab.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "fp4kv/core/sampling_rule.h"

namespace fp4kv::ops {

class Sampler {
 public:
  // Throws fp4kv::Error for max_rows < 1 or vocab < 1, or when the allocation fails.
  Sampler(int max_rows, int vocab);
  ~Sampler();
  Sampler(const Sampler&) = delete;
  Sampler& operator=(const Sampler&) = delete;

  // logits: device [rows][vocab] FP32; params: device [rows]; tokens: device [rows] int32.
  // Throws fp4kv::Error for rows outside [0, max_rows] or null pointers.
  void run(const float* logits, int rows, const SamplingRow* params, int32_t* tokens, cudaStream_t stream) const;

  int max_rows() const { return max_rows_; }
  int vocab() const { return vocab_; }

 private:
  int max_rows_ = 0;
  int vocab_ = 0;
  float* weights_ = nullptr;  // [max_rows][vocab]
};

}  // namespace fp4kv::ops
