// Where a short decode row's split partials are merged, timed: by a combine kernel (the
// engine's form: each split CTA writes its partial (o, lse) to global memory, a second kernel,
// a programmatic dependent of the first, merges them), or inside a thread block cluster (the
// split CTAs of one KV head are one cluster; each keeps its partial in shared memory, and
// after a cluster barrier every CTA merges a slice of the outputs from its peers' shared
// memory; one kernel, no partial round trip through L2). The shapes are the 4K batch-1 step's
// of Qwen3-4B: 8 KV heads, 4 query heads each, head_dim 128, 8 splits. The split CTAs do no
// attention: each scales its heads' queries into a partial, so what is timed is the launch,
// the handoff and the merge. A chain of iterations (each reading the previous output) is
// captured in a CUDA graph and replayed; time per iteration = the replay's median / N.
// Both forms merge in the same order, and their outputs are compared bit for bit.
// Speed only, run by hand on a GPU:
//   fp4kv_merge_bench [iterations per chain = 64] [replays = 50]
#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "bench/graph_replay.h"
#include "fp4kv/cache/dependent_launch.cuh"

namespace cg = cooperative_groups;

namespace {

using fp4kv::bench::check;

constexpr int kKvHeads = 8;
constexpr int kG = 4;  // query heads per KV head
constexpr int kD = 128;
constexpr int kSplits = 8;  // one portable cluster
constexpr int kThreads = 256;
constexpr int kQElems = kKvHeads * kG * kD;

// The split's partial of its G heads (a stand-in for its attention over its pages), in
// explicitly rounded operations so that both kernels compute the same bits.
__device__ __forceinline__ float partial_o(const float* q, int g, int d, int split) {
  return __fmul_rn(q[g * kD + d], __fadd_rn(1.0f, __fmul_rn(0.125f, float(split))));
}
__device__ __forceinline__ float partial_lse(const float* q, int g, int split) {
  return __fadd_rn(__fmul_rn(q[g * kD], 0.25f), __fmul_rn(0.5f, float((split * 5 + g) % kSplits)));
}

// The merge of one output (head g, channel d) from the S partials, in split order.
__device__ __forceinline__ float merge(const float* lse, const float* o, int stride) {
  float m = lse[0];
  for (int s = 1; s < kSplits; ++s) m = fmaxf(m, lse[s]);
  float l = 0.0f, acc = 0.0f;
  for (int s = 0; s < kSplits; ++s) {
    const float w = exp2f(__fsub_rn(lse[s], m));
    l = __fadd_rn(l, w);
    acc = fmaf(w, o[s * stride], acc);
  }
  return __fdiv_rn(acc, l);
}

// Global partials: o [kv head][g][split][d], lse [kv head][g][split].
__global__ void __launch_bounds__(kThreads) split_kernel(const float* q, float* part_o, float* part_lse) {
  fp4kv::cache::allow_dependents();
  fp4kv::cache::wait_for_producer();
  const int split = blockIdx.x, kvh = blockIdx.y;
  const float* qh = q + kvh * kG * kD;
  for (int i = threadIdx.x; i < kG * kD; i += kThreads) {
    const int g = i / kD, d = i % kD;
    part_o[((kvh * kG + g) * kSplits + split) * kD + d] = partial_o(qh, g, d, split);
  }
  if (threadIdx.x < kG) part_lse[(kvh * kG + threadIdx.x) * kSplits + split] = partial_lse(qh, threadIdx.x, split);
}

// One CTA of d threads per query head (as the engine's combine).
__global__ void __launch_bounds__(kD) combine_kernel(const float* part_o, const float* part_lse, float* out) {
  fp4kv::cache::allow_dependents();
  fp4kv::cache::wait_for_producer();
  const int head = blockIdx.x, d = threadIdx.x;
  float lse[kSplits];
  for (int s = 0; s < kSplits; ++s) lse[s] = part_lse[head * kSplits + s];
  out[head * kD + d] = merge(lse, part_o + size_t(head) * kSplits * kD + d, kD);
}

// Grid (kSplits, kKvHeads), clusters of kSplits along x: rank s is split s of the KV head.
__global__ void __launch_bounds__(kThreads) cluster_kernel(const float* q, float* out) {
  __shared__ float o_s[kG * kD];
  __shared__ float lse_s[kG];
  fp4kv::cache::allow_dependents();
  fp4kv::cache::wait_for_producer();
  cg::cluster_group cluster = cg::this_cluster();
  const int split = int(cluster.block_rank()), kvh = blockIdx.y;
  const float* qh = q + kvh * kG * kD;
  for (int i = threadIdx.x; i < kG * kD; i += kThreads) o_s[i] = partial_o(qh, i / kD, i % kD, split);
  if (threadIdx.x < kG) lse_s[threadIdx.x] = partial_lse(qh, threadIdx.x, split);
  cluster.sync();  // every partial of the KV head written
  constexpr int kPerCta = kG * kD / kSplits;
  if (threadIdx.x < kPerCta) {
    const int i = split * kPerCta + threadIdx.x, g = i / kD;
    float lse[kSplits], o[kSplits];
    for (int s = 0; s < kSplits; ++s) {
      lse[s] = *cluster.map_shared_rank(&lse_s[g], s);
      o[s] = *cluster.map_shared_rank(&o_s[i], s);
    }
    out[kvh * kG * kD + i] = merge(lse, o, 1);
  }
  cluster.sync();  // no CTA leaves while a peer reads its shared memory
}

// Launches the cluster kernel, as a programmatic dependent when `dependent` (main probes
// once, outside any capture, that the driver takes both attributes together: a refused launch
// inside a capture would end it).
cudaError_t launch_cluster(cudaStream_t s, const float* q, float* out, bool dependent) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(kSplits, kKvHeads);
  cfg.blockDim = dim3(kThreads);
  cfg.stream = s;
  cudaLaunchAttribute attr[2];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = kSplits;
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  attr[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[1].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = dependent ? 2 : 1;
  return cudaLaunchKernelEx(&cfg, cluster_kernel, q, out);
}

enum Form { kCombine, kCluster, kSplitOnly };

struct Buffers {
  float* act;  // [iterations + 1][kQElems]
  float* part_o;
  float* part_lse;
  bool cluster_dependent;  // the cluster kernel launched as a programmatic dependent
};

cudaGraphExec_t capture(Form f, int iterations, const Buffers& b, cudaStream_t s) {
  check(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), "begin capture");
  for (int it = 0; it < iterations; ++it) {
    const float* q = b.act + size_t(it) * kQElems;
    float* out = b.act + size_t(it + 1) * kQElems;
    if (f == kCluster) {
      check(launch_cluster(s, q, out, b.cluster_dependent), "cluster launch");
    } else {
      fp4kv::cache::launch_dependent(split_kernel, dim3(kSplits, kKvHeads), dim3(kThreads), 0, s, q, b.part_o,
                                     b.part_lse);
      if (f == kCombine)
        fp4kv::cache::launch_dependent(combine_kernel, dim3(kKvHeads * kG), dim3(kD), 0, s,
                                       static_cast<const float*>(b.part_o), static_cast<const float*>(b.part_lse), out);
    }
    check(cudaGetLastError(), "launch");
  }
  return fp4kv::bench::end_capture(s);
}

double time_form(Form f, int iterations, int replays, const Buffers& b, cudaStream_t s, const std::vector<float>& input,
                 std::vector<float>& result) {
  cudaGraphExec_t e = capture(f, iterations, b, s);
  check(cudaMemcpyAsync(b.act, input.data(), sizeof(float) * kQElems, cudaMemcpyHostToDevice, s), "input");
  const double us = fp4kv::bench::median_replay_us(e, s, replays);
  result.resize(kQElems);
  check(cudaMemcpy(result.data(), b.act + size_t(iterations) * kQElems, sizeof(float) * kQElems, cudaMemcpyDeviceToHost),
        "result");
  check(cudaGraphExecDestroy(e), "graph exec");
  return us / iterations;
}

}  // namespace

int main(int argc, char** argv) {
  const int iterations = argc > 1 ? std::atoi(argv[1]) : 64;
  const int replays = argc > 2 ? std::atoi(argv[2]) : 50;
  if (iterations < 1 || replays < 1) {
    std::fprintf(stderr, "usage: fp4kv_merge_bench [iterations >= 1] [replays >= 1]\n");
    return 2;
  }
  cudaDeviceProp prop;
  check(cudaGetDeviceProperties(&prop, 0), "device properties");
  Buffers b{};
  check(cudaMalloc(&b.act, sizeof(float) * kQElems * (iterations + 1)), "activations");
  check(cudaMemset(b.act, 0, sizeof(float) * kQElems * (iterations + 1)), "zero activations");
  check(cudaMalloc(&b.part_o, sizeof(float) * kKvHeads * kG * kSplits * kD), "partials");
  check(cudaMalloc(&b.part_lse, sizeof(float) * kKvHeads * kG * kSplits), "partial lse");
  cudaStream_t s;
  check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "stream");
  std::vector<float> input(kQElems);
  for (int i = 0; i < kQElems; ++i) input[i] = float((i * 29) % 97) / 97.0f - 0.5f;
  b.cluster_dependent = launch_cluster(s, b.act, b.act + kQElems, true) == cudaSuccess &&
                        cudaStreamSynchronize(s) == cudaSuccess;
  (void)cudaGetLastError();
  std::vector<float> r_combine, r_cluster, r_split;
  const double t_combine = time_form(kCombine, iterations, replays, b, s, input, r_combine);
  const double t_cluster = time_form(kCluster, iterations, replays, b, s, input, r_cluster);
  const double t_split = time_form(kSplitOnly, iterations, replays, b, s, input, r_split);
  const bool same = std::memcmp(r_combine.data(), r_cluster.data(), sizeof(float) * kQElems) == 0;
  std::printf("device %s, %d SMs; %d KV heads x %d query heads, d %d, %d splits; chain of %d iterations\n", prop.name,
              prop.multiProcessorCount, kKvHeads, kG, kD, kSplits, iterations);
  std::printf("us per iteration: split kernel + combine kernel %.2f, cluster kernel (merge in-cluster) %.2f, "
              "split kernel alone (no merge) %.2f; outputs %s\n",
              t_combine, t_cluster, t_split, same ? "combine == cluster" : "DIFFER");
  if (!b.cluster_dependent) std::printf("(the cluster kernel was refused as a programmatic dependent: plain launches)\n");
  check(cudaStreamDestroy(s), "stream");
  check(cudaFree(b.act), "free");
  check(cudaFree(b.part_o), "free");
  check(cudaFree(b.part_lse), "free");
  return same ? 0 : 1;
}
