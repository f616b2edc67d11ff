// CUDA helpers of the tests and benchmarks (not production code): whether a device is
// present, the one error check (FP4KV_CUDA_OK, the production cache::cuda_check with the
// failed expression as its message), the one device-buffer RAII type, and a CUDA-event
// timer (median of many runs).
//
// Invariants: a DeviceBuffer owns one cudaMalloc'd array of size() elements (at least one
// element is allocated, so get() is never null once constructed), zero-filled on
// construction; download() synchronizes the device first, so it sees work queued on any
// stream.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <utility>
#include <vector>

#include "fp4kv/cache/cuda_check.h"

// Throws fp4kv::Error naming the failed expression and the CUDA error.
#define FP4KV_CUDA_OK(expr) ::fp4kv::cache::cuda_check((expr), #expr)

namespace fp4kv::testing {

inline bool have_gpu() { return cache::cuda_device_visible(); }

// First statement of a GPU test (where <gtest/gtest.h> is included): skips without a device.
#define SKIP_WITHOUT_GPU()                                                                 \
  do {                                                                                     \
    if (!::fp4kv::testing::have_gpu()) GTEST_SKIP() << "no CUDA device";                   \
  } while (0)

template <class T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t count) : n_(count) {
    const size_t bytes = std::max<size_t>(1, count) * sizeof(T);
    FP4KV_CUDA_OK(cudaMalloc(reinterpret_cast<void**>(&p_), bytes));
    FP4KV_CUDA_OK(cudaMemset(p_, 0, bytes));
  }
  explicit DeviceBuffer(const std::vector<T>& host) : DeviceBuffer(host.size()) { upload(host); }
  ~DeviceBuffer() { cudaFree(p_); }
  DeviceBuffer(DeviceBuffer&& o) noexcept : p_(std::exchange(o.p_, nullptr)), n_(std::exchange(o.n_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    std::swap(p_, o.p_);
    std::swap(n_, o.n_);
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  T* get() const { return p_; }
  size_t size() const { return n_; }
  size_t bytes() const { return n_ * sizeof(T); }

  // Copies host[0 .. size) to elements [offset, offset + host.size()).
  void upload(const std::vector<T>& host, size_t offset = 0) {
    FP4KV_CUDA_OK(cudaMemcpy(p_ + offset, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice));
  }
  void upload_async(const std::vector<T>& host, cudaStream_t stream) {
    FP4KV_CUDA_OK(cudaMemcpyAsync(p_, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice, stream));
  }
  // Sets every byte to `value` (0xFF poisons float outputs with NaN).
  void fill_bytes(int value) { FP4KV_CUDA_OK(cudaMemset(p_, value, bytes())); }
  std::vector<T> download() const {
    std::vector<T> host(n_);
    FP4KV_CUDA_OK(cudaDeviceSynchronize());
    FP4KV_CUDA_OK(cudaMemcpy(host.data(), p_, bytes(), cudaMemcpyDeviceToHost));
    return host;
  }

 private:
  T* p_ = nullptr;
  size_t n_ = 0;
};

// Median time in microseconds of run(i), i = 0 .. runs - 1, each bracketed by CUDA events
// on the default stream (what run enqueues there or on a stream ordered with it).
template <class F>
double median_event_us(int runs, F&& run) {
  std::vector<cudaEvent_t> events(2 * size_t(runs));
  for (auto& e : events) FP4KV_CUDA_OK(cudaEventCreate(&e));
  for (int i = 0; i < runs; ++i) {
    FP4KV_CUDA_OK(cudaEventRecord(events[2 * i]));
    run(i);
    FP4KV_CUDA_OK(cudaEventRecord(events[2 * i + 1]));
  }
  FP4KV_CUDA_OK(cudaDeviceSynchronize());
  FP4KV_CUDA_OK(cudaGetLastError());
  std::vector<float> ms(runs);
  for (int i = 0; i < runs; ++i) FP4KV_CUDA_OK(cudaEventElapsedTime(&ms[i], events[2 * i], events[2 * i + 1]));
  for (auto& e : events) cudaEventDestroy(e);
  std::sort(ms.begin(), ms.end());
  constexpr double kUsPerMs = 1e3;
  return double(ms[runs / 2]) * kUsPerMs;
}

// GPU time a benchmark point runs before it is timed, and the runs that takes at a median of
// `us` each (at least one, at most kMaxWarmupRuns). A fixed three runs were not enough: right
// after a sweep point that had freed a 34-GB cache (BF16, 128K context, batch 64), the next
// point's first 13 runs (47 ms) were 17 % slower than the rest on an H100, and a median of 15
// timed runs fell on them (docs/PERF.md, "Warm-up by time").
inline constexpr double kWarmupSeconds = 0.2;
inline constexpr int kMaxWarmupRuns = 5000;
inline int warm_up_runs(double us) {
  return int(std::clamp(std::ceil(kWarmupSeconds * 1e6 / std::max(us, 1.0)), 1.0, double(kMaxWarmupRuns)));
}

// Runs run(i) before a point is timed: three runs, then warm_up_runs of their median; returns
// the next i for the timed runs.
template <class F>
int warm_up(F&& run) {
  constexpr int kWarmupRuns = 3;
  const int more = warm_up_runs(median_event_us(kWarmupRuns, run));
  for (int i = 0; i < more; ++i) run(kWarmupRuns + i);
  FP4KV_CUDA_OK(cudaDeviceSynchronize());
  return kWarmupRuns + more;
}

}  // namespace fp4kv::testing
