// The one CUDA error check of the production code: a failed CUDA call becomes an
// fp4kv::Error naming what was attempted and the CUDA error. The message is built only on
// failure, so the check costs one comparison on the decode hot path.
#pragma once

#include <cuda_runtime_api.h>

#include <string>
#include <string_view>

#include "fp4kv/core/error.h"

namespace fp4kv::cache {

[[noreturn]] inline void throw_cuda_error(cudaError_t e, std::string_view what) {
  throw Error(std::string(what) + ": " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")");
}

// Throws fp4kv::Error("<what>: <CUDA error>") unless e is cudaSuccess.
inline void cuda_check(cudaError_t e, std::string_view what) {
  if (e != cudaSuccess) [[unlikely]]
    throw_cuda_error(e, what);
}

// Whether a CUDA device is visible; leaves no sticky "no device" error behind.
inline bool cuda_device_visible() {
  int n = 0;
  const bool ok = cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
  if (!ok) (void)cudaGetLastError();
  return ok;
}

// Checks the last kernel launch (configuration errors surface here, not at the launch).
inline void cuda_check_launch(std::string_view what) { cuda_check(cudaGetLastError(), what); }

}  // namespace fp4kv::cache
