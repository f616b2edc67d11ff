// Kernel attributes (the dynamic shared-memory limit) belong to a device, and a stream
// capture forbids setting them: `once_per_device<Set>()` runs Set() at its first call on each
// device (the current one; KvCache's constructor makes that call, outside any capture) and
// returns its result at every later call there. Thread-safe: tensor-parallel ranks build
// their caches on their own threads and devices at once.
#pragma once

#include <cuda_runtime_api.h>

#include <map>
#include <mutex>

namespace fp4kv::cache {

template <cudaError_t (*Set)()>
cudaError_t once_per_device() {
  static std::mutex mutex;
  static std::map<int, cudaError_t> results;  // per device
  int device = 0;
  if (const cudaError_t e = cudaGetDevice(&device); e != cudaSuccess) return e;
  std::lock_guard<std::mutex> lock(mutex);
  auto it = results.find(device);
  if (it == results.end()) it = results.emplace(device, Set()).first;
  return it->second;
}

}  // namespace fp4kv::cache
