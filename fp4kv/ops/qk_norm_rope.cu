// QK-norm + RoPE kernels: one warp per (token, head) over the q, k and v heads of the QKV
// row; a lane handles the rotation pairs (i, i + half) for i = lane, lane + 32, ... The
// decode step's form appends the k and v rows to the cache itself (qk_norm_rope_append). At a
// decode step the kernel is a few L2 round trips long, so what does not depend on the QKV
// GEMM (position, norm weights, cos/sin) is loaded before waiting for it, and a lane loads
// everything it reads before it stores anything (a store between two loads, which might
// alias, would make each load its own round trip).
#include "fp4kv/ops/qk_norm_rope.h"

#include <cmath>
#include <string>

#include "fp4kv/cache/append_row.cuh"
#include "fp4kv/cache/cuda_check.h"
#include "fp4kv/core/error.h"
#include "fp4kv/core/half.h"
#include "fp4kv/ops/common.h"
#include "fp4kv/core/hd_math.h"
#include "fp4kv/cache/dependent_launch.cuh"

namespace fp4kv::ops {
namespace {

constexpr int kWarpsPerBlock = 4;
constexpr int kThreads = kWarpsPerBlock * 32;
constexpr unsigned kFullMask = 0xffffffffu;
constexpr int kMaxHeadDim = 256;
constexpr int kMaxPerLane = kMaxHeadDim / 32;  // a head's elements per lane
constexpr int kMaxPairsPerLane = kMaxPerLane / 2;

__device__ float bf16_round(float x) { return __bfloat162float(__float2bfloat16_rn(x)); }

__device__ float warp_sum(float v) {
  for (int off = 16; off > 0; off /= 2) v = __fadd_rn(v, __shfl_xor_sync(kFullMask, v, off));
  return v;
}

// Where one head's outputs go: either may be null (the value is BF16-exact: both agree). f32
// is global memory, or the warp's row in shared memory for the cache append that follows.
struct HeadOut {
  __nv_bfloat16* bf16 = nullptr;
  float* f32 = nullptr;
};

__device__ void store(const HeadOut& out, int i, float value) {
  if (out.bf16 != nullptr) out.bf16[i] = __float2bfloat16_rn(value);
  if (out.f32 != nullptr) out.f32[i] = value;
}

// Element i = lane + 32 j of a head, j < kMaxPerLane (0 past head_dim), widened.
__device__ __forceinline__ void load_lane(const __nv_bfloat16* x, int head_dim, float (&v)[kMaxPerLane]) {
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int j = 0; j < kMaxPerLane; ++j) {
    const int i = lane + 32 * j;
    v[j] = i < head_dim ? __bfloat162float(x[i]) : 0.0f;
  }
}

// What a lane needs of a head besides its values: for its rotation pairs p = (i, i + half),
// i = lane + 32 p, the norm weights and the position's cos/sin. None of it comes from the
// kernel's producer, so it is loaded before waiting for it.
struct PairConstants {
  bool rotate = false;  // false: the position is outside the table (outputs zero)
  float w1[kMaxPairsPerLane], w2[kMaxPairsPerLane], c[kMaxPairsPerLane], sn[kMaxPairsPerLane];
};

__device__ __forceinline__ void load_pair_constants(const __nv_bfloat16* weight, const __nv_bfloat16* cos_row,
                                                    const __nv_bfloat16* sin_row, int head_dim, PairConstants& pc) {
  const int lane = threadIdx.x % 32, half = head_dim / 2;
  pc.rotate = cos_row != nullptr;
#pragma unroll
  for (int p = 0; p < kMaxPairsPerLane; ++p) {
    const int i = lane + 32 * p;
    if (i >= half || !pc.rotate) continue;
    pc.w1[p] = __bfloat162float(weight[i]);
    pc.w2[p] = __bfloat162float(weight[i + half]);
    pc.c[p] = __bfloat162float(cos_row[i]);
    pc.sn[p] = __bfloat162float(sin_row[i]);
  }
}

// Normalizes and rotates one head x[head_dim] into `out`.
__device__ void norm_rope_head(const __nv_bfloat16* x, const PairConstants& pc, const HeadOut& out, int head_dim,
                               float eps) {
  const int lane = threadIdx.x % 32, half = head_dim / 2;
  float xs[kMaxPerLane];
  load_lane(x, head_dim, xs);
  float x2[kMaxPairsPerLane];  // x_{i + half} of pair p (x_i is xs[p])
#pragma unroll
  for (int p = 0; p < kMaxPairsPerLane; ++p) {
    const int i = lane + 32 * p;
    if (i >= half || !pc.rotate) continue;
    x2[p] = __bfloat162float(x[i + half]);
  }
  float ss = 0.0f;
#pragma unroll
  for (int j = 0; j < kMaxPerLane; ++j) {
    if (lane + 32 * j < head_dim) ss = __fadd_rn(ss, __fmul_rn(xs[j], xs[j]));
  }
  const float r = rms_scale(__fdiv_rn(warp_sum(ss), float(head_dim)), eps);
#pragma unroll
  for (int p = 0; p < kMaxPairsPerLane; ++p) {
    const int i = lane + 32 * p;
    if (i >= half) continue;
    if (!pc.rotate) {
      store(out, i, 0.0f);
      store(out, i + half, 0.0f);
      continue;
    }
    const float n1 = bf16_round(__fmul_rn(pc.w1[p], bf16_round(__fmul_rn(xs[p], r))));
    const float n2 = bf16_round(__fmul_rn(pc.w2[p], bf16_round(__fmul_rn(x2[p], r))));
    store(out, i, bf16_round(__fsub_rn(bf16_round(__fmul_rn(n1, pc.c[p])), bf16_round(__fmul_rn(n2, pc.sn[p])))));
    store(out, i + half, bf16_round(__fadd_rn(bf16_round(__fmul_rn(n2, pc.c[p])), bf16_round(__fmul_rn(n1, pc.sn[p])))));
  }
}

// The v heads' copy: row `row` of v (and v_bf16).
__device__ void copy_value_head(const QkNormRopeArgs& a, const __nv_bfloat16* x, size_t row) {
  const int lane = threadIdx.x % 32, d = a.head_dim;
  float v[kMaxPerLane];
  load_lane(x, d, v);
#pragma unroll
  for (int k = 0; k < kMaxPerLane; ++k) {
    const int i = lane + 32 * k;
    if (i >= d) continue;
    a.v[row + i] = v[k];
    if (a.v_bf16) a.v_bf16[row + i] = __float2bfloat16_rn(v[k]);  // exact: v is BF16-valued
  }
}

// One warp per (token, head). The position, the norm weights and the RoPE row are read before
// waiting for the QKV GEMM (the producer): positions are uploaded before the step and the
// rest is constant, so after the wait only the head's values are a memory latency away.
// A warp's job: head j of token t (q heads, then k, then v), and for a q or k head what does
// not come from the producer (loaded before the kernel waits for it).
struct HeadJob {
  bool has_job = false;
  int t = 0, j = 0;
  bool is_q = false, is_v = false;
  bool valid = false;  // the position indexes the RoPE table
  PairConstants pc;
};

__device__ __forceinline__ HeadJob head_job(const QkNormRopeArgs& a, int d) {
  HeadJob h;
  const int heads = a.q_heads + 2 * a.kv_heads;
  const int64_t job = int64_t(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  h.has_job = job < int64_t(a.tokens) * heads;
  if (!h.has_job) return h;
  h.t = int(job / heads);
  h.j = int(job % heads);
  h.is_q = h.j < a.q_heads;
  h.is_v = h.j >= a.q_heads + a.kv_heads;
  if (h.is_v) return h;
  const int pos = a.positions[h.t];
  h.valid = pos >= 0 && pos < a.rope_positions;
  const size_t rope_row = size_t(h.valid ? pos : 0) * (d / 2);
  load_pair_constants(h.is_q ? a.q_norm : a.k_norm, h.valid ? a.rope_cos + rope_row : nullptr,
                      h.valid ? a.rope_sin + rope_row : nullptr, d, h.pc);
  return h;
}

// A position outside the table raises the flag once per token (its first head).
__device__ __forceinline__ void flag_bad_position(const QkNormRopeArgs& a, const HeadJob& h) {
  if (!h.valid && !h.is_v && threadIdx.x % 32 == 0 && h.j == 0) atomicOr(a.error_flags, kErrorPositionOutOfRange);
}

__global__ void __launch_bounds__(kThreads) qk_norm_rope_kernel(const QkNormRopeArgs a) {
  cache::allow_dependents();  // the cache's append may set up its grid
  const int d = a.head_dim, heads = a.q_heads + 2 * a.kv_heads;
  const HeadJob h = head_job(a, d);
  cache::wait_for_producer();  // launched as a programmatic dependent of the QKV GEMM
  if (!h.has_job) return;
  const int t = h.t, j = h.j;
  const __nv_bfloat16* x = a.qkv + (size_t(t) * heads + j) * d;
  if (h.is_v) {
    copy_value_head(a, x, (size_t(t) * a.kv_heads + (j - a.q_heads - a.kv_heads)) * d);
    return;
  }
  flag_bad_position(a, h);
  HeadOut out;
  if (h.is_q) {
    out.bf16 = a.q + (size_t(t) * a.q_heads + j) * d;
  } else {
    const size_t row = (size_t(t) * a.kv_heads + (j - a.q_heads)) * d;
    out.f32 = a.k + row;
    out.bf16 = a.k_bf16 ? a.k_bf16 + row : nullptr;
  }
  norm_rope_head(x, h.pc, out, d, a.eps);
}

// The heads of one token as qk_norm_rope_kernel's jobs, with the cache append fused in: a k
// head's warp stages its normed, rotated row in shared memory and appends it (key
// transform, BF16 rounding, the slot or pool row: cache/append_row.cuh), a v head's warp
// appends its row as loaded; q heads as above. The append's target (error flags, length,
// slot) is loaded with the head's values, after the wait: the step's control kernel wrote it.
template <int D>
__global__ void __launch_bounds__(kThreads) qk_norm_rope_append_kernel(const QkNormRopeArgs a,
                                                                       const cache::AppendTarget target) {
  __shared__ float staged[kWarpsPerBlock][D];
  cache::allow_dependents();
  const int heads = a.q_heads + 2 * a.kv_heads, warp = threadIdx.x / 32;
  const HeadJob h = head_job(a, D);
  cache::wait_for_producer();  // launched as a programmatic dependent of the QKV GEMM
  if (!h.has_job) return;
  const int t = h.t, j = h.j;
  const __nv_bfloat16* x = a.qkv + (size_t(t) * heads + j) * D;
  flag_bad_position(a, h);
  if (h.is_q) {
    HeadOut out;
    out.bf16 = a.q + (size_t(t) * a.q_heads + j) * D;
    norm_rope_head(x, h.pc, out, D, a.eps);
    return;
  }
  const int kv = h.is_v ? 1 : 0, head = j - a.q_heads - kv * a.kv_heads;
  cache::AppendRowSite site;
  if (!cache::append_row_site(target, t, head, kv, site)) return;
  const int lane = threadIdx.x % 32;
  cache::detail::RowFrag<D> row;
  if (h.is_v) {
#pragma unroll
    for (int i = 0; i < D / 32; ++i) row.x[i] = __bfloat162float(x[lane * (D / 32) + i]);
  } else {
    HeadOut out;
    out.f32 = staged[warp];
    norm_rope_head(x, h.pc, out, D, a.eps);
    __syncwarp();
#pragma unroll
    for (int i = 0; i < D / 32; ++i) row.x[i] = staged[warp][lane * (D / 32) + i];
  }
  cache::append_row<D>(target, site, row);
}

}  // namespace

RopeTable make_rope_table(int head_dim, double rope_theta, int positions) {
  require(head_dim > 0 && head_dim % 2 == 0,
          "make_rope_table: head_dim " + std::to_string(head_dim) + " must be positive and even");
  require(rope_theta > 0, "make_rope_table: rope_theta " + std::to_string(rope_theta) + " must be positive");
  require(positions > 0, "make_rope_table: positions " + std::to_string(positions) + " must be positive");
  RopeTable t;
  t.head_dim = head_dim;
  t.positions = positions;
  const int half = head_dim / 2;
  t.cos_bits.resize(size_t(positions) * half);
  t.sin_bits.resize(t.cos_bits.size());
  for (int i = 0; i < half; ++i) {
    // transformers (default RoPE) in float32, as model/qwen3.cpp.
    const float inv_freq = 1.0f / std::pow(float(rope_theta), float(2 * i) / float(head_dim));
    for (int p = 0; p < positions; ++p) {
      const float angle = float(p) * inv_freq;
      t.cos_bits[size_t(p) * half + i] = float_to_bf16_bits(std::cos(angle));
      t.sin_bits[size_t(p) * half + i] = float_to_bf16_bits(std::sin(angle));
    }
  }
  return t;
}

namespace {

// The checks both forms share (messages built only on failure: they run once per layer of a
// step).
void check_rope_scalars(const char* who, const QkNormRopeArgs& a) {
  if (a.rope_positions <= 0)
    throw Error(std::string(who) + ": rope_positions " + std::to_string(a.rope_positions) + " must be positive");
  if (!(a.eps >= 0.0f)) throw Error(std::string(who) + ": eps " + std::to_string(a.eps) + " is negative");
}
// float_kv: the form that writes k and v to global memory (the append form hands them to the
// cache instead).
void check_rope_pointers(const char* who, const QkNormRopeArgs& a, bool float_kv) {
  if (!(a.qkv && a.positions && a.q_norm && a.k_norm && a.rope_cos && a.rope_sin && a.q && a.error_flags) ||
      (float_kv && !(a.k && a.v)))
    throw Error(std::string(who) + ": a device pointer is null");
}

// One warp per (token, head).
dim3 job_grid(const QkNormRopeArgs& a) {
  const int64_t warps = int64_t(a.tokens) * (a.q_heads + 2 * a.kv_heads);
  return dim3(unsigned((warps + kWarpsPerBlock - 1) / kWarpsPerBlock));
}

}  // namespace

void qk_norm_rope(const QkNormRopeArgs& a, cudaStream_t stream) {
  require(a.tokens >= 0, "qk_norm_rope: tokens " + std::to_string(a.tokens) + " is negative");
  require(a.q_heads > 0 && a.kv_heads > 0, "qk_norm_rope: q_heads " + std::to_string(a.q_heads) + " and kv_heads " +
                                               std::to_string(a.kv_heads) + " must be positive");
  require(a.head_dim > 0 && a.head_dim % 2 == 0 && a.head_dim <= kMaxHeadDim,
          "qk_norm_rope: head_dim " + std::to_string(a.head_dim) + " must be positive, even and at most " +
              std::to_string(kMaxHeadDim));
  check_rope_scalars("qk_norm_rope", a);
  if (a.tokens == 0) return;
  check_rope_pointers("qk_norm_rope", a, true);
  cache::launch_dependent(qk_norm_rope_kernel, job_grid(a), dim3(kThreads), 0, stream, a);
  cache::cuda_check_launch("qk_norm_rope");
}

void qk_norm_rope_append(const QkNormRopeArgs& a, const cache::AppendTarget& target, cudaStream_t stream) {
  const cache::detail::CacheDims& c = target.dims;
  require(a.tokens >= 1 && a.tokens == target.step.batch,
          "qk_norm_rope_append: tokens " + std::to_string(a.tokens) + " must equal the cache step's batch " +
              std::to_string(target.step.batch));
  require(a.q_heads > 0 && a.kv_heads == c.heads && a.head_dim == c.d && !c.latent(),
          "qk_norm_rope_append: q_heads " + std::to_string(a.q_heads) + ", kv_heads " + std::to_string(a.kv_heads) +
              ", head_dim " + std::to_string(a.head_dim) + " do not fit the cache (" + std::to_string(c.heads) +
              " KV heads of " + std::to_string(c.d) + ", not latent)");
  check_rope_scalars("qk_norm_rope_append", a);
  check_rope_pointers("qk_norm_rope_append", a, false);
  const dim3 grid = job_grid(a);
  switch (a.head_dim) {
    case 64: cache::launch_dependent(qk_norm_rope_append_kernel<64>, grid, dim3(kThreads), 0, stream, a, target); break;
    case 128: cache::launch_dependent(qk_norm_rope_append_kernel<128>, grid, dim3(kThreads), 0, stream, a, target); break;
    case 256: cache::launch_dependent(qk_norm_rope_append_kernel<256>, grid, dim3(kThreads), 0, stream, a, target); break;
    default: throw Error("qk_norm_rope_append: head_dim " + std::to_string(a.head_dim) + " is not 64, 128 or 256");
  }
  cache::cuda_check_launch("qk_norm_rope_append");
}

}  // namespace fp4kv::ops
