// What `fp4kv bench step` and `fp4kv bench e2e` share: the median time of a GPU engine step,
// the rows of requests that own consecutive blocks, and the bytes a cache of pages takes.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <vector>

#include "fp4kv/cache/cuda_check.h"
#include "fp4kv/cache/layout.h"
#include "fp4kv/core/recipe.h"
#include "fp4kv/engine/gpu_model.h"
#include "fp4kv/testing/cuda_testing.h"

namespace fp4kv::cli {

// Steps run before a timing: the first captures the step's graph and tunes its GEMMs.
inline constexpr int kWarmupSteps = 3;
// Seed of the random K/V a benchmark fills its cache with (speed does not depend on it).
inline constexpr uint64_t kFillSeed = 7;

// Median of `runs` steps of `rows`, each bracketed by CUDA events on the model's stream.
inline double median_step_us(engine::StepModel& m, const engine::StepRows& rows, int runs) {
  std::vector<cudaEvent_t> ev(2 * size_t(runs));
  for (auto& e : ev) cache::cuda_check(cudaEventCreate(&e), "bench: event");
  for (int i = 0; i < runs; ++i) {
    cache::cuda_check(cudaEventRecord(ev[2 * i], m.stream()), "bench: event");
    m.step(rows);
    cache::cuda_check(cudaEventRecord(ev[2 * i + 1], m.stream()), "bench: event");
  }
  m.synchronize();
  std::vector<float> ms(runs);
  for (int i = 0; i < runs; ++i) cudaEventElapsedTime(&ms[i], ev[2 * i], ev[2 * i + 1]);
  for (auto& e : ev) cudaEventDestroy(e);
  std::sort(ms.begin(), ms.end());
  return 1e3 * ms[runs / 2];
}

// The steps before a timing: kWarmupSteps, then as many as fill testing::kWarmupSeconds at
// their median (testing::warm_up_runs says why a fixed count was not enough).
inline void warm_up_steps(engine::StepModel& m, const engine::StepRows& rows) {
  const int more = testing::warm_up_runs(median_step_us(m, rows, kWarmupSteps));
  for (int i = 0; i < more; ++i) m.step(rows);
  m.synchronize();
}

// `batch` requests at `context` tokens each, request r owning blocks [r * pages, (r + 1) * pages);
// each row feeds token 1 at position `context` (seq_len context + 1).
inline engine::StepRows rows_at(const engine::StepModel& m, int batch, int context) {
  return engine::consecutive_rows(batch, m.max_pages(), context + 1, /*token=*/1);
}

// Bytes of `pages` cache pages of every layer and KV head for `batch` requests.
inline double cache_bytes(const model::Qwen3Config& c, const Recipe& r, int batch, long long pages) {
  const cache::PageLayout L = cache::PageLayout::make(r.kv, c.head_dim);
  return double(L.bytes) * c.num_key_value_heads * c.num_hidden_layers * double(batch) * double(pages);
}

// Whether a cache of `bytes` fits in the device memory free now, leaving 8 % of it for the
// engine's activations, workspaces and graphs.
inline bool cache_fits_on_device(double bytes) {
  constexpr double kCacheShareOfFree = 0.92;
  size_t free_bytes = 0, total = 0;
  cache::cuda_check(cudaMemGetInfo(&free_bytes, &total), "bench: memory");
  return bytes <= kCacheShareOfFree * double(free_bytes);
}

}  // namespace fp4kv::cli
