// Host helpers of the standalone micro-benchmarks that time a captured CUDA graph: an error
// check that ends the program, the end of a stream capture into an executable graph, and the
// median time of its replays by CUDA events (warm-up replays first).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

namespace fp4kv::bench {

inline void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

// Ends the capture begun on s and instantiates it.
inline cudaGraphExec_t end_capture(cudaStream_t s) {
  cudaGraph_t g;
  check(cudaStreamEndCapture(s, &g), "end capture");
  cudaGraphExec_t e;
  check(cudaGraphInstantiate(&e, g, 0), "instantiate");
  check(cudaGraphDestroy(g), "destroy graph");
  return e;
}

// Median microseconds of one replay of e on s over `replays` timed replays.
inline double median_replay_us(cudaGraphExec_t e, cudaStream_t s, int replays) {
  constexpr int kWarmups = 3;
  cudaEvent_t t0, t1;
  check(cudaEventCreate(&t0), "event");
  check(cudaEventCreate(&t1), "event");
  for (int w = 0; w < kWarmups; ++w) check(cudaGraphLaunch(e, s), "warm-up replay");
  std::vector<double> us;
  for (int r = 0; r < replays; ++r) {
    check(cudaEventRecord(t0, s), "record");
    check(cudaGraphLaunch(e, s), "replay");
    check(cudaEventRecord(t1, s), "record");
    check(cudaEventSynchronize(t1), "sync");
    float ms = 0.0f;
    check(cudaEventElapsedTime(&ms, t0, t1), "elapsed");
    us.push_back(ms * 1e3);
  }
  check(cudaEventDestroy(t0), "event");
  check(cudaEventDestroy(t1), "event");
  std::sort(us.begin(), us.end());
  return us[us.size() / 2];
}

}  // namespace fp4kv::bench
