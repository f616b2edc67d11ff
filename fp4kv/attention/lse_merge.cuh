// The log-sum-exp merge of partial attention results, and the combine kernel that merges a
// decode step's split partials: for each (row, query head) the page splits' partial (o,
// base-2 LSE) and the BF16 sink/recent part's are weighted by 2^(lse - max) and summed; the
// output is written in the caller's type and the LSE as the natural log of the true logits
// q.k / sqrt(d) (the key smoothing's shift q.mu_k / sqrt(d) added back). The merge state is
// shared with every kernel that combines partial softmax results.
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
// acc = sum w_s o_s with w_s = merge_weight(lse_s, big).
struct MergeState {
  float big, wsum, acc;
  __device__ __forceinline__ void add(float lse, float o) {
    const float w = merge_weight(lse, big);
    wsum += w;
    acc = fmaf(w, o, acc);
  }
};

template <int D, IoType IO>
__global__ void __launch_bounds__(D) combine_kernel(const CombineArgs a) {
  const int qh = blockIdx.x, b = blockIdx.y, c = threadIdx.x;
  __shared__ float red[D / 32];
  extern __shared__ float s_lse[];  // [max_splits + 1]: the valid splits' LSE, else -inf
  const size_t oi = (size_t(b) * a.q_heads + qh) * D + c;
  // The next op (in the decode step the O projection's GEMV, a programmatic dependent) may
  // launch now and issue its weight loads while this grid waits for the decode kernel.
  cache::allow_dependents();
  // The row's scalars in one memory latency (no branch between the loads), before waiting:
  // they are the decode kernel's inputs, written before it started (it is launched
  // normally, after all earlier work), so their latency overlaps the decode kernel's tail.
  const int err = a.error_flags ? a.error_flags[0] : 0;
  const int rows = a.num_rows ? a.num_rows[0] : a.batch;
  const int n_row = a.seq_lens[b];
  const int row_splits = a.row_splits[b], pps = a.row_pps[b];
  // Launched as a programmatic dependent of the decode kernel: wait for its partials (a
  // no-op when launched normally).
  asm volatile("griddepcontrol.wait;" ::: "memory");
  if (err != 0) {
    store_io<IO>(a.out, oi, quiet_nan());
    if (a.lse && c == 0) a.lse[size_t(b) * a.q_heads + qh] = quiet_nan();
    return;
  }
  const int n = b >= rows ? 0 : n_row;
  if (n <= 0) {
    store_io<IO>(a.out, oi, 0.0f);
    if (a.lse && c == 0) a.lse[size_t(b) * a.q_heads + qh] = neg_inf();
    return;
  }
  const KvFormat f = KvFormat(a.kv_format);
  const DecodeLayout lay = cache::attended_layout(n, f, a.sink != 0, a.recent != 0);
  const int pages = lay.quant_pages;
  const int splits = pages > 0 ? min(row_splits, a.max_splits) : 0;
  const bool bf = lay.bf16_tokens() > 0;
  const int S1 = a.max_splits + 1;
  const size_t base = (size_t(b) * a.q_heads + qh) * S1;
  // The page splits with work are a prefix 0 .. nsplit - 1; the BF16 part is slot max_splits.
  // Their partial outputs are loaded with the LSEs, many in flight at once (no branch
  // between the loads): at short contexts the combine is a chain of memory latencies else.
  const int nsplit = pps > 0 ? min(splits, (pages + pps - 1) / pps) : 0;
  constexpr int R = 16;  // partial outputs held in registers; the rest in chunks of 8
  float v[R];
#pragma unroll
  for (int k = 0; k < R; ++k) v[k] = k < nsplit ? a.part_o[(base + k) * D + c] : 0.0f;
  const float v_bf = bf ? a.part_o[(base + a.max_splits) * D + c] : 0.0f;
  for (int s = c; s < S1; s += D) s_lse[s] = (s < nsplit || (s == a.max_splits && bf)) ? a.part_lse[base + s] : neg_inf();
  __syncthreads();
  float big = bf ? s_lse[a.max_splits] : neg_inf();
  for (int s = 0; s < nsplit; ++s) big = fmaxf(big, s_lse[s]);
  MergeState m{big, 0.0f, 0.0f};
#pragma unroll
  for (int k = 0; k < R; ++k)
    if (k < nsplit) m.add(s_lse[k], v[k]);
  for (int s = R; s < nsplit; s += 8) {
    float x[8];
#pragma unroll
    for (int k = 0; k < 8; ++k) x[k] = s + k < nsplit ? a.part_o[(base + s + k) * D + c] : 0.0f;
#pragma unroll
    for (int k = 0; k < 8; ++k)
      if (s + k < nsplit) m.add(s_lse[s + k], x[k]);
  }
  if (bf) m.add(s_lse[a.max_splits], v_bf);
  if (!(m.wsum > 0.0f)) {  // no split contributed (a row the control kernel gave no work)
    store_io<IO>(a.out, oi, 0.0f);
    if (a.lse && c == 0) a.lse[size_t(b) * a.q_heads + qh] = neg_inf();
    return;
  }
  store_io<IO>(a.out, oi, m.acc / m.wsum);
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
  if (c == 0) a.lse[size_t(b) * a.q_heads + qh] = (big + log2f(m.wsum)) * kLn2 + shift;
}

template <int D, IoType IO>
void launch_combine(const CombineArgs& a, cudaStream_t stream) {
  // Programmatic dependent launch: the combine grid is set up while the decode kernel
  // finishes and waits for it in griddepcontrol.wait.
  cache::launch_dependent(combine_kernel<D, IO>, dim3(a.q_heads, a.batch), dim3(D), (a.max_splits + 1) * sizeof(float),
                          stream, a);
}

}  // namespace fp4kv::attention::detail
