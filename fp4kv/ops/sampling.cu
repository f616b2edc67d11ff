// Sampling kernel (sampling.h): one CTA of kSampleThreads per row. Thread t owns the
// indices t, t + kSampleThreads, ... of the row in every pass, so the weights it writes
// are read back only by itself; the CTA meets only inside the reductions.
#include "fp4kv/ops/sampling.h"

#include <climits>
#include <string>

#include "fp4kv/cache/cuda_check.h"
#include "fp4kv/core/error.h"
#include "fp4kv/core/hd_math.h"

namespace fp4kv::ops {
namespace {

constexpr int kWarps = kSampleThreads / kSampleWarp;
constexpr unsigned kFullMask = 0xffffffffu;
static_assert(kWarps == kSampleWarp, "the second tree level reduces one warp of warp results");

struct Reduction {
  float warp_f[kWarps];
  int warp_i[kWarps];
  float total_f;
  int total_i;
};

// The fixed sum order of sampling.h: a stride-halving tree within each warp, then over the
// warp results. Every thread gets the total.
__device__ float fixed_block_sum(float v, Reduction& r) {
  for (int off = kSampleWarp / 2; off > 0; off /= 2) v = __fadd_rn(v, __shfl_down_sync(kFullMask, v, off));
  const int lane = threadIdx.x % kSampleWarp, warp = threadIdx.x / kSampleWarp;
  if (lane == 0) r.warp_f[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = r.warp_f[lane];
    for (int off = kSampleWarp / 2; off > 0; off /= 2) v = __fadd_rn(v, __shfl_down_sync(kFullMask, v, off));
    if (lane == 0) r.total_f = v;
  }
  __syncthreads();
  return r.total_f;
}

__device__ int block_count(int v, Reduction& r) {
  for (int off = kSampleWarp / 2; off > 0; off /= 2) v += __shfl_down_sync(kFullMask, v, off);
  const int lane = threadIdx.x % kSampleWarp, warp = threadIdx.x / kSampleWarp;
  if (lane == 0) r.warp_i[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = r.warp_i[lane];
    for (int off = kSampleWarp / 2; off > 0; off /= 2) v += __shfl_down_sync(kFullMask, v, off);
    if (lane == 0) r.total_i = v;
  }
  __syncthreads();
  return r.total_i;
}

// The greedy index: largest logit, ties to the lowest index, NaN never (none: 0).
__device__ int block_argmax(const float* logits, int vocab, Reduction& r) {
  float best = -INFINITY;
  int best_i = INT_MAX;
  for (int i = threadIdx.x; i < vocab; i += kSampleThreads) {
    if (logits[i] > best) {  // ascending i: a tie keeps the lower index
      best = logits[i];
      best_i = i;
    }
  }
  for (int off = kSampleWarp / 2; off > 0; off /= 2) {
    const float ov = __shfl_down_sync(kFullMask, best, off);
    const int oi = __shfl_down_sync(kFullMask, best_i, off);
    if (ov > best || (ov == best && oi < best_i)) {
      best = ov;
      best_i = oi;
    }
  }
  const int lane = threadIdx.x % kSampleWarp, warp = threadIdx.x / kSampleWarp;
  if (lane == 0) {
    r.warp_f[warp] = best;
    r.warp_i[warp] = best_i;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < kWarps; ++w) {
      if (r.warp_f[w] > best || (r.warp_f[w] == best && r.warp_i[w] < best_i)) {
        best = r.warp_f[w];
        best_i = r.warp_i[w];
      }
    }
    r.total_i = best_i == INT_MAX ? 0 : best_i;
  }
  __syncthreads();
  return r.total_i;
}

// The measures of a candidate set C intersected with a probed prefix P.
struct RowView {
  const float* weights;
  int vocab;
  Reduction* red;
};

__device__ float fixed_sum(const RowView& row, Prefix c, Prefix p) {
  float acc = 0.0f;
  for (int i = threadIdx.x; i < row.vocab; i += kSampleThreads) {
    const uint32_t b = __float_as_uint(row.weights[i]);
    if (in_prefix(b, i, c) && in_prefix(b, i, p)) acc = __fadd_rn(acc, row.weights[i]);
  }
  return fixed_block_sum(acc, *row.red);
}

__device__ int count_in(const RowView& row, Prefix p) {
  int n = 0;
  for (int i = threadIdx.x; i < row.vocab; i += kSampleThreads) n += in_prefix(__float_as_uint(row.weights[i]), i, p);
  return block_count(n, *row.red);
}

struct TopKSatisfied {
  const RowView& row;
  int k;
  __device__ bool operator()(Prefix p) const { return count_in(row, p) >= k; }
};
struct MassAtLeast {  // non-empty (the top token weighs 1) and mass >= goal
  const RowView& row;
  Prefix within;
  float goal;
  __device__ bool operator()(Prefix p) const {
    const float s = fixed_sum(row, within, p);
    return s > 0.0f && s >= goal;
  }
};
struct MassAbove {
  const RowView& row;
  Prefix within;
  float target;
  __device__ bool operator()(Prefix p) const { return fixed_sum(row, within, p) > target; }
};

__global__ void __launch_bounds__(kSampleThreads)
    sample_kernel(const float* logits_all, int vocab, const SamplingRow* params, float* weights_all,
                  int32_t* tokens) {
  __shared__ Reduction red;
  const int row_index = blockIdx.x;
  const float* logits = logits_all + size_t(row_index) * vocab;
  const SamplingRow p = params[row_index];
  const int greedy = block_argmax(logits, vocab, red);
  if (!(p.temperature > 0.0f)) {
    if (threadIdx.x == 0) tokens[row_index] = greedy;
    return;
  }
  float* weights = weights_all + size_t(row_index) * vocab;
  const float m = __fdiv_rn(logits[greedy], p.temperature);
  for (int i = threadIdx.x; i < vocab; i += kSampleThreads) {
    weights[i] = exp_nonpositive(__fsub_rn(__fdiv_rn(logits[i], p.temperature), m));
  }
  const RowView row{weights, vocab, &red};
  Prefix kept = all_tokens(vocab);
  if (uses_top_k(p, vocab)) kept = shortest_prefix(vocab, TopKSatisfied{row, p.top_k});
  if (uses_top_p(p)) {
    const float goal = __fmul_rn(p.top_p, fixed_sum(row, kept, all_tokens(vocab)));
    kept = shortest_prefix(vocab, MassAtLeast{row, kept, goal});
  }
  const float total = fixed_sum(row, kept, all_tokens(vocab));
  const float target = __fmul_rn(sampling_uniform(p), total);
  const Prefix pick = shortest_prefix(vocab, MassAbove{row, kept, target});
  if (threadIdx.x == 0) tokens[row_index] = pick.index;
}

}  // namespace

Sampler::Sampler(int max_rows, int vocab) : max_rows_(max_rows), vocab_(vocab) {
  require(max_rows >= 1, "Sampler: max_rows " + std::to_string(max_rows) + " must be positive");
  require(vocab >= 1, "Sampler: vocab " + std::to_string(vocab) + " must be positive");
  cache::cuda_check(cudaMalloc(reinterpret_cast<void**>(&weights_), size_t(max_rows) * vocab * sizeof(float)),
                    "Sampler: weights workspace");
}

Sampler::~Sampler() { cudaFree(weights_); }

void Sampler::run(const float* logits, int rows, const SamplingRow* params, int32_t* tokens,
                  cudaStream_t stream) const {
  if (rows < 0 || rows > max_rows_) {
    throw Error("Sampler::run: rows " + std::to_string(rows) + " outside [0, " + std::to_string(max_rows_) + "]");
  }
  if (rows == 0) return;
  if (!logits || !params || !tokens) throw Error("Sampler::run: a device pointer is null");
  sample_kernel<<<rows, kSampleThreads, 0, stream>>>(logits, vocab_, params, weights_, tokens);
  cache::cuda_check_launch("Sampler::run");
}

}  // namespace fp4kv::ops
