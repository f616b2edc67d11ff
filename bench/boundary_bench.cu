// What one kernel boundary of a decode step costs, by the mechanism that orders the two
// kernels. A chain of N small kernels, each reading the whole output of the one before it
// (as a GEMV reads its X) and writing its own slice, captured in a CUDA graph and replayed:
//   plain  - ordinary launches (the stream orders them; no overlap of launch and work);
//   pdl    - programmatic dependent launches: each kernel lets its dependent launch at its
//            start and waits in griddepcontrol.wait (the producer grid's completion and
//            memory flush), which is how the engine's step kernels are ordered today;
//   flag   - the same early launch, but the dependent waits only for a counter that each
//            producer CTA bumps with a release atomic after its stores (acquire-polled by one
//            thread per CTA; the consumer's last CTA resets it for the next replay);
//   flags  - the same with one flag per producer CTA (a release store of its replay count,
//            no atomic, no reset): consumer CTA i polls every producer's flag with one thread
//            each until it reaches its own replay count (kept in a word only CTA i writes);
//   nowait - the same early launch and no ordering at all: the floor of the launch path
//            (its results are meaningless; only its time is reported).
// Time per kernel = the replay's median time / N. The outputs of the four ordered chains are
// compared bit for bit after the timed replays (the arithmetic is the same; a difference means
// an ordering failed). Speed only, run by hand on a GPU:
//   fp4kv_boundary_bench [kernels per chain = 64] [replays = 50]
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "bench/graph_replay.h"
#include "fp4kv/cache/dependent_launch.cuh"

namespace {

using fp4kv::bench::check;

constexpr int kThreads = 256;
constexpr int kElems = 4096;  // the vector each kernel reads whole and writes a slice of

enum Mode : int { kPlain = 0, kPdl = 1, kFlag = 2, kFlags = 3, kNoWait = 4 };

// The counters of one boundary (producer kernel i -> consumer kernel i + 1).
struct Link {
  unsigned* ready;  // producer CTAs whose stores are visible
  unsigned* seen;   // consumer CTAs that have seen ready complete
  unsigned* flags;  // [producer CTAs] replays each producer CTA has completed (flags mode)
  unsigned* count;  // [consumer CTAs] replays each consumer CTA has waited for (flags mode)
};

__device__ __forceinline__ unsigned load_acquire(const unsigned* p) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void add_release(unsigned* p, unsigned v) {
  asm volatile("red.release.gpu.global.add.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ void store_release(unsigned* p, unsigned v) {
  asm volatile("st.release.gpu.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

__device__ float block_sum(float v, float* red) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = v;
  __syncthreads();
  float s = 0.0f;
  for (int w = 0; w < kThreads / 32; ++w) s += red[w];  // the same order in every thread
  return s;
}

template <Mode M>
__global__ void __launch_bounds__(kThreads) link_kernel(const float* in, float* out, Link wait_on, int producer_ctas,
                                                        Link signal) {
  __shared__ float red[kThreads / 32];
  if constexpr (M != kPlain) fp4kv::cache::allow_dependents();
  if constexpr (M == kPdl) fp4kv::cache::wait_for_producer();
  if constexpr (M == kFlag) {
    if (producer_ctas > 0 && threadIdx.x == 0) {
      while (load_acquire(wait_on.ready) < unsigned(producer_ctas)) {
      }
      if (atomicAdd(wait_on.seen, 1u) == gridDim.x - 1) {  // every consumer CTA has passed: reset
        *wait_on.seen = 0u;
        *wait_on.ready = 0u;
      }
    }
    __syncthreads();
  }
  if constexpr (M == kFlags) {
    __shared__ unsigned expected;
    if (threadIdx.x == 0) {
      expected = load_acquire(wait_on.count + blockIdx.x) + 1;  // no stale L1 line of an earlier replay
      wait_on.count[blockIdx.x] = expected;
    }
    __syncthreads();
    for (int j = threadIdx.x; j < producer_ctas; j += kThreads)
      while (load_acquire(wait_on.flags + j) < expected) {
      }
    __syncthreads();
  }
  float s = 0.0f;
  for (int i = threadIdx.x; i < kElems; i += kThreads) s += __ldcg(in + i);
  s = block_sum(s, red);
  const int per = kElems / gridDim.x;
  for (int i = threadIdx.x; i < per; i += kThreads) {
    const int j = blockIdx.x * per + i;
    out[j] = __ldcg(in + j) * 0.5f + s * (1.0f / kElems);
  }
  if constexpr (M == kFlag) {
    __syncthreads();
    if (threadIdx.x == 0) add_release(signal.ready, 1u);
  }
  if constexpr (M == kFlags) {
    __syncthreads();
    if (threadIdx.x == 0) store_release(signal.flags + blockIdx.x, load_acquire(signal.flags + blockIdx.x) + 1);
  }
}

template <Mode M>
void launch(int ctas, cudaStream_t s, const float* in, float* out, Link wait_on, int producer_ctas, Link signal) {
  if constexpr (M == kPlain)
    link_kernel<M><<<ctas, kThreads, 0, s>>>(in, out, wait_on, producer_ctas, signal);
  else
    fp4kv::cache::launch_dependent(link_kernel<M>, dim3(ctas), dim3(kThreads), 0, s, in, out, wait_on, producer_ctas,
                                   signal);
  check(cudaGetLastError(), "launch");
}

struct Chain {
  int kernels, ctas;
  float* buf;          // [kernels + 1][kElems]: buffer k is kernel k's input
  unsigned* counters;  // [kernels + 1][kLinkWords]
};

constexpr int kMaxCtas = 1024;
constexpr int kLinkWords = 2 + 2 * kMaxCtas;

Link link_of(const Chain& c, int k) {
  unsigned* w = c.counters + size_t(k) * kLinkWords;
  return Link{w, w + 1, w + 2, w + 2 + kMaxCtas};
}

template <Mode M>
cudaGraphExec_t capture(const Chain& c, cudaStream_t s) {
  check(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), "begin capture");
  for (int k = 0; k < c.kernels; ++k)
    launch<M>(c.ctas, s, c.buf + size_t(k) * kElems, c.buf + size_t(k + 1) * kElems, link_of(c, k), k == 0 ? 0 : c.ctas,
              link_of(c, k + 1));
  return fp4kv::bench::end_capture(s);
}

// Median microseconds of one replay, and the chain's final buffer (after a fresh input).
template <Mode M>
double time_chain(const Chain& c, cudaStream_t s, int replays, const std::vector<float>& input, std::vector<float>& result) {
  cudaGraphExec_t e = capture<M>(c, s);
  check(cudaMemsetAsync(c.counters, 0, sizeof(unsigned) * kLinkWords * (c.kernels + 1), s), "zero counters");
  check(cudaMemsetAsync(c.buf + kElems, 0, sizeof(float) * kElems * c.kernels, s), "zero buffers");
  check(cudaMemcpyAsync(c.buf, input.data(), sizeof(float) * kElems, cudaMemcpyHostToDevice, s), "input");
  const double us = fp4kv::bench::median_replay_us(e, s, replays);
  result.resize(kElems);
  check(cudaMemcpy(result.data(), c.buf + size_t(c.kernels) * kElems, sizeof(float) * kElems, cudaMemcpyDeviceToHost),
        "result");
  check(cudaGraphExecDestroy(e), "graph exec");
  return us;
}

}  // namespace

int main(int argc, char** argv) {
  const int kernels = argc > 1 ? std::atoi(argv[1]) : 64;
  const int replays = argc > 2 ? std::atoi(argv[2]) : 50;
  if (kernels < 2 || replays < 1) {
    std::fprintf(stderr, "usage: fp4kv_boundary_bench [kernels per chain >= 2] [replays >= 1]\n");
    return 2;
  }
  cudaDeviceProp prop;
  check(cudaGetDeviceProperties(&prop, 0), "device properties");
  std::printf("device %s, %d SMs; chain of %d kernels, %d threads a CTA, %d floats read whole per CTA\n", prop.name,
              prop.multiProcessorCount, kernels, kThreads, kElems);
  std::printf("%6s %8s %10s %10s %10s %10s %10s   %s\n", "CTAs", "per SM", "plain us", "pdl us", "flag us", "flags us",
              "nowait us", "outputs");
  cudaStream_t s;
  check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "stream");
  std::vector<float> input(kElems);
  for (int i = 0; i < kElems; ++i) input[i] = float((i * 37) % 101) / 101.0f;
  for (int per_sm : {1, 2, 4}) {
    Chain c{kernels, prop.multiProcessorCount * per_sm, nullptr, nullptr};
    while (kElems % c.ctas != 0) --c.ctas;  // every CTA writes a whole slice
    check(cudaMalloc(&c.buf, sizeof(float) * kElems * (kernels + 1)), "buffers");
    check(cudaMalloc(&c.counters, sizeof(unsigned) * kLinkWords * (kernels + 1)), "counters");
    std::vector<float> r_plain, r_pdl, r_flag, r_flags, r_none;
    const double t_plain = time_chain<kPlain>(c, s, replays, input, r_plain);
    const double t_pdl = time_chain<kPdl>(c, s, replays, input, r_pdl);
    const double t_flag = time_chain<kFlag>(c, s, replays, input, r_flag);
    const double t_flags = time_chain<kFlags>(c, s, replays, input, r_flags);
    const double t_none = time_chain<kNoWait>(c, s, replays, input, r_none);
    const bool same = std::memcmp(r_plain.data(), r_pdl.data(), sizeof(float) * kElems) == 0 &&
                      std::memcmp(r_plain.data(), r_flag.data(), sizeof(float) * kElems) == 0 &&
                      std::memcmp(r_plain.data(), r_flags.data(), sizeof(float) * kElems) == 0;
    std::printf("%6d %8.2f %10.2f %10.2f %10.2f %10.2f %10.2f   %s\n", c.ctas, double(c.ctas) / prop.multiProcessorCount,
                t_plain / kernels, t_pdl / kernels, t_flag / kernels, t_flags / kernels, t_none / kernels,
                same ? "plain == pdl == flag == flags" : "DIFFER");
    check(cudaFree(c.buf), "free");
    check(cudaFree(c.counters), "free");
  }
  check(cudaStreamDestroy(s), "stream");
  return 0;
}
