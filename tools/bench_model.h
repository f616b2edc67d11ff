// What `fp4kv bench step` and `fp4kv bench e2e` measure on: a model spec, whole on one GPU
// (its weights loaded once and shared by every preset's model) or split over --tensor-parallel
// N GPUs (each preset's model loads its ranks' slices; sizes, floors and budgets are then one
// GPU's: its share of the weights, its KV heads).
#pragma once

#include <algorithm>
#include <memory>
#include <string>

#include "fp4kv/core/error.h"
#include "fp4kv/core/recipe.h"
#include "fp4kv/engine/gpu_model.h"
#include "fp4kv/engine/gpu_weights.h"
#include "fp4kv/engine/tensor_parallel_model.h"
#include "fp4kv/model/tensor_parallel.h"
#include "tools/tensor_parallel_arg.h"

namespace fp4kv::cli {

class BenchModel {
 public:
  // Checks the split (tensor_parallel_arg.h), then loads the whole weights for one GPU.
  BenchModel(const std::string& spec, int ranks) : spec_(spec), ranks_(ranks) {
    check_tensor_parallel(ranks, spec, /*on_gpu=*/true);
    if (ranks == 1) {
      whole_ = std::make_unique<engine::GpuWeights>(engine::GpuWeights::from_spec(spec));
      config_ = whole_->config();
    } else {
      require(model_config_of(spec, &config_), "--model: '" + spec + "' is neither a checkpoint directory nor NAME:random");
    }
    gpu_shape_ = model::rank_attention_config(config_, ranks);
  }

  int ranks() const { return ranks_; }
  const model::Qwen3Config& config() const { return config_; }      // the whole model
  const model::Qwen3Config& gpu_shape() const { return gpu_shape_; }  // one GPU's heads and KV heads
  // One GPU's weight bytes, and those it reads in a step of `batch` rows.
  double weight_bytes() const { return double(engine::GpuWeights::bytes_for(config_, 0, ranks_)); }
  double step_weight_bytes(int batch) const {
    return double(whole_ ? whole_->step_read_bytes(batch)
                         : engine::GpuWeights::step_read_bytes_for(config_, 0, ranks_, batch));
  }
  // One GPU's KV budget: with the whole weights loaded (one GPU), or less a rank's weights
  // (each preset's model loads them).
  long long kv_budget(double utilization) const {
    const long long budget = engine::gpu_kv_budget(utilization);
    return whole_ ? budget : std::max(0LL, budget - (long long)weight_bytes());
  }
  // The engine's model of one preset (random weights: no calibration, keys not smoothed).
  engine::LoadedStepModel make(const Recipe& r, const engine::GpuModelOptions& o) const {
    if (whole_) return {nullptr, std::make_unique<engine::GpuModel>(*whole_, r, nullptr, o)};
    engine::TensorParallelSpec spec;
    spec.model = spec_;
    spec.recipe = r;
    spec.options = o;
    return engine::load_step_model(spec, ranks_);
  }

 private:
  std::string spec_;
  int ranks_;
  std::unique_ptr<engine::GpuWeights> whole_;
  model::Qwen3Config config_, gpu_shape_;
};

}  // namespace fp4kv::cli
