// The one CPU parallel loop of fp4kv (std::thread). Two shapes of the same pool:
// parallel_for hands out indices one at a time (work per index may differ a lot: attention
// heads, windows); parallel_for_chunks cuts a range into one contiguous chunk per thread
// (cheap, uniform elementwise work). Matrix products stay on the calling thread, where
// OpenBLAS runs its own threads: nesting the two would oversubscribe the cores.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <thread>
#include <vector>

namespace fp4kv {

inline int hardware_threads() { return int(std::max(1u, std::thread::hardware_concurrency())); }

// Runs f(i) for i in [0, n) on up to `threads` threads.
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

// Runs f(begin, end) over contiguous chunks of [0, n), one per thread; ranges with fewer
// than 2 * min_chunk items stay on the calling thread (a thread costs more than they do).
template <class F>
void parallel_for_chunks(int64_t n, int64_t min_chunk, const F& f) {
  const int64_t workers = std::min<int64_t>(hardware_threads(), n / std::max<int64_t>(1, min_chunk));
  if (workers <= 1) {
    if (n > 0) f(int64_t(0), n);
    return;
  }
  const int64_t chunk = (n + workers - 1) / workers;
  std::vector<std::thread> threads;
  for (int64_t b = chunk; b < n; b += chunk) threads.emplace_back([&f, b, e = std::min(n, b + chunk)] { f(b, e); });
  f(int64_t(0), std::min(n, chunk));
  for (std::thread& t : threads) t.join();
}

}  // namespace fp4kv
