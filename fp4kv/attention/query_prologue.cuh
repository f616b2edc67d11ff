// The query prologue of a decode CTA: the G queries of (row, KV head) loaded (FP32 or BF16,
// non-finite -> 0), rotated by the recipe's Hadamard transform, and turned into the B
// operand of S^T = K Q^T: FP16/BF16 columns in mixed mode, or FP4 codes (NVFP4 or MXFP4,
// one term or the dual-residual pair) with their FP32 factors in native mode. Every value
// is the CPU reference's (core/operand_quant.h, core/block_quant.h): same rules, same order.
#pragma once

#include "fp4kv/attention/device_common.cuh"
#include "fp4kv/attention/fragment.h"
#include "fp4kv/attention/page_traits.cuh"
#include "fp4kv/cache/warp_hadamard.cuh"
#include "fp4kv/core/block_quant.h"
#include "fp4kv/core/minifloat.h"
#include "fp4kv/core/operand_quant.h"

namespace fp4kv::attention::detail {

inline constexpr int kNoExponent = -1000;  // an all-zero block: sets no shift

// The BF16 query words of one lane: a volatile non-coherent load, so the compiler keeps it
// inside its branch instead of issuing it beside the FP32 load and selecting (the type is
// uniform over the grid; a speculated second load costs instructions in every CTA).
template <int W>
__device__ __forceinline__ void ldg_words(const void* p, uint32_t (&w)[W]) {
  if constexpr (W == 1) {
    asm volatile("ld.global.nc.u32 %0, [%1];" : "=r"(w[0]) : "l"(p));
  } else if constexpr (W == 2) {
    asm volatile("ld.global.nc.v2.u32 {%0, %1}, [%2];" : "=r"(w[0]), "=r"(w[1]) : "l"(p));
  } else {
    static_assert(W == 4);
    asm volatile("ld.global.nc.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(w[0]), "=r"(w[1]), "=r"(w[2]), "=r"(w[3])
                 : "l"(p));
  }
}

// E consecutive query elements from `offset` (E = 2, 4, 8; offset a multiple of E, the
// array 16-byte aligned): one vector load of either I/O type, widened to FP32 (exact).
template <int E>
__device__ __forceinline__ void load_query_lane(const void* q, IoType type, size_t offset, float (&x)[E]) {
  if (type == IoType::bf16) {
    uint32_t w[E / 2];
    ldg_words<E / 2>(static_cast<const uint16_t*>(q) + offset, w);
#pragma unroll
    for (int k = 0; k < E / 2; ++k) {
      x[2 * k] = bf16_low_as_float(w[k]);
      x[2 * k + 1] = bf16_high_as_float(w[k]);
    }
    return;
  }
  const float* src = static_cast<const float*>(q) + offset;
  if constexpr (E == 2) {
    const float2 v = __ldg(reinterpret_cast<const float2*>(src));
    x[0] = v.x, x[1] = v.y;
  } else {
#pragma unroll
    for (int k = 0; k < E / 4; ++k) {
      const float4 v = __ldg(reinterpret_cast<const float4*>(src) + k);
      x[4 * k] = v.x, x[4 * k + 1] = v.y, x[4 * k + 2] = v.z, x[4 * k + 3] = v.w;
    }
  }
}

// Element offset of this lane's E channels of query head h of (b, kvh).
template <int D>
__device__ __forceinline__ size_t query_offset(const KernelArgs& a, int b, int kvh, int h, int lane) {
  return (size_t(b) * a.q_heads + size_t(kvh) * a.G + size_t(h)) * D + size_t(lane) * (D / 32);
}

// The query elements of the lane's first head (head = warp, when < G): loaded before the CTA
// starts its page or row loads, so their latency overlaps those. The rare heads past the
// first (G > kWarps) are loaded by rotate_queries itself.
template <int D>
__device__ __forceinline__ void load_first_query(const KernelArgs& a, int b, int kvh, int warp, int lane,
                                                 cache::detail::RowFrag<D>& first) {
  constexpr int E = cache::detail::RowFrag<D>::E;
  static_assert(E == 2 || E == 4 || E == 8, "head_dim 64, 128 or 256");
  if (warp < a.G) {
    load_query_lane<E>(a.q, a.q_type, query_offset<D>(a, b, kvh, warp, lane), first.x);
  } else {
#pragma unroll
    for (int e = 0; e < E; ++e) first.x[e] = 0.0f;  // a warp without a head
  }
}

// The G queries of (b, kvh) into qf [G][D] (non-finite -> 0), rotated by the recipe's
// Hadamard transform (cache/warp_hadamard.cuh: the butterfly order of core/hadamard.h,
// bit-identical to the CPU). One warp per head, so the prologue has one barrier, not one per
// stage; the first head comes loaded (load_first_query).
template <int D>
__device__ void rotate_queries(const KernelArgs& a, const cache::detail::RowFrag<D>& first, float* qf, int b, int kvh,
                               int warp, int lane) {
  constexpr int E = cache::detail::RowFrag<D>::E;
  cache::detail::RowFrag<D> r = first;
  float (&x)[E] = r.x;
  for (int h = warp; h < a.G; h += kWarps) {
    if (h != warp) load_query_lane<E>(a.q, a.q_type, query_offset<D>(a, b, kvh, h, lane), x);
#pragma unroll
    for (int e = 0; e < E; ++e) x[e] = is_finite(x[e]) ? x[e] : 0.0f;
    if (a.rotate) cache::detail::warp_fwht<D>(r, lane);
#pragma unroll
    for (int e = 0; e < E; ++e) qf[h * D + lane * E + e] = x[e];
  }
  __syncthreads();
}

// Element (column col, channel c) of the B operand Q^T in fragment order.
template <int NT>
__device__ __forceinline__ void put_q(uint16_t* qfrag, int col, int c, uint32_t bits) {
  qfrag[qfrag_half_index(col, c, NT)] = uint16_t(bits);
}

// ---- Per-thread FP4 query quantizers: one (head, block) per thread --------------------------
// No preset runs these: the instances with FP4 queries use the warp quantizers below. They
// stay compiled into the other instances behind the run-time query mode, whose page loops
// ptxas allocates differently without them (measured 2.4-5 % slower at 128K; see
// build_query_operand).

// NVFP4 query terms (dual-residual when T == 2): per head a global scale from the finite
// amax over all blocks (one barrier), then per block the E4M3-scaled codes; term t + 1
// quantizes the residual of term t in place.
template <int D, int T, int NT>
__device__ void quantize_query(NvFp4Page, const KernelArgs& a, float* qf, uint16_t* qfrag, float* gfac, int* ebuf,
                               int tid) {
  const int G = a.G;
  constexpr int NB = D / kNvfp4Block;
  for (int t = 0; t < T; ++t) {
    for (int idx = tid; idx < G * NB; idx += kThreads) {
      const int h = idx / NB, blk = idx % NB;
      ebuf[idx] = __float_as_int(finite_amax(qf + h * D + blk * kNvfp4Block, kNvfp4Block, 1));
    }
    __syncthreads();
    for (int idx = tid; idx < G * NB; idx += kThreads) {
      const int h = idx / NB, blk = idx % NB;
      float amax = 0.0f;
      for (int j = 0; j < NB; ++j) amax = max_f(amax, __int_as_float(ebuf[h * NB + j]));
      const float g = nvfp4_global_scale(amax);
      float* x = qf + h * D + blk * kNvfp4Block;
      uint8_t codes[kNvfp4Block];
      const uint8_t s = nvfp4_quantize_block(x, 1, g, false, codes);
      const float sv = e4m3_value(s);
      for (int i = 0; i < kNvfp4Block; ++i)
        put_q<NT>(qfrag, query_column(h, t, T, NT), blk * kNvfp4Block + i,
                  half_bits(__fmul_rn(e2m1_value(codes[i]), sv)));
      if (t + 1 < T) nvfp4_block_residual(x, codes, s, g, x);
      if (blk == 0) gfac[t * kMaxG + h] = g;
    }
    __syncthreads();
  }
}

// MXFP4 query terms: one (head, block) per thread (G * NB <= 128), its 32 elements 16 at a
// time (mxfp4_quantize_block without search, then mxfp4_block_residual): a 32-code array
// held the dual-residual kernel above 128 registers, i.e. to one CTA per SM. The codes are
// stored relative to the head's largest block exponent (gfac carries 2^(emax - 13)).
template <int D, int T, int NT>
__device__ void quantize_query(MxFp4Page, const KernelArgs& a, float* qf, uint16_t* qfrag, float* gfac, int* ebuf,
                               int tid) {
  const int G = a.G;
  constexpr int NB = D / kMxfp4Block;
  for (int t = 0; t < T; ++t) {
    const int idx = tid;
    const bool mine = idx < G * NB;
    const int h = mine ? idx / NB : 0, blk = mine ? idx % NB : 0;
    float* x = qf + h * D + blk * kMxfp4Block;
    int e = 0;
    if (mine) {
      const float amax = finite_amax(x, kMxfp4Block, 1);
      e = mxfp4_ocp_exponent(amax);
      ebuf[idx] = amax > 0.0f ? e : kNoExponent;  // zero blocks do not set the shift
    }
    __syncthreads();
    if (mine) {
      int emax = kNoExponent;
      for (int j = 0; j < NB; ++j) emax = max(emax, ebuf[h * NB + j]);
      if (emax == kNoExponent) emax = 0;
      const float unit = pow2f(max(e - emax + kFp16CodeShift, kMinFloatExponent));
      const float inv = pow2f(-e), sc = e8m0_value(uint8_t(e + kE8M0Bias));
#pragma unroll 1
      for (int i0 = 0; i0 < kMxfp4Block; i0 += 16) {  // 16 loads in flight, then 16 elements
        float xv[16];
#pragma unroll
        for (int j = 0; j < 16; ++j) xv[j] = x[i0 + j];
#pragma unroll
        for (int j = 0; j < 16; ++j) {
          const uint8_t c = mxfp4_element_code(xv[j], inv);
          put_q<NT>(qfrag, query_column(h, t, T, NT), blk * kMxfp4Block + i0 + j,
                    half_bits(__fmul_rn(e2m1_value(c), unit)));
          if (t + 1 < T) x[i0 + j] = sub_rn(xv[j], mul_rn(e2m1_value(c), sc));
        }
      }
      if (blk == 0) gfac[t * kMaxG + h] = pow2f(max(emax - kFp16CodeShift, kMinFloatExponent));
    }
    __syncthreads();
  }
}

// ---- Warp FP4 query quantizers (the native instances) -----------------------------------------
// The FP4 query quantizers run one warp per head, the lane holding the E = D / 32 channels
// lane * E .. lane * E + E - 1 (a block is kLanes consecutive lanes): block and head maxima
// come from shuffles, every element is quantized by its own lane. Each element sees the
// operations of the CPU's block quantizer (core/block_quant.h, core/operand_quant.h) in the
// same order, so the codes, scales and residuals are the CPU's bit for bit; maxima are
// exact in any order. The queries are finite here (the prologue zeroed the rest).
template <int D, int BLOCK>
struct QueryLanesOf {
  static constexpr int E = D / 32;
  static constexpr int kLanes = BLOCK / E;  // lanes per quantization block
  static_assert(kLanes >= 1 && kLanes <= 32 && BLOCK % E == 0, "a block spans whole lanes");

  // The lane's channels of query head h (qf [G][D]).
  __device__ __forceinline__ static void load(const float* qf, int h, int lane, float (&x)[E]) {
#pragma unroll
    for (int e = 0; e < E; ++e) x[e] = qf[h * D + lane * E + e];
  }
  // The largest magnitude among the lane's channels.
  __device__ __forceinline__ static float amax(const float (&x)[E]) {
    float m = 0.0f;
#pragma unroll
    for (int e = 0; e < E; ++e) m = max_f(m, abs_f(x[e]));
    return m;
  }
};

// Maximum over the aligned group of `lanes` lanes (a power of two) holding one block.
__device__ __forceinline__ float group_max(float v, int lanes) {
  for (int o = 1; o < lanes; o *= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// One NVFP4 query term of a head from the lane's channels x: the head's global scale g from
// the amax of all its blocks, per block the E4M3 scale of its amax under g
// (nvfp4_quantize_block with kappa 6, no search), the codes into column `col`; x becomes the
// residual when `residual`. Returns the term's FP32 factor (g).
template <int D, int NT>
__device__ __forceinline__ float quantize_term_by_warp(NvFp4Page, float (&x)[D / 32], int lane, int col, bool residual,
                                                       uint16_t* qfrag) {
  using Q = QueryLanesOf<D, kNvfp4Block>;
  const float amax = Q::amax(x);
  const float g = nvfp4_global_scale(warp_max_xor(amax, 1));
  const uint8_t s = nvfp4_block_scale(group_max(amax, Q::kLanes), kE2M1Max, g);
  const float sv = e4m3_value(s), sg = mul_rn(sv, g);
#pragma unroll
  for (int e = 0; e < Q::E; ++e) {
    const uint8_t c = sg > 0.0f ? e2m1_encode(div_rn(x[e], sg)) : uint8_t(0);
    put_q<NT>(qfrag, col, lane * Q::E + e, half_bits(__fmul_rn(e2m1_value(c), sv)));
    if (residual) x[e] = sub_rn(x[e], mul_rn(e2m1_value(c), sg));
  }
  return g;
}

// One MXFP4 query term: per block the OCP exponent e of its amax (mxfp4_element_code under
// 2^-e, no search), the codes stored relative to the head's largest block exponent emax;
// all-zero blocks do not set emax. Returns the term's factor 2^(emax - 13).
template <int D, int NT>
__device__ __forceinline__ float quantize_term_by_warp(MxFp4Page, float (&x)[D / 32], int lane, int col, bool residual,
                                                       uint16_t* qfrag) {
  using Q = QueryLanesOf<D, kMxfp4Block>;
  const float amax_b = group_max(Q::amax(x), Q::kLanes);
  const int eb = mxfp4_ocp_exponent(amax_b);
  int emax = __reduce_max_sync(0xffffffffu, amax_b > 0.0f ? eb : kNoExponent);
  if (emax == kNoExponent) emax = 0;
  const float unit = pow2f(max(eb - emax + kFp16CodeShift, kMinFloatExponent));
  const float inv = pow2f(-eb), sc = e8m0_value(uint8_t(eb + kE8M0Bias));
#pragma unroll
  for (int e = 0; e < Q::E; ++e) {
    const uint8_t c = mxfp4_element_code(x[e], inv);
    put_q<NT>(qfrag, col, lane * Q::E + e, half_bits(__fmul_rn(e2m1_value(c), unit)));
    if (residual) x[e] = sub_rn(x[e], mul_rn(e2m1_value(c), sc));
  }
  return pow2f(max(emax - kFp16CodeShift, kMinFloatExponent));
}

// The T FP4 query terms of every head (dual-residual when T == 2: term t + 1 quantizes the
// residual of term t), one warp per head; gfac[t][h] their factors.
template <class F, int D, int T, int NT>
__device__ void quantize_query_by_warp(const KernelArgs& a, const float* qf, uint16_t* qfrag, float* gfac, int tid) {
  using Q = QueryLanesOf<D, F::kBlock>;
  const int warp = tid / 32, lane = tid % 32;
  for (int h = warp; h < a.G; h += kWarps) {
    float x[Q::E];
    Q::load(qf, h, lane, x);
#pragma unroll
    for (int t = 0; t < T; ++t) {
      const float f = quantize_term_by_warp<D, NT>(F{}, x, lane, query_column(h, t, T, NT), t + 1 < T, qfrag);
      if (lane == 0) gfac[t * kMaxG + h] = f;
    }
  }
  __syncthreads();
}

// FP8 and BF16 pages take 16-bit queries only (the mixed path above).
template <int D, int T, int NT, class F>
__device__ __forceinline__ void quantize_query(F, const KernelArgs&, float*, uint16_t*, float*, int*, int) {}

// Builds the B operand Q^T (T terms per head, fragment order, padding columns left zero)
// and the FP32 factors gfac[t][h] of each term. Instances with FP4 queries (kFp4Query: the
// native operand modes) quantize them one warp per head. The other instances keep the
// run-time choice below with its per-thread quantizers, which their runs never reach: ptxas
// allocates those kernels' page loops differently without that code, and the mixed presets
// measured 2.4-5 % slower at 128K (docs/PERF.md, "Native presets at short contexts").
template <class F, int D, int T, int NT, bool kFp4Query>
__device__ void build_query_operand(const KernelArgs& a, float* qf, uint16_t* qfrag, float* gfac, int* ebuf,
                                    int tid) {
  if constexpr (kFp4Query) {
    quantize_query_by_warp<F, D, T, NT>(a, qf, qfrag, gfac, tid);
    return;
  }
  const int G = a.G;
  if (a.qmode == kQHalf || a.qmode == kQBf16) {
    for (int i = tid; i < G * D; i += kThreads) {
      const int h = i / D, c = i % D;
      put_q<NT>(qfrag, h, c, a.qmode == kQHalf ? half_bits(qf[i]) : bf16_bits(qf[i]));
    }
    if (tid < G) gfac[tid] = 1.0f;
    __syncthreads();
    return;
  }
  quantize_query<D, T, NT>(F{}, a, qf, qfrag, gfac, ebuf, tid);
}

}  // namespace fp4kv::attention::detail
