// Kernel attributes (the dynamic shared-memory limit) belong to a device, and a stream
// capture forbids setting them: `once_per_device<Set>()` runs Set() at its first call on each
// device (the current one; KvCache's constructor makes that call, outside any capture) and
// returns its result at every later call there. Later calls (every eager launch makes one)
// cost a device query and an atomic load. Thread-safe: tensor-parallel ranks build their
// caches on their own threads and devices at once.
#pragma once

#include <cuda_runtime_api.h>

#include <atomic>
#include <mutex>

namespace fp4kv::cache {

inline constexpr int kMaxRememberedDevices = 64;  // past these, Set() runs at every call

template <cudaError_t (*Set)()>
cudaError_t once_per_device() {
  static std::atomic<int> results[kMaxRememberedDevices];  // per device: 0 before Set(), else its result + 1
  static std::mutex first_call;
  int device = 0;
  if (const cudaError_t e = cudaGetDevice(&device); e != cudaSuccess) return e;
  if (device >= kMaxRememberedDevices) return Set();
  if (const int r = results[device].load(std::memory_order_acquire)) return cudaError_t(r - 1);
  std::lock_guard<std::mutex> lock(first_call);
  int r = results[device].load(std::memory_order_relaxed);
  if (r == 0) {
    r = int(Set()) + 1;
    results[device].store(r, std::memory_order_release);
  }
  return cudaError_t(r - 1);
}

}  // namespace fp4kv::cache
