// The paged decode kernel (one template over the page traits of NVFP4, MXFP4, FP8 and BF16
// pages) and its launchers. Included by the instantiation units only (kernel_instances.h).
//
// CTA = (split, KV head, batch row), 8 warps. Split CTAs (split < max_splits) attend a range
// of the row's pool pages; CTA max_splits attends the BF16 sink + recent rows
// (sink_recent_part.cuh). Both roles issue their query loads, start their own loads, then
// run the one query prologue (query_prologue.cuh: rotate), whose code the kernel holds once.
// A split CTA:
//   1. starts its page stream (decode_mainloop.cuh) before the query prologue, then builds
//      the B operand of S^T = K Q^T;
//   2. per page: S^T for the warp's 16 keys (A = K tiles expanded by the page traits, B = the
//      query columns in registers), the online softmax (softmax_state.cuh), O^T += V^T P^T;
//   3. merges its warps' partial Os and sums and writes its partial (o, base-2 LSE), which
//      the combine kernel (lse_merge.cuh) merges with the other splits'.
// Grids are sized by capacity; CTAs without work exit at once (graph-capturable steps).
#pragma once

#include <cuda_runtime.h>

#include "fp4kv/attention/decode_mainloop.cuh"
#include "fp4kv/attention/device_common.cuh"
#include "fp4kv/attention/lse_merge.cuh"
#include "fp4kv/attention/page_traits.cuh"
#include "fp4kv/attention/query_prologue.cuh"
#include "fp4kv/attention/sink_recent_part.cuh"
#include "fp4kv/attention/smem_plan.cuh"
#include "fp4kv/attention/softmax_state.cuh"
#include "fp4kv/cache/split_plan.h"
#include "fp4kv/core/decode_layout.h"

namespace fp4kv::attention::detail {

// Epilogue: the warps' row sums and the partial Os (per slice) through shared memory (the
// stage region is free after the last page), normalized, with the base-2 LSE.
// The result is partial slot `split` of (row b, KV head kvh) in a.part_o / a.part_lse.
template <class K>
__device__ __forceinline__ void write_partial(const KernelArgs& a, const CtaSmem& sm, const SlotMap<K>& map,
                                              const SoftmaxState<K>& st, const OAccum<K>& acc, int b, int kvh,
                                              int split, int tid, int warp, int lane, int slice) {
  using P = typename K::Plan;
  constexpr int D = K::kD, NTP = K::NTP;
  const int G = map.G;
#pragma unroll
  for (int sl = 0; sl < K::NSL; ++sl) {
    const float l = warp_sum_xor(st.l[sl], 4);
    const int h = map.own_head(sl);
    if (lane < 4 && h < G) {
      sm.red_sum[h * kWarps + warp] = l;
      if (warp == 0) sm.red_m[h] = st.m[sl];
    }
  }
  __syncthreads();  // every warp is done with the stages: the region holds the O partials
  float* om = reinterpret_cast<float*>(sm.base);  // [slice][NTP * 8 heads][D]
#pragma unroll
  for (int i = 0; i < K::CGW; ++i)
#pragma unroll
    for (int j = 0; j < NTP; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int c = 16 * o_channel_group<K>(warp, i) + c_frag_row(lane, e), hc = 8 * j + c_frag_col(lane, e);
        om[(slice * NTP * 8 + hc) * D + c] = acc.o[i][j][e];
      }
  __syncthreads();
  const int S1 = a.max_splits + 1;
  const size_t obase = size_t(b) * a.q_heads + size_t(kvh) * G;
  for (int idx = tid; idx < G * D; idx += kThreads) {
    const int h = idx / D, c = idx % D;
    float l = 0.0f, s = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) l += sm.red_sum[h * kWarps + w];
#pragma unroll
    for (int w = 0; w < P::KP; ++w) s += om[(w * NTP * 8 + h) * D + c];
    const float inv = l > 0.0f ? 1.0f / l : 0.0f;
    a.part_o[((obase + h) * S1 + split) * D + c] = s * inv;
    if (c == 0) a.part_lse[(obase + h) * S1 + split] = l > 0.0f ? sm.red_m[h] + log2f(l) - a.log2c : neg_inf();
  }
}

// The start of a split CTA: the operand buffers zeroed (padding columns stay zero) and the
// page stream started, so the pages are in flight during the query prologue.
template <class K>
__device__ __forceinline__ void start_split(const CtaSmem& sm, const PageSource& src, int tid) {
  using P = typename K::Plan;
  for (int i = tid; i < P::QFRAG / 4; i += kThreads) reinterpret_cast<uint32_t*>(sm.qfrag)[i] = 0u;
  if constexpr (!P::kBulk)
    for (int i = tid; i < P::PS / 4; i += kThreads) reinterpret_cast<uint32_t*>(sm.ps)[i] = 0u;
  start_page_stream<K>(sm, src, tid);
}

// The rest of a split CTA, after start_split and the query prologue (sm.qf): the query
// operand, pages [p_begin, p_begin + npg) of (row b, KV head kvh), the partial.
template <class K>
__device__ __forceinline__ void split_part(const KernelArgs& a, const CtaSmem& sm, const PageSource& src, int b,
                                           int kvh, int split, int G, int tid, int warp, int lane) {
  using F = typename K::Fmt;
  using P = typename K::Plan;

  build_query_operand<F, K::kD, K::T, K::NT, K::kPFp4>(a, sm.qf, sm.qfrag, sm.gfac, sm.ebuf, tid);
  if constexpr (P::kBulk)  // the queries are consumed (barrier above): zero the P buffers they used
    for (int i = tid; i < P::PS / 4; i += kThreads) reinterpret_cast<uint32_t*>(sm.ps)[i] = 0u;

  const SlotMap<K> map{lane, G, K::kQuadSplitType && a.G <= 4};
  SoftmaxState<K> st;
  st.init(sm.gfac, map);
  OAccum<K> acc;
  zero(acc.o);
  const int slice = o_slice<K>(warp);  // which partial O this warp adds to
  QueryOperand<K> q;
  q.load(sm.qfrag, lane);

  const PageLoopInputs<K> in{a, sm, src, q, map};
  if constexpr (K::kPagePairs) bulk_pair_loop<K>(in, tid, warp, lane, slice, st, acc);
  else if constexpr (P::kBulk) bulk_page_loop<K>(in, tid, warp, lane, slice, st, acc);
  else bf16_page_loop<K>(in, tid, warp, lane, st, acc);

  if constexpr (!P::kBulk) cp_async_wait<0>();
  write_partial<K>(a, sm, map, st, acc, b, kvh, split, tid, warp, lane, slice);
}

template <class F, int D, int OM, int NT>
__global__ void __launch_bounds__(kThreads, (SplitConfig<F, D, OM, NT>::Plan::kMinBlocks))
    decode_kernel(const KernelArgs a) {
  using K = SplitConfig<F, D, OM, NT>;
  extern __shared__ __align__(128) uint8_t smem[];
  const CtaSmem sm = carve_smem<typename K::Plan>(smem);

  // Launched as a programmatic dependent of the op that wrote the queries and the step's
  // K/V rows: the grid is set up while that op finishes; nothing is read before it has.
  cache::wait_for_producer();
  // The combine (a programmatic dependent) may launch once every CTA of this grid has
  // passed that wait: its CTAs then load their scalars (complete by then: every earlier
  // kernel has) and wait for this grid while it works.
  cache::allow_dependents();
  const int split = blockIdx.x, kvh = blockIdx.y, b = blockIdx.z;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  if (b >= a.batch || kvh >= a.kv_heads) return;
  // The row's scalars in one memory latency (no branch between the loads): sticky error
  // flags (step_plan.h: while any bit is set the step is skipped), active rows, length and
  // split plan.
  const int err = a.error_flags ? a.error_flags[0] : 0;
  const int rows = a.num_rows ? a.num_rows[0] : a.batch;
  const int n = a.seq_lens[b];
  const int row_splits = a.row_splits[b], pps = a.row_pps[b];
  if (err != 0 || b >= rows || n <= 0) return;
  const int G = a.G;

  const DecodeLayout lay = cache::attended_layout(n, F::kFormat, a.sink != 0, a.recent != 0);
  const int pages = lay.quant_pages;
  const int p_begin = split * pps, npg = min(p_begin + pps, pages) - p_begin;
  const bool bf16_cta = split == a.max_splits;  // the BF16 sink + recent CTA
  if (bf16_cta ? !F::kBulk || lay.bf16_tokens() <= 0
               : split >= min(row_splits, a.max_splits) || pps <= 0 || p_begin >= pages)
    return;

  // Both roles: the queries first (their latency overlaps the loads started next), then the
  // role's own loads, then the one query prologue (one copy of its code in the kernel).
  cache::detail::RowFrag<D> first_query;
  load_first_query<D>(a, b, kvh, warp, lane, first_query);
  const PageSource src{a, kvh, a.block_tables + size_t(b) * a.max_pages, pages, lay.last_page_tokens,
                       lay.masked_prefix, p_begin, npg};
  if (bf16_cta) {
    if (!start_sink_recent<D>(a, smem, b, kvh, lay, tid)) return;
  } else {
    start_split<K>(sm, src, tid);
  }
  rotate_queries<D>(a, first_query, sm.qf, b, kvh, warp, lane);
  if (bf16_cta) {
    if constexpr (F::kBulk) sink_recent_part<D>(a, smem, sm.qf, sm.red_max, b, kvh, lay, tid);
    return;
  }
  split_part<K>(a, sm, src, b, kvh, split, G, tid, warp, lane);
}

// ---- launchers (explicitly instantiated from kernel_instances.h) -----------------------------

template <class F, int D, int OM, int NT>
int decode_smem_bytes(int G) {
  return SplitConfig<F, D, OM, NT>::Plan::smem_bytes(G);
}

template <class F, int D, int OM, int NT>
cudaError_t configure_decode() {
  using P = typename SplitConfig<F, D, OM, NT>::Plan;
  return cudaFuncSetAttribute(decode_kernel<F, D, OM, NT>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                              P::smem_bytes(P::GMAX));
}

template <class F, int D, int OM, int NT>
void launch_decode(const KernelArgs& a, cudaStream_t stream) {
  const dim3 grid(a.max_splits + 1, a.kv_heads, a.batch);
  cache::launch_dependent(decode_kernel<F, D, OM, NT>, grid, dim3(kThreads), decode_smem_bytes<F, D, OM, NT>(a.G),
                          stream, a);
}

template <class F, int D, int OM, int NT>
int decode_occupancy(int G) {
  int n = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, decode_kernel<F, D, OM, NT>, kThreads,
                                                    decode_smem_bytes<F, D, OM, NT>(G)) != cudaSuccess)
    return 0;
  return n;
}

}  // namespace fp4kv::attention::detail
