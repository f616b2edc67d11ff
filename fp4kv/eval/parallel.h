// A minimal parallel-for over an index range with std::thread (the CPU paths of the eval
// layer use every core; BLAS calls inside run single-threaded, see window_attention.cpp).
#pragma once

#include <algorithm>
#include <atomic>
#include <thread>
#include <vector>

namespace fp4kv::eval {

inline int hardware_threads() { return std::max(1u, std::thread::hardware_concurrency()); }

// Runs f(i) for i in [0, n) on up to `threads` threads; indices are handed out one by one
// (work per index may differ a lot).
template <typename F>
void parallel_for(int n, F&& f, int threads = hardware_threads()) {
  threads = std::max(1, std::min(threads, n));
  if (threads == 1) {
    for (int i = 0; i < n; ++i) f(i);
    return;
  }
  std::atomic<int> next{0};
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t)
    pool.emplace_back([&] {
      for (int i = next++; i < n; i = next++) f(i);
    });
  for (auto& th : pool) th.join();
}

}  // namespace fp4kv::eval
