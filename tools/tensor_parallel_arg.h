// `--tensor-parallel N` of generate, serve and bench e2e: the model split over N GPUs of a host
// (model/tensor_parallel.h: heads, KV heads, MLP channels, experts and vocabulary divided by
// N, partial sums all-reduced over NCCL). This version's engines run one GPU: N = 1 runs; for
// N > 1 the model is checked first (what does not divide is named) and the run is refused
// with the reason, never silently run on one GPU.
#pragma once

#include <filesystem>
#include <string>

#include "fp4kv/core/error.h"
#include "fp4kv/model/qwen3_config.h"
#include "fp4kv/model/tensor_parallel.h"
#ifdef FP4KV_HAVE_CUDA
#include "fp4kv/engine/gpu_weights.h"
#endif

namespace fp4kv::cli {

// The config of a checkpoint directory or (builds with CUDA) a NAME:random shape; false when
// neither is known here (the command's own loading reports that).
inline bool model_config_of(const std::string& spec, model::Qwen3Config* config) {
  if (std::filesystem::is_directory(spec)) {
    *config = model::Qwen3Config::load_dir(spec);
    return true;
  }
#ifdef FP4KV_HAVE_CUDA
  std::string shape;
  if (engine::is_random_model_spec(spec, &shape)) {
    *config = engine::known_shape(shape);
    return true;
  }
#endif
  return false;
}

inline void require_one_rank(int ranks, const std::string& model_spec) {
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
#ifdef FP4KV_HAVE_NCCL
  throw Error(flag + ": this version's GPU engine runs on one GPU (the multi-GPU decode step over NCCL is not "
              "built yet); run without --tensor-parallel");
#else
  throw Error(flag + ": tensor parallelism runs the GPU engine over NCCL, and this build has no NCCL (it was not "
              "found at configure time); run without --tensor-parallel");
#endif
}

}  // namespace fp4kv::cli
