// `--device auto|cpu|cuda` of the commands that run on either engine: one rule, one message.
// auto is the GPU when this build has CUDA and a device is visible, else the CPU; cuda
// without either is an error (never a silent CPU run).
#pragma once

#include <string>

#include "fp4kv/core/error.h"
#ifdef FP4KV_HAVE_CUDA
#include "fp4kv/cache/cuda_check.h"
#endif

namespace fp4kv::cli {

inline bool cuda_device_visible() {
#ifdef FP4KV_HAVE_CUDA
  return cache::cuda_device_visible();
#else
  return false;
#endif
}

// Whether `device` (the --device value) means the GPU engine.
inline bool use_gpu(const std::string& device) {
  require(device == "auto" || device == "cpu" || device == "cuda",
          "--device must be auto, cpu or cuda, got '" + device + "'");
  if (device == "cpu") return false;
#ifdef FP4KV_HAVE_CUDA
  const bool visible = cuda_device_visible();
  require(visible || device == "auto", "--device cuda: no CUDA device is visible");
  return visible;
#else
  require(device == "auto", "--device cuda: this build has no CUDA (nvcc was not found at configure time)");
  return false;
#endif
}

}  // namespace fp4kv::cli
