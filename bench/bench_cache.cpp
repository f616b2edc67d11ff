// Timing of the cache work: prefill-write of 1K and 8K-token chunks and the
// cache part of a decode step (control + append for every layer + promotion) at batch 1,
// 16, 64, Qwen3-4B shapes (36 layers, 8 KV heads, d = 128). CUDA events; the decode step
// is a captured CUDA graph, replayed with the sequence lengths advancing every step.
//   usage: fp4kv_cache_bench [recipe=nvfp4] [context=1000]
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "fp4kv/cache/kv_cache.h"
#include "fp4kv/testing/cuda_testing.h"

using namespace fp4kv;
using namespace fp4kv::cache;

namespace {

float* random_device(size_t n, unsigned seed) {
  std::vector<float> h(n);
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (auto& x : h) x = nd(rng);
  float* d = nullptr;
  FP4KV_CUDA_OK(cudaMalloc((void**)&d, n * sizeof(float)));
  FP4KV_CUDA_OK(cudaMemcpy(d, h.data(), n * sizeof(float), cudaMemcpyHostToDevice));
  return d;
}

}  // namespace

int run(int argc, char** argv) {
  const std::string spec = argc > 1 ? argv[1] : "nvfp4";
  const int context = argc > 2 ? std::stoi(argv[2]) : 1000;
  const int L = 36, H = 8, d = 128, max_pages = (context + 256) / 128 + 1;
  const Recipe recipe = parse_recipe(spec);
  cudaStream_t s;
  FP4KV_CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaEvent_t e0, e1;
  FP4KV_CUDA_OK(cudaEventCreate(&e0));
  FP4KV_CUDA_OK(cudaEventCreate(&e1));
  std::printf("recipe %s, %d layers, %d KV heads, d %d\n", recipe.name.c_str(), L, H, d);

  // ---- prefill: 1024-token chunks (one CTA per page part: latency) and 8192-token chunks
  // (several waves: throughput), all layers ----
  for (const int n : {1024, 8192}) {
    const int pages = n / 128;
    KvCacheConfig c;
    c.layers = L;
    c.kv_heads = H;
    c.head_dim = d;
    c.num_blocks = 8 * pages;
    c.max_slots = 8;
    c.max_batch = 1;
    c.max_pages = pages;
    KvCache cache(c, recipe);
    float* k = random_device(size_t(n) * H * d, 1);
    float* v = random_device(size_t(n) * H * d, 2);
    std::vector<int32_t> rows(size_t(8) * pages);
    for (size_t i = 0; i < rows.size(); ++i) rows[i] = int32_t(i);
    int32_t* drows = nullptr;
    FP4KV_CUDA_OK(cudaMalloc((void**)&drows, rows.size() * 4));
    FP4KV_CUDA_OK(cudaMemcpy(drows, rows.data(), rows.size() * 4, cudaMemcpyHostToDevice));
    std::vector<float> times;
    for (int rep = 0; rep < 12; ++rep) {
      const int r = rep % 8;  // request r owns blocks pages * r .. pages * (r + 1) - 1
      FP4KV_CUDA_OK(cudaEventRecord(e0, s));
      cache.begin_prefill(drows + pages * r, 0, n, s);
      for (int l = 0; l < L; ++l) cache.prefill(l, k, v, s);
      FP4KV_CUDA_OK(cudaEventRecord(e1, s));
      FP4KV_CUDA_OK(cudaEventSynchronize(e1));
      float ms = 0;
      FP4KV_CUDA_OK(cudaEventElapsedTime(&ms, e0, e1));
      if (rep >= 2) times.push_back(ms);
      cache.release(rows[size_t(pages) * r], s);
    }
    std::sort(times.begin(), times.end());
    const double us = 1e3 * times[times.size() / 2];
    std::printf("prefill write, %d tokens x %d layers: median %.1f us (%.2f us per layer, %.1f M tokens/s)\n", n, L, us,
                us / L, n / us);
    cudaFree(k);
    cudaFree(v);
    cudaFree(drows);
  }

  // ---- decode steps ----
  for (int batch : {1, 16, 64}) {
    KvCacheConfig c;
    c.layers = L;
    c.kv_heads = H;
    c.head_dim = d;
    c.num_blocks = batch * max_pages;
    c.max_slots = batch;
    c.max_batch = batch;
    c.max_pages = max_pages;
    KvCache cache(c, recipe);
    std::vector<int32_t> bt(size_t(batch) * max_pages);
    for (size_t i = 0; i < bt.size(); ++i) bt[i] = int32_t(i);
    int32_t *dbt = nullptr, *dsl = nullptr, *hsl = nullptr;
    FP4KV_CUDA_OK(cudaMalloc((void**)&dbt, bt.size() * 4));
    FP4KV_CUDA_OK(cudaMalloc((void**)&dsl, batch * 4));
    FP4KV_CUDA_OK(cudaMallocHost((void**)&hsl, batch * 4));
    FP4KV_CUDA_OK(cudaMemcpy(dbt, bt.data(), bt.size() * 4, cudaMemcpyHostToDevice));
    // Prefill every row to `context` tokens (lengths staggered by row when asked).
    float* pk = random_device(size_t(context) * H * d, 3);
    float* pv = random_device(size_t(context) * H * d, 4);
    for (int r = 0; r < batch; ++r)
      for (int l = 0; l < L; ++l) cache.prefill(l, dbt + r * max_pages, 0, context, pk, pv, s);
    std::vector<float*> k(L), v(L);
    for (int l = 0; l < L; ++l) {
      k[l] = random_device(size_t(batch) * H * d, 10 + l);
      v[l] = random_device(size_t(batch) * H * d, 100 + l);
    }
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    FP4KV_CUDA_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    cache.begin_step(dbt, dsl, batch, max_pages, s);
    for (int l = 0; l < L; ++l) cache.append(l, k[l], v[l], s);
    cache.end_step(s);
    FP4KV_CUDA_OK(cudaStreamEndCapture(s, &graph));
    FP4KV_CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
    // Lock-step lengths context+1, ...: every row promotes in the same step once per 128.
    std::vector<float> plain, promoting;
    for (int step = 0; step < 200; ++step) {
      const int n = context + 1 + step;
      for (int r = 0; r < batch; ++r) hsl[r] = n;
      FP4KV_CUDA_OK(cudaMemcpyAsync(dsl, hsl, batch * 4, cudaMemcpyHostToDevice, s));
      FP4KV_CUDA_OK(cudaEventRecord(e0, s));
      FP4KV_CUDA_OK(cudaGraphLaunch(exec, s));
      FP4KV_CUDA_OK(cudaEventRecord(e1, s));
      FP4KV_CUDA_OK(cudaEventSynchronize(e1));
      float ms = 0;
      FP4KV_CUDA_OK(cudaEventElapsedTime(&ms, e0, e1));
      if (step >= 3) (n % 128 == 0 ? promoting : plain).push_back(ms);
    }
    std::sort(plain.begin(), plain.end());
    std::sort(promoting.begin(), promoting.end());
    const float med = plain.empty() ? 0 : plain[plain.size() / 2];
    const float pro = promoting.empty() ? 0 : promoting[promoting.size() / 2];
    std::printf("decode step cache work, batch %2d: median %.1f us (control + %d appends + promotion check); "
                "step that promotes every row: %.1f us; amortized %.1f us/step; flags %d\n",
                batch, 1e3 * med, L, 1e3 * pro, 1e3 * (med * 127 + pro) / 128, cache.error_flags());
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    for (int l = 0; l < L; ++l) {
      cudaFree(k[l]);
      cudaFree(v[l]);
    }
    cudaFree(pk);
    cudaFree(pv);
    cudaFree(dbt);
    cudaFree(dsl);
    cudaFreeHost(hsl);
  }
  return 0;
}

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fp4kv_cache_bench: %s\n", e.what());
    return 1;
  }
}
