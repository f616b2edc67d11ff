// What runs the GPU engine's steps: one GPU (GpuModel) or a tensor-parallel group
// (TensorParallelModel, which gives every rank's GpuModel the same call and answers with
// rank 0's result). The backends, generators and benchmarks drive this interface, so
// `--tensor-parallel N` changes what is built, not the code that drives it.
//
// The calls and their contracts are GpuModel's (gpu_model.h); this file only names them.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <vector>

#include "fp4kv/core/sampling_rule.h"
#include "fp4kv/model/qwen3_config.h"

namespace fp4kv::engine {

struct GpuModelOptions;
struct StepRows;
struct StepProfile;

// Tokens per call of fill_random_tokens' writes.
inline constexpr int kFillChunkTokens = 4096;

class StepModel {
 public:
  virtual ~StepModel() = default;

  virtual const model::Qwen3Config& config() const = 0;
  virtual const GpuModelOptions& options() const = 0;
  virtual int max_pages() const = 0;
  virtual int num_blocks() const = 0;

  virtual void step(const StepRows& rows) = 0;
  virtual void prepare_steps(int max_batch) = 0;
  virtual void prefill(const std::vector<int32_t>& tokens, int start, const std::vector<int32_t>& block_row) = 0;
  virtual std::vector<float> read_logits() const = 0;
  virtual std::vector<int32_t> sample(const std::vector<SamplingRow>& params) = 0;
  virtual void release(int32_t first_block) = 0;
  virtual void synchronize() const = 0;
  // The stream steps run on (rank 0's: a tensor-parallel step ends there after its last
  // collective), for timing them with events.
  virtual cudaStream_t stream() const = 0;

  // Benchmarks' controls (never used in serving but for fill_random_tokens' synthetic prompts).
  virtual StepProfile profile_step(const StepRows& rows) = 0;
  virtual void fill_random_tokens(const StepRows& rows, int first, int count, uint64_t seed, int chunk) = 0;
  void fill_random_tokens(const StepRows& rows, int first, int count, uint64_t seed) {
    fill_random_tokens(rows, first, count, seed, kFillChunkTokens);
  }
  void fill_random_context(const StepRows& rows, int context, uint64_t seed) {
    fill_random_tokens(rows, 0, context, seed);
  }
  virtual void set_cache_updates(bool on) = 0;
  virtual void set_cuda_graphs(bool on) = 0;
  virtual bool last_step_replayed() const = 0;
};

}  // namespace fp4kv::engine
