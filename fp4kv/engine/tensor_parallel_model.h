// A Qwen3 model split over N tensor-parallel ranks (model/tensor_parallel.h), run as one
// StepModel: each rank is a thread with its own GPU, weights slice (gpu_weights.h) and
// GpuModel; every call is given to all ranks at once and answered with rank 0's result
// (after the LM head's all-gather every rank holds the same logits: rank 0 copies them or
// draws from them, the others only check their step's error flags).
// Rank 0's caller is the scheduler: this object is the broadcast of each step's batch.
//
//   over_gpus   rank r on devices[r], the collectives over NCCL, each batch size's decode
//               step (NCCL calls included) captured in a CUDA graph when options ask.
//   on_one_gpu  N ranks sharing the current GPU through a SameDeviceGroup (eager steps): the
//               check, on one GPU, that the split computes what the whole model does.
//
// Invariants: the ranks make the same calls in the same order (the collectives pair up by
// order). Errors the host can see before a step (bad rows, options) are raised identically by
// every rank, before any collective, and leave the group usable. An error on some ranks only
// (a failed CUDA call) aborts the group's collectives, so no rank waits forever: the call
// throws that error, and every later call says the group failed (build it again).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "fp4kv/core/recipe.h"
#include "fp4kv/engine/device_collective.h"
#include "fp4kv/engine/gpu_model.h"
#include "fp4kv/engine/step_model.h"

namespace fp4kv::engine {

struct TensorParallelSpec {
  std::string model;         // a checkpoint directory or NAME:random (gpu_weights.h)
  uint64_t seed = 1;         // of random weights
  Recipe recipe;
  std::vector<float> mu_k;   // the whole model's key smoothing [layers][kv_heads][head_dim], or empty
  GpuModelOptions options;   // every rank's (collective: set per rank here)
};

class TensorParallelModel final : public StepModel {
 public:
  // Throws fp4kv::Error for a model that does not split over the ranks (what does not divide
  // is named), a device list that is not distinct visible GPUs, no NCCL in the build, or any
  // rank's failure to load or build.
  static std::unique_ptr<TensorParallelModel> over_gpus(const TensorParallelSpec& spec,
                                                        const std::vector<int>& devices);
  static std::unique_ptr<TensorParallelModel> on_one_gpu(const TensorParallelSpec& spec, int ranks);
  ~TensorParallelModel() override;
  TensorParallelModel(const TensorParallelModel&) = delete;
  TensorParallelModel& operator=(const TensorParallelModel&) = delete;

  int ranks() const { return int(ranks_.size()); }
  // Runs fn(r, rank r's model) on every rank's thread at once, as every call of this object
  // does (same failure rules); for work the StepModel calls do not name.
  void for_each_rank(const std::function<void(int rank, GpuModel& model)>& fn);
  // Rank r's model (tests read its cache and slice); use it only between calls of this object.
  GpuModel& rank_model(int r) { return *ranks_[size_t(r)]->model; }
  const GpuWeights& rank_weights(int r) const { return *ranks_[size_t(r)]->weights; }

  const model::Qwen3Config& config() const override { return ranks_[0]->weights->config(); }
  const GpuModelOptions& options() const override { return ranks_[0]->model->options(); }
  int max_pages() const override { return ranks_[0]->model->max_pages(); }
  int num_blocks() const override { return ranks_[0]->model->num_blocks(); }

  void step(const StepRows& rows) override;
  void prepare_steps(int max_batch) override;
  void prefill(const std::vector<int32_t>& tokens, int start, const std::vector<int32_t>& block_row) override;
  std::vector<float> read_logits() const override;
  std::vector<int32_t> sample(const std::vector<SamplingRow>& params) override;
  void release(int32_t first_block) override;
  void synchronize() const override;
  cudaStream_t stream() const override { return ranks_[0]->model->stream(); }
  StepProfile profile_step(const StepRows& rows) override;
  void fill_random_tokens(const StepRows& rows, int first, int count, uint64_t seed, int chunk) override;
  using StepModel::fill_random_tokens;
  void set_cache_updates(bool on) override;
  void set_cuda_graphs(bool on) override;
  bool last_step_replayed() const override { return ranks_[0]->model->last_step_replayed(); }

 private:
  class Worker;  // a rank's thread
  struct Rank {
    std::unique_ptr<GpuWeights> weights;
    std::unique_ptr<GpuModel> model;
    std::unique_ptr<Worker> worker;
  };

  explicit TensorParallelModel(std::unique_ptr<DeviceGroup> group);
  void build(const TensorParallelSpec& spec);
  // Runs fn(r) on every rank r's thread (its device current) at once; waits for all; rethrows
  // the lowest rank's own error (see the file comment for a failure on some ranks only).
  void on_ranks(const std::function<void(int rank)>& fn) const;

  std::unique_ptr<DeviceGroup> group_;
  std::vector<std::unique_ptr<Rank>> ranks_;
  mutable std::string failed_;  // why the group is unusable (empty: it is not)
};

// The engine's model of `spec` on this machine: `ranks` 1 is one GPU (the current device: the
// whole weights and a GpuModel over them), more are GPUs 0 .. ranks - 1 over NCCL. Throws
// fp4kv::Error for ranks < 1, fewer visible GPUs than ranks, no NCCL in the build, or a model
// that does not split.
struct LoadedStepModel {
  std::unique_ptr<GpuWeights> weights;  // one GPU only
  std::unique_ptr<StepModel> model;
};
LoadedStepModel load_step_model(const TensorParallelSpec& spec, int ranks);

}  // namespace fp4kv::engine
