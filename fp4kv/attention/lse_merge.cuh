// The log-sum-exp merge of partial attention results, and the combine kernel that merges a
// decode step's split partials: for each (row, query head) the page splits' partial (o,
// base-2 LSE) and the BF16 sink/recent part's are weighted by 2^(lse - max) and summed; the
// output is written in the caller's type and the LSE as the natural log of the true logits
// q.k / sqrt(d) (the key smoothing's shift q.mu_k / sqrt(d) added back).
#pragma once

#include "fp4kv/attention/device_common.cuh"
#include "fp4kv/cache/dependent_launch.cuh"
#include "fp4kv/cache/split_plan.h"
#include "fp4kv/core/decode_layout.h"

namespace fp4kv::attention::detail {

__device__ __forceinline__ float quiet_nan() { return __int_as_float(0x7fc00000); }

// The weight of a partial with LSE `lse` (base 2) against the fixed maximum `big`:
// 2^(lse - big), 0 for an empty partial (lse -inf).
__device__ __forceinline__ float merge_weight(float lse, float big) { return lse == neg_inf() ? 0.0f : exp2f(lse - big); }

// Running merge of partials (o_s, lse_s) against a fixed maximum `big` (base 2):
// acc = sum w_s o_s with w_s = merge_weight(lse_s, big), for four channels at once.
struct MergeState4 {
  float big, wsum;
  float4 acc;
  __device__ __forceinline__ void add(float lse, const float4& o) {
    const float w = merge_weight(lse, big);
    wsum += w;
    acc.x = fmaf(w, o.x, acc.x);
    acc.y = fmaf(w, o.y, acc.y);
    acc.z = fmaf(w, o.z, acc.z);
    acc.w = fmaf(w, o.w, acc.w);
  }
};

__device__ __forceinline__ float4 zero4() { return make_float4(0.0f, 0.0f, 0.0f, 0.0f); }
__device__ __forceinline__ float4 add4(const float4& a, const float4& b) {
  return make_float4(a.x + b.x, a.y + b.y, a.z + b.z, a.w + b.w);
}

// How the combine CTA's D threads share a row's partials: thread c merges the four channels
// 4 (c % kChannelThreads) .. + 3 of every kSplitGroups-th split, starting at split
// c / kChannelThreads, kLoadsInFlight partials at a time. A row's partial outputs are then
// read in ceil(splits / (kSplitGroups kLoadsInFlight)) memory latencies, the first
// overlapping the LSEs' load: a long batch-1 row's 32-64 splits cost one or two.
template <int D>
struct CombineTiling {
  static constexpr int kChannelsPerThread = 4;  // one float4
  static constexpr int kChannelThreads = D / kChannelsPerThread;
  static constexpr int kSplitGroups = D / kChannelThreads;
  static constexpr int kLoadsInFlight = 8;
  static_assert(D >= 64 && D % 32 == 0, "whole warps, a float4 of channels per thread");
};

// Partial outputs of `group`'s splits first, first + kSplitGroups, ... (kLoadsInFlight of
// them; zero past nsplit): four channels from `channel`.
template <int D>
__device__ __forceinline__ void load_partials(const float* part_o, size_t row_base, int first, int nsplit,
                                              int channel, float4 (&o)[CombineTiling<D>::kLoadsInFlight]) {
  using T = CombineTiling<D>;
#pragma unroll
  for (int k = 0; k < T::kLoadsInFlight; ++k) {
    const int s = first + k * T::kSplitGroups;
    o[k] = s < nsplit ? *reinterpret_cast<const float4*>(part_o + (row_base + s) * D + channel) : zero4();
  }
}

template <int D, IoType IO>
__global__ void __launch_bounds__(D) combine_kernel(const CombineArgs a) {
  using T = CombineTiling<D>;
  const int qh = blockIdx.x, b = blockIdx.y, c = threadIdx.x;
  const int group = c / T::kChannelThreads, channel = (c % T::kChannelThreads) * T::kChannelsPerThread;
  __shared__ float red[D / 32];
  __shared__ float4 group_acc[T::kSplitGroups][T::kChannelThreads];
  __shared__ float group_wsum[T::kSplitGroups];
  extern __shared__ float s_lse[];  // [max_splits + 1]: the valid splits' LSE, else -inf
  const size_t row_head = size_t(b) * a.q_heads + qh;  // index of (row, query head)
  const size_t oi = row_head * D + c;
  // The next op (in the decode step the O projection's GEMV, a programmatic dependent) may
  // launch now and issue its weight loads while this grid waits for the decode kernel.
  cache::allow_dependents();
  // The row's scalars in one memory latency (no branch between the loads), before waiting:
  // they are the decode kernel's inputs, and this grid launches only once every decode CTA
  // has passed its own wait for the op before it (so every earlier kernel is complete), so
  // their latency overlaps the decode kernel's tail.
  const int err = a.error_flags ? a.error_flags[0] : 0;
  const int rows = a.num_rows ? a.num_rows[0] : a.batch;
  const int n_row = a.seq_lens[b];
  const int row_splits = a.row_splits[b], pps = a.row_pps[b];
  // Launched as a programmatic dependent of the decode kernel: wait for its partials (a
  // no-op when launched normally).
  asm volatile("griddepcontrol.wait;" ::: "memory");
  if (err != 0) {
    store_io<IO>(a.out, oi, quiet_nan());
    if (a.lse && c == 0) a.lse[row_head] = quiet_nan();
    return;
  }
  const int n = b >= rows ? 0 : n_row;
  if (n <= 0) {
    store_io<IO>(a.out, oi, 0.0f);
    if (a.lse && c == 0) a.lse[row_head] = neg_inf();
    return;
  }
  const KvFormat f = KvFormat(a.kv_format);
  const DecodeLayout lay = cache::attended_layout(n, f, a.sink != 0, a.recent != 0);
  const int pages = lay.quant_pages;
  const int splits = pages > 0 ? min(row_splits, a.max_splits) : 0;
  const bool bf = lay.bf16_tokens() > 0;
  const int S1 = a.max_splits + 1;
  const size_t base = row_head * S1;
  // The page splits with work are a prefix 0 .. nsplit - 1; the BF16 part is slot max_splits
  // (merged by group 0). The first partials are loaded with the LSEs (no branch between).
  const int nsplit = pps > 0 ? min(splits, (pages + pps - 1) / pps) : 0;
  float4 o[T::kLoadsInFlight];
  load_partials<D>(a.part_o, base, group, nsplit, channel, o);
  const bool adds_bf = bf && group == 0;
  const float4 o_bf =
      adds_bf ? *reinterpret_cast<const float4*>(a.part_o + (base + a.max_splits) * D + channel) : zero4();
  float big = neg_inf();
  for (int s = c; s < S1; s += D) {
    const float lse = (s < nsplit || (s == a.max_splits && bf)) ? a.part_lse[base + s] : neg_inf();
    s_lse[s] = lse;
    big = fmaxf(big, lse);
  }
  big = warp_max_xor(big, 1);
  if (c % 32 == 0) red[c / 32] = big;
  __syncthreads();
  for (int w = 0; w < D / 32; ++w) big = fmaxf(big, red[w]);
  MergeState4 m{big, 0.0f, zero4()};
  for (int first = group;; first += T::kSplitGroups * T::kLoadsInFlight) {
#pragma unroll
    for (int k = 0; k < T::kLoadsInFlight; ++k) {
      const int s = first + k * T::kSplitGroups;
      if (s < nsplit) m.add(s_lse[s], o[k]);
    }
    const int next = first + T::kSplitGroups * T::kLoadsInFlight;
    if (next >= nsplit) break;
    load_partials<D>(a.part_o, base, next, nsplit, channel, o);
  }
  if (adds_bf) m.add(s_lse[a.max_splits], o_bf);
  // The groups' sums, added in group order by every thread (the same total everywhere).
  group_acc[group][c % T::kChannelThreads] = m.acc;
  if (c % T::kChannelThreads == 0) group_wsum[group] = m.wsum;
  __syncthreads();
  float wsum = 0.0f;
  for (int g = 0; g < T::kSplitGroups; ++g) wsum += group_wsum[g];
  if (!(wsum > 0.0f)) {  // no split contributed (a row the control kernel gave no work)
    store_io<IO>(a.out, oi, 0.0f);
    if (a.lse && c == 0) a.lse[row_head] = neg_inf();
    return;
  }
  if (group == 0) {
    float4 acc = group_acc[0][c];
    for (int g = 1; g < T::kSplitGroups; ++g) acc = add4(acc, group_acc[g][c]);
    const size_t o0 = row_head * D + channel;
    store_io<IO>(a.out, o0 + 0, acc.x / wsum);
    store_io<IO>(a.out, o0 + 1, acc.y / wsum);
    store_io<IO>(a.out, o0 + 2, acc.z / wsum);
    store_io<IO>(a.out, o0 + 3, acc.w / wsum);
  }
  if (!a.lse) return;
  float shift = 0.0f;
  if (a.mu_k) {
    const float qv = load_io<IO>(a.q, oi);
    float x = (is_finite(qv) ? qv : 0.0f) * a.mu_k[size_t(qh / a.G) * D + c];
    x = warp_sum_xor(x, 1);
    if (c % 32 == 0) red[c / 32] = x;
    __syncthreads();
    float tot = 0.0f;
    for (int w = 0; w < D / 32; ++w) tot += red[w];
    shift = tot * rsqrtf(float(D));
  }
  if (c == 0) a.lse[row_head] = (big + log2f(wsum)) * kLn2 + shift;
}

template <int D, IoType IO>
void launch_combine(const CombineArgs& a, cudaStream_t stream) {
  // Programmatic dependent launch: the combine grid is set up while the decode kernel
  // finishes and waits for it in griddepcontrol.wait.
  cache::launch_dependent(combine_kernel<D, IO>, dim3(a.q_heads, a.batch), dim3(D), (a.max_splits + 1) * sizeof(float),
                          stream, a);
}

}  // namespace fp4kv::attention::detail
