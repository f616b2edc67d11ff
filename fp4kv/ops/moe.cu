// Qwen3-MoE block kernels (moe.h). The expert products are grouped by expert, so a batch reads
// each chosen expert's weights once: moe_route writes every row's experts; a one-CTA counting
// sort lists, per used expert in ascending order, the (row, slot) pairs routed to it; the
// gate_up and down kernels run one warp per (used expert, output feature) over that expert's
// pairs; a last kernel folds each row's expert outputs in ascending expert order.
//
// Two forms of the same arithmetic (ProductForm), chosen by the number of rows: one row (a
// single request's decode step: each chosen expert has one pair, 8 experts' rows, under two
// waves of CTAs) is latency-bound, so its kernels are programmatic dependents of the op before
// them (launch overlapped with that op's tail; each waits for its producer before reading
// anything, and the weights a warp reads depend on the routing, so none can be loaded
// earlier) and a product warp issues every weight chunk of its rows at once; more rows are
// throughput-bound (Qwen3-30B-A3B at 8 rows: ~50 experts, 6144 CTAs), where fewer registers
// per warp and plain launches measured faster (docs/PERF.md, "The MoE block at one row").
// Both forms sum each lane's products in k order: their outputs are the same bits.
#include "fp4kv/ops/moe.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "fp4kv/cache/cuda_check.h"
#include "fp4kv/cache/dependent_launch.cuh"
#include "fp4kv/ops/bf16x8.cuh"
#include "fp4kv/core/error.h"
#include "fp4kv/core/hd_math.h"
#include "fp4kv/ops/common.h"

namespace fp4kv::ops {
namespace {

constexpr unsigned kFullMask = 0xffffffffu;
constexpr int kRouteWarps = 4;                            // rows per routing CTA
constexpr int kExpertsPerLane = kMoeMaxExperts / 32;      // routing: experts lane, lane + 32, ...
constexpr int kProductWarps = 8;                          // output features per product CTA
constexpr int kPairsPerPass = 4;                          // pairs a product warp accumulates at once
constexpr int kLoadsInFlight = 4;                         // latency form: chunks of each row a lane loads at once
constexpr int kChunk = kBf16PerLoad;
static_assert(kMoeDimMultiple % kChunk == 0, "rows must be whole 16-byte loads");
constexpr int kSortThreads = 1024;
constexpr int kFoldThreads = 256;
constexpr int kMaxFoldBlocks = 4096;

// How the block's kernels launch and a product warp reads its weight rows (the file comment
// says when each is used).
enum class ProductForm { latency, throughput };

// A kernel's first statement: in the latency form (a programmatic dependent) it lets the next
// op set up its grid and waits for its producer; the throughput form leaves both to the plain
// launches (an early trigger there measured slower at 8 rows).
template <ProductForm Form>
__device__ __forceinline__ void enter() {
  if constexpr (Form == ProductForm::latency) {
    cache::allow_dependents();
    cache::wait_for_producer();
  }
}

__device__ __forceinline__ float round_bf16(float x) { return __bfloat162float(__float2bfloat16_rn(x)); }

// (value desc, index asc): the order top-k picks in.
__device__ __forceinline__ bool ranks_before(float v, int e, float bv, int be) { return v > bv || (v == bv && e < be); }

// ---- routing: one warp per row ----
template <ProductForm Form>
__global__ void __launch_bounds__(kRouteWarps * 32) moe_route_kernel(MoeRouteArgs a) {
  enter<Form>();  // the router's logits
  const int lane = threadIdx.x % 32;
  const int row = blockIdx.x * kRouteWarps + threadIdx.x / 32;
  if (row >= a.rows) return;
  const __nv_bfloat16* logits = a.logits + size_t(row) * a.num_experts;
  int32_t* experts = a.experts + size_t(row) * a.top_k;
  float* weights = a.weights + size_t(row) * a.top_k;
  float p[kExpertsPerLane];
  float m = -INFINITY;
  bool bad = false;
#pragma unroll
  for (int i = 0; i < kExpertsPerLane; ++i) {
    const int e = lane + 32 * i;
    p[i] = e < a.num_experts ? __bfloat162float(logits[e]) : -INFINITY;
    if (e < a.num_experts) {
      bad = bad || !isfinite(p[i]);
      m = fmaxf(m, p[i]);
    }
  }
  if (__any_sync(kFullMask, bad)) {  // defined output, never an out-of-range expert
    if (lane == 0) atomicOr(a.error_flags, kErrorRouterLogit);
    if (lane < a.top_k) experts[lane] = lane, weights[lane] = 0.0f;
    return;
  }
  for (int o = 16; o > 0; o /= 2) m = fmaxf(m, __shfl_xor_sync(kFullMask, m, o));
  double sum = 0;
#pragma unroll
  for (int i = 0; i < kExpertsPerLane; ++i) {
    if (lane + 32 * i < a.num_experts) {
      p[i] = exp_nonpositive(__fsub_rn(p[i], m));
      sum += double(p[i]);
    }
  }
  for (int o = 16; o > 0; o /= 2) sum += __shfl_xor_sync(kFullMask, sum, o);
  const float inv = float(1.0 / sum);
#pragma unroll
  for (int i = 0; i < kExpertsPerLane; ++i) p[i] = lane + 32 * i < a.num_experts ? __fmul_rn(p[i], inv) : -1.0f;

  int chosen[kMoeMaxTopK];
  float chosen_p[kMoeMaxTopK];
  float kept = 0.0f;
#pragma unroll
  for (int j = 0; j < kMoeMaxTopK; ++j) {
    if (j >= a.top_k) break;
    float bv = -2.0f;
    int be = kMoeMaxExperts;
#pragma unroll
    for (int i = 0; i < kExpertsPerLane; ++i) {
      if (ranks_before(p[i], lane + 32 * i, bv, be)) bv = p[i], be = lane + 32 * i;
    }
    for (int o = 16; o > 0; o /= 2) {
      const float ov = __shfl_xor_sync(kFullMask, bv, o);
      const int oe = __shfl_xor_sync(kFullMask, be, o);
      if (ranks_before(ov, oe, bv, be)) bv = ov, be = oe;
    }
    chosen[j] = be;
    chosen_p[j] = bv;
    kept = __fadd_rn(kept, bv);
    if (be % 32 == lane) p[be / 32] = -2.0f;  // taken: below every probability and padding
  }
  if (lane != 0) return;
  // Ascending expert order (insertion sort of at most 16), weights rounded to BF16.
  for (int j = 0; j < a.top_k; ++j) {
    const float w = a.normalize_top_k ? __fdiv_rn(chosen_p[j], kept) : chosen_p[j];
    int at = j;
    while (at > 0 && experts[at - 1] > chosen[j]) {
      experts[at] = experts[at - 1];
      weights[at] = weights[at - 1];
      --at;
    }
    experts[at] = chosen[j];
    weights[at] = round_bf16(w);
  }
}

// ---- grouping: the pairs of every used expert, one CTA ----
// used[0] = number of used experts, used[1 + s] = the s-th (ascending, counted from
// first_expert: pairs of experts outside the held range are left out); begin[s] .. begin[s + 1]
// its range in `pairs`. Within a range the order is the atomics' (each pair's output does not
// depend on it).
template <ProductForm Form>
__global__ void __launch_bounds__(kSortThreads)
    moe_group_kernel(const int32_t* experts, int num_pairs, int first_expert, int num_experts, MoeWorkspace ws) {
  __shared__ int32_t count[kMoeMaxExperts], offset[kMoeMaxExperts];
  enter<Form>();  // the routing
  for (int e = threadIdx.x; e < num_experts; e += blockDim.x) count[e] = 0;
  __syncthreads();
  for (int p = threadIdx.x; p < num_pairs; p += blockDim.x) {
    const int e = experts[p] - first_expert;
    if (e >= 0 && e < num_experts) atomicAdd(&count[e], 1);
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    int total = 0, slots = 0;
    for (int e = 0; e < num_experts; ++e) {
      offset[e] = total;
      if (count[e] > 0) {
        ws.used[1 + slots] = e;
        ws.begin[slots] = total;
        ++slots;
      }
      total += count[e];
    }
    ws.used[0] = slots;
    ws.begin[slots] = total;
  }
  for (int e = threadIdx.x; e < num_experts; e += blockDim.x) ws.cursor[e] = 0;
  __syncthreads();
  for (int p = threadIdx.x; p < num_pairs; p += blockDim.x) {
    const int e = experts[p] - first_expert;
    if (e >= 0 && e < num_experts) ws.pairs[offset[e] + atomicAdd(&ws.cursor[e], 1)] = p;
  }
}

// Pair i's chunk c of X, widened.
template <int N>
__device__ __forceinline__ void load_x_chunk(const __nv_bfloat16* const (&x_rows)[N], int i, int c,
                                             float (&xf)[kChunk]) {
  bf16x8_to_float(__ldg(reinterpret_cast<const uint4*>(x_rows[i]) + c), xf);
}

// acc += <wf, xf>, in element order.
__device__ __forceinline__ void fma_chunk(const float (&wf)[kChunk], const float (&xf)[kChunk], float& acc) {
#pragma unroll
  for (int t = 0; t < kChunk; ++t) acc = fmaf(wf[t], xf[t], acc);
}

// acc[i] summed over the warp (a butterfly: every lane gets the sums).
template <int N>
__device__ __forceinline__ void warp_sum_all(float (&acc)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) {
    for (int o = 16; o > 0; o /= 2) acc[i] += __shfl_xor_sync(kFullMask, acc[i], o);
  }
}

// Dot products of `n` pairs' rows of X (x_rows[i] points at row i) with R weight rows
// (w_rows[r]): acc[r][i] = <W_r, X_i>, accumulated per lane in k order (chunks lane,
// lane + 32, ...), then summed over the warp; every lane gets the sums. The latency form
// issues the lane's next kLoadsInFlight chunks of every weight row before it uses any; the
// throughput form runs the rows one after another with four chunks in flight, in fewer
// registers.
template <ProductForm Form, int R, int N>
__device__ __forceinline__ void warp_dots(const __nv_bfloat16* const (&x_rows)[N], int n,
                                          const uint4* const (&w_rows)[R], int chunks, float (&acc)[R][N]) {
  const int lane = threadIdx.x % 32;
  if constexpr (Form == ProductForm::latency) {
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int i = 0; i < N; ++i) acc[r][i] = 0.0f;
    for (int c0 = lane; c0 < chunks; c0 += 32 * kLoadsInFlight) {
      uint4 w[R][kLoadsInFlight];
#pragma unroll
      for (int b = 0; b < kLoadsInFlight; ++b)
#pragma unroll
        for (int r = 0; r < R; ++r)
          if (c0 + 32 * b < chunks) w[r][b] = __ldg(w_rows[r] + c0 + 32 * b);
#pragma unroll
      for (int b = 0; b < kLoadsInFlight; ++b) {
        const int c = c0 + 32 * b;
        if (c >= chunks) break;
#pragma unroll
        for (int i = 0; i < N; ++i) {
          if (i >= n) break;
          float xf[kChunk];
          load_x_chunk(x_rows, i, c, xf);
#pragma unroll
          for (int r = 0; r < R; ++r) {
            float wf[kChunk];
            bf16x8_to_float(w[r][b], wf);
            fma_chunk(wf, xf, acc[r][i]);
          }
        }
      }
    }
#pragma unroll
    for (int r = 0; r < R; ++r) warp_sum_all(acc[r]);
  } else {
#pragma unroll
    for (int r = 0; r < R; ++r) {
#pragma unroll
      for (int i = 0; i < N; ++i) acc[r][i] = 0.0f;
#pragma unroll 4  // loads of four chunks in flight; each acc[r][i] still sums in k order
      for (int c = lane; c < chunks; c += 32) {
        float wf[kChunk];
        bf16x8_to_float(__ldg(w_rows[r] + c), wf);
#pragma unroll
        for (int i = 0; i < N; ++i) {
          if (i >= n) break;
          float xf[kChunk];
          load_x_chunk(x_rows, i, c, xf);
          fma_chunk(wf, xf, acc[r][i]);
        }
      }
      warp_sum_all(acc[r]);
    }
  }
}

// v[i] for a runtime i, selected from registers (indexing the array would put it in local memory).
template <int N>
__device__ __forceinline__ float element(const float (&v)[N], int i) {
  float r = v[0];
#pragma unroll
  for (int t = 1; t < N; ++t) {
    if (t == i) r = v[t];
  }
  return r;
}

// ---- gate_up + SwiGLU: one warp per (used expert slot, intermediate feature c) ----
template <ProductForm Form>
__global__ void __launch_bounds__(kProductWarps * 32)
    moe_gate_up_kernel(MoeExpertsArgs a, MoeWorkspace ws) {
  enter<Form>();  // the grouping
  const int32_t *used = ws.used, *begin = ws.begin, *pairs = ws.pairs;
  const int slot = blockIdx.y;
  const int c = blockIdx.x * kProductWarps + threadIdx.x / 32;
  if (slot >= used[0] || c >= a.intermediate) return;
  const int e = used[1 + slot];
  const int chunks = a.hidden / kChunk;
  const uint4* const w_rows[2] = {  // the gate row, then the up row
      reinterpret_cast<const uint4*>(a.gate_up + (size_t(e) * 2 * a.intermediate + c) * a.hidden),
      reinterpret_cast<const uint4*>(a.gate_up + (size_t(e) * 2 * a.intermediate + a.intermediate + c) * a.hidden)};
  for (int first = begin[slot]; first < begin[slot + 1]; first += kPairsPerPass) {
    const int n = min(kPairsPerPass, begin[slot + 1] - first);
    const __nv_bfloat16* x_rows[kPairsPerPass];
#pragma unroll
    for (int i = 0; i < kPairsPerPass; ++i) {
      const int pair = pairs[first + min(i, n - 1)];
      x_rows[i] = a.x + size_t(pair / a.top_k) * a.hidden;
    }
    float gu[2][kPairsPerPass];  // gate, up
    warp_dots<Form>(x_rows, n, w_rows, chunks, gu);
    if (threadIdx.x % 32 < n) {  // lane i writes pair i
      const int i = threadIdx.x % 32;
      const float act = round_bf16(silu(round_bf16(element(gu[0], i))));
      a.act[size_t(pairs[first + i]) * a.intermediate + c] =
          __float2bfloat16_rn(__fmul_rn(act, round_bf16(element(gu[1], i))));
    }
  }
}

// ---- down: one warp per (used expert slot, hidden feature h); y[pair][h] = bf16(act . W_down) ----
template <ProductForm Form>
__global__ void __launch_bounds__(kProductWarps * 32)
    moe_down_kernel(MoeCombineArgs a, MoeWorkspace ws) {
  enter<Form>();  // the experts' activations
  const int32_t *used = ws.used, *begin = ws.begin, *pairs = ws.pairs;
  __nv_bfloat16* y = ws.y;
  const int slot = blockIdx.y;
  const int h = blockIdx.x * kProductWarps + threadIdx.x / 32;
  if (slot >= used[0] || h >= a.hidden) return;
  const int e = used[1 + slot];
  const uint4* const w_rows[1] = {reinterpret_cast<const uint4*>(a.down + (size_t(e) * a.hidden + h) * a.intermediate)};
  for (int first = begin[slot]; first < begin[slot + 1]; first += kPairsPerPass) {
    const int n = min(kPairsPerPass, begin[slot + 1] - first);
    const __nv_bfloat16* act_rows[kPairsPerPass];
#pragma unroll
    for (int i = 0; i < kPairsPerPass; ++i) act_rows[i] = a.act + size_t(pairs[first + min(i, n - 1)]) * a.intermediate;
    float d[1][kPairsPerPass];
    warp_dots<Form>(act_rows, n, w_rows, a.intermediate / kChunk, d);
    if (threadIdx.x % 32 < n) {  // lane i writes pair i
      const int i = threadIdx.x % 32;
      y[size_t(pairs[first + i]) * a.hidden + h] = __float2bfloat16_rn(element(d[0], i));
    }
  }
}

// ---- fold: out[row][h] = the row's expert outputs times their weights, ascending experts ----
template <ProductForm Form>
__global__ void __launch_bounds__(kFoldThreads) moe_fold_kernel(MoeCombineArgs a, const __nv_bfloat16* y) {
  enter<Form>();  // the experts' outputs
  const int64_t total = int64_t(a.rows) * a.hidden;
  for (int64_t i = int64_t(blockIdx.x) * kFoldThreads + threadIdx.x; i < total; i += int64_t(gridDim.x) * kFoldThreads) {
    const int64_t row = i / a.hidden, h = i % a.hidden;
    float acc = 0.0f;
    for (int j = 0; j < a.top_k; ++j) {
      const int64_t pair = row * a.top_k + j;
      const int e = a.experts[pair] - a.first_expert;
      if (e < 0 || e >= a.num_experts) continue;  // another rank's expert
      const float term = round_bf16(__fmul_rn(__bfloat162float(y[pair * a.hidden + h]), a.weights[pair]));
      acc = round_bf16(__fadd_rn(acc, term));
    }
    a.out[i] = __float2bfloat16_rn(acc);
  }
}

// The form for `rows` rows (the file comment says why).
ProductForm product_form(int rows) { return rows == 1 ? ProductForm::latency : ProductForm::throughput; }

// A kernel of the block in `form`: its latency instance as a programmatic dependent, or its
// throughput instance plainly.
template <class... Params, class... Args>
void launch(ProductForm form, void (*latency)(Params...), void (*throughput)(Params...), dim3 grid, dim3 block,
            cudaStream_t stream, Args... args) {
  if (form == ProductForm::latency)
    cache::launch_dependent(latency, grid, block, 0, stream, args...);
  else
    throughput<<<grid, block, 0, stream>>>(args...);
}

// Runs per layer of every eager step: the message is built only on failure.
void require_product_dims(const char* op, int rows, int top_k, int num_experts, int hidden, int intermediate) {
  if (rows >= 0 && top_k >= 1 && top_k <= kMoeMaxTopK && num_experts >= 1 && num_experts <= kMoeMaxExperts &&
      hidden > 0 && intermediate > 0 && hidden % kMoeDimMultiple == 0 && intermediate % kMoeDimMultiple == 0)
    return;
  throw Error(std::string(op) + ": bad sizes (rows " + std::to_string(rows) + ", top_k " + std::to_string(top_k) +
              ", num_experts " + std::to_string(num_experts) + ", hidden " + std::to_string(hidden) +
              ", intermediate " + std::to_string(intermediate) + "; hidden and intermediate must be multiples of " +
              std::to_string(kMoeDimMultiple) + ", top_k in [1, " + std::to_string(kMoeMaxTopK) +
              "], num_experts in [1, " + std::to_string(kMoeMaxExperts) + "])");
}

}  // namespace

size_t moe_workspace_bytes(int max_rows, int top_k, int hidden, int num_experts) {
  const size_t pairs = size_t(max_rows) * top_k;
  const size_t ints = (1 + size_t(num_experts)) + (size_t(num_experts) + 1) + size_t(num_experts) + pairs;
  return (ints * sizeof(int32_t) + 255) / 256 * 256 + pairs * size_t(hidden) * sizeof(__nv_bfloat16);
}

MoeWorkspace moe_workspace(void* base, int max_rows, int top_k, int num_experts) {
  MoeWorkspace w;
  auto* ints = static_cast<int32_t*>(base);
  w.used = ints;
  w.begin = w.used + 1 + num_experts;
  w.cursor = w.begin + num_experts + 1;
  w.pairs = w.cursor + num_experts;
  const size_t int_bytes = size_t(w.pairs + size_t(max_rows) * top_k - ints) * sizeof(int32_t);
  w.y = reinterpret_cast<__nv_bfloat16*>(static_cast<char*>(base) + (int_bytes + 255) / 256 * 256);
  return w;
}

void moe_route(const MoeRouteArgs& a, cudaStream_t stream) {
  if (a.num_experts < 1 || a.num_experts > kMoeMaxExperts)
    throw Error("moe_route: num_experts " + std::to_string(a.num_experts) + " outside [1, " +
                std::to_string(kMoeMaxExperts) + "]");
  if (a.top_k < 1 || a.top_k > std::min(a.num_experts, kMoeMaxTopK))
    throw Error("moe_route: top_k " + std::to_string(a.top_k) + " outside [1, min(num_experts, " +
                std::to_string(kMoeMaxTopK) + ")]");
  if (a.rows < 0) throw Error("moe_route: rows " + std::to_string(a.rows) + " is negative");
  if (a.rows == 0) return;
  if (!a.logits || !a.experts || !a.weights || !a.error_flags) throw Error("moe_route: a device pointer is null");
  const ProductForm form = product_form(a.rows);
  launch(form, moe_route_kernel<ProductForm::latency>, moe_route_kernel<ProductForm::throughput>,
         dim3((a.rows + kRouteWarps - 1) / kRouteWarps), dim3(kRouteWarps * 32), stream, a);
  cache::cuda_check_launch("moe_route");
}

void moe_experts(const MoeExpertsArgs& a, const MoeWorkspace& ws, cudaStream_t stream) {
  require_product_dims("moe_experts", a.rows, a.top_k, a.num_experts, a.hidden, a.intermediate);
  if (a.first_expert < 0) throw Error("moe_experts: first_expert " + std::to_string(a.first_expert) + " is negative");
  if (a.rows == 0) return;
  if (!a.x || !a.gate_up || !a.experts || !a.act || !ws.used || !ws.y)
    throw Error("moe_experts: a device pointer is null");
  const int pairs = a.rows * a.top_k;
  const ProductForm form = product_form(a.rows);
  launch(form, moe_group_kernel<ProductForm::latency>, moe_group_kernel<ProductForm::throughput>, dim3(1),
         dim3(kSortThreads), stream, a.experts, pairs, a.first_expert, a.num_experts, ws);
  cache::cuda_check_launch("moe_experts: grouping");
  const dim3 grid((a.intermediate + kProductWarps - 1) / kProductWarps, std::min(a.num_experts, pairs));
  launch(form, moe_gate_up_kernel<ProductForm::latency>, moe_gate_up_kernel<ProductForm::throughput>, grid,
         dim3(kProductWarps * 32), stream, a, ws);
  cache::cuda_check_launch("moe_experts: gate_up");
}

void moe_combine(const MoeCombineArgs& a, const MoeWorkspace& ws, cudaStream_t stream) {
  require_product_dims("moe_combine", a.rows, a.top_k, a.num_experts, a.hidden, a.intermediate);
  if (a.first_expert < 0) throw Error("moe_combine: first_expert " + std::to_string(a.first_expert) + " is negative");
  if (a.rows == 0) return;
  if (!a.act || !a.down || !a.experts || !a.weights || !a.out || !ws.used || !ws.y)
    throw Error("moe_combine: a device pointer is null");
  const int pairs = a.rows * a.top_k;
  const dim3 grid((a.hidden + kProductWarps - 1) / kProductWarps, std::min(a.num_experts, pairs));
  const ProductForm form = product_form(a.rows);
  launch(form, moe_down_kernel<ProductForm::latency>, moe_down_kernel<ProductForm::throughput>, grid,
         dim3(kProductWarps * 32), stream, a, ws);
  cache::cuda_check_launch("moe_combine: down");
  const int64_t total = int64_t(a.rows) * a.hidden;
  const int blocks = int(std::min<int64_t>(kMaxFoldBlocks, (total + kFoldThreads - 1) / kFoldThreads));
  launch(form, moe_fold_kernel<ProductForm::latency>, moe_fold_kernel<ProductForm::throughput>, dim3(blocks),
         dim3(kFoldThreads), stream, a, static_cast<const __nv_bfloat16*>(ws.y));
  cache::cuda_check_launch("moe_combine: fold");
}

}  // namespace fp4kv::ops
