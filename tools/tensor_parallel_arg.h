// `--tensor-parallel N` of generate, serve and bench e2e: the model split over GPUs 0 .. N-1
// of this host (engine/tensor_parallel_model.h: heads, KV heads, MLP channels, experts and
// vocabulary divided by N, partial sums all-reduced over NCCL). Checked before anything
// loads: N >= 1; for N > 1 a model that divides by N (what does not is named), the GPU engine
// (not --device cpu), NCCL in the build and N visible GPUs; each refusal says why.
#pragma once

#include <filesystem>
#include <string>

#include "fp4kv/core/error.h"
#include "fp4kv/model/qwen3_config.h"
#include "fp4kv/model/tensor_parallel.h"
#ifdef FP4KV_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "fp4kv/engine/device_collective.h"
#include "fp4kv/engine/gpu_weights.h"
#endif

namespace fp4kv::cli {

// The config of a checkpoint directory or (builds with CUDA) a NAME:random shape (as random
// weights have it: no position limit); false when neither is known here (the command's own
// loading reports that).
inline bool model_config_of(const std::string& spec, model::Qwen3Config* config) {
  if (std::filesystem::is_directory(spec)) {
    *config = model::Qwen3Config::load_dir(spec);
    return true;
  }
#ifdef FP4KV_HAVE_CUDA
  std::string shape;
  if (engine::is_random_model_spec(spec, &shape)) {
    *config = engine::config_of_spec(spec);
    return true;
  }
#endif
  return false;
}

// `on_gpu`: whether the command runs the GPU engine.
inline void check_tensor_parallel(int ranks, const std::string& model_spec, bool on_gpu) {
  require(ranks >= 1, "--tensor-parallel: " + std::to_string(ranks) + " ranks (at least 1)");
  if (ranks == 1) return;
  const std::string flag = "--tensor-parallel " + std::to_string(ranks);
  model::Qwen3Config config;
  if (model_config_of(model_spec, &config)) {
    try {
      (void)model::tp_slice(config, 0, ranks);
    } catch (const Error& e) {
      throw Error(flag + ": " + model_spec + " cannot be split: " + e.what());
    }
  }
  require(on_gpu, flag + ": tensor parallelism splits the GPU engine over GPUs; the CPU engine runs on one machine");
#ifdef FP4KV_HAVE_CUDA
  require(engine::have_nccl(), flag + ": tensor parallelism runs over NCCL, and this build has no NCCL (it was not "
                                      "found at configure time); run without --tensor-parallel");
  int visible = 0;
  if (cudaGetDeviceCount(&visible) != cudaSuccess) visible = 0;
  require(visible >= ranks,
          flag + ": needs " + std::to_string(ranks) + " GPUs, " + std::to_string(visible) + " visible");
#endif
}

}  // namespace fp4kv::cli
