// The paged decode kernel (one template for NVFP4, MXFP4, FP8 and BF16 pages) and the
// combine kernel. Included by the instantiation units decode_*.cu only.
//
// CTA = (split, KV head, batch row), 8 warps. Warp w owns key group w (keys 16w .. 16w + 15)
// of every page for S and the softmax:
//   S^T = K Q^T   A = the warp's 16 x 16 K tiles expanded from the fragment-ordered page in
//                 registers (FP4: 11 integer operations per 8 codes + one HMUL2 by the block
//                 scale per half2); B = the query columns, held in registers (built once in
//                 the prologue). T = 2 (native dual-residual): column 2h holds q1 of head h
//                 and 2h+1 its residual q2, so one thread holds both terms of a head and
//                 joins them in FP32 before the softmax (paper 4.2, interleaved).
//   softmax       block maximum of the warp's 16 keys by shuffles (an NVFP4 P block; an
//                 MXFP4 block is a warp pair), tile maximum over the 8 warps through shared
//                 memory (one barrier per page, double-buffered); P quantized per block in
//                 registers; row sums use the unquantized p. FP8/FP4 mixed mode with
//                 G <= 4 spreads the 4 heads over all 4 lanes of a quad (own_head).
//   O^T += V^T P^T  FP4/FP8: warp w owns channel group(s) of O (16 channels; d = 64: two
//                 warps per group, half the keys each) over all keys of the page, B = P^T
//                 of the whole page from shared memory. It runs one page behind S, so the
//                 page's one barrier publishes both the tile maxima of page i and P of page
//                 i - 1; every warp keeps only its channels of O (4 registers at d = 128).
//                 BF16: every warp multiplies its own 16 keys into all channels of O (8
//                 partials, summed at the end), as its stages are too large for the lag.
// FP4/FP8 pages arrive by one bulk (TMA) copy each, completed on a per-stage mbarrier that
// every thread waits on before use (the stored part-major code order, layout.h, makes the
// warp's 16-byte loads conflict-free without re-ordering); NS - 2 pages stay in flight.
// BF16 pages stream through cp.async stages (zero fill, row swizzle) with the one barrier
// per page also publishing the next page.
#pragma once

#include <cuda_runtime.h>

#include "fp4kv/attention/decode.h"
#include "fp4kv/attention/device_common.cuh"
#include "fp4kv/attention/fragment.h"
#include "fp4kv/core/block_quant.h"
#include "fp4kv/core/decode_layout.h"
#include "fp4kv/core/hadamard.h"
#include "fp4kv/core/minifloat.h"
#include "fp4kv/core/operand_quant.h"

namespace fp4kv::attention::detail {

constexpr KvFormat kv_format_of(int fmt) {
  return fmt == kNv ? KvFormat::nvfp4 : fmt == kMx ? KvFormat::mxfp4 : fmt == kFp8 ? KvFormat::fp8 : KvFormat::bf16;
}

inline constexpr int kBf16Rows = cache::kSlotRows;  // 144

constexpr int cmax(int a, int b) { return a > b ? a : b; }

template <int FMT, int D, int T, int NT>
struct Geo {
  static constexpr cache::PageLayout L = cache::PageLayout::make(kv_format_of(FMT), D);
  static constexpr bool kFp4 = FMT == kNv || FMT == kMx;
  // FP4/FP8 pages arrive by one bulk copy each and P.V runs one page behind S (below);
  // BF16 pages need a zero fill past the last token and a row swizzle: cp.async.
  static constexpr bool kBulk = FMT != kBf16;
  static constexpr int BLK = FMT == kNv ? 16 : FMT == kMx ? 32 : 0;
  static constexpr int KS = D / 16;                                   // k-steps of Q.K
  static constexpr int KW = kFp4 ? KS * 4 : KS * 8;                   // K code bytes per lane per key group
  static constexpr int VW = kFp4 ? 8 * 4 : 8 * 8;                     // V code bytes per lane per channel group
  static constexpr int KCPL = KW / 16, VCPL = VW / 16;                // 16-byte parts per lane
  static constexpr int KS_PER_PART = kFp4 ? 4 : 2;                    // k-steps in one 16-byte part
  static constexpr int STAGE = L.bytes;
  static constexpr int CG = D / 16;                                   // channel groups of P.V
  static constexpr int NTP = T == 2 ? (NT + 1) / 2 : NT;              // n-tiles of P.V (heads / 8)
  // Who does P.V. BF16: every warp, all CG channel groups, its own 16 keys (8 partial Os).
  // Bulk: warp w owns CGW channel groups over KSP k-steps of every page; d = 64 has 4
  // channel groups, so two warps share one, each over half the keys (KP = 2 partials).
  static constexpr int CGW = kBulk ? (CG >= kWarps ? CG / kWarps : 1) : CG;
  static constexpr int KP = kBulk ? kWarps * CGW / CG : kWarps;       // partial-O slices
  static constexpr int KSP = kBulk ? kPageTokens / 16 / KP : 1;       // P.V k-steps per warp and page
  static constexpr int GMAX = (8 * NT / T) < kMaxG ? 8 * NT / T : kMaxG;
  // Query B fragments in registers when they are few (else re-read from shared memory;
  // 32 registers at d = 128 with two n-tiles measured no faster and spilled MXFP4).
  static constexpr bool kQReg = KS * NT * 2 <= 16;
  // shared memory: [region: page stages | BF16 sink/recent rows | final O merge][extras]
  static constexpr int QFRAG = KS * NT * 32 * 8;
  static constexpr int PS = 16 * kPsStride * 2 * (kBulk ? 2 : 1);   // P^T, double-buffered when lagged
  static constexpr int SC = 4 * (2 * kMaxG + 2 * kMaxG * kWarps + kMaxG * kWarps + kMaxG + kMaxG * 16);
  static constexpr int MBAR = 8 * 8;                                  // one mbarrier per stage (<= 8)
  static constexpr int BF16_NEED = FMT == kBf16 ? 0 : 2 * kBf16Rows * D * 2 + kMaxG * kBf16Rows * 4;
  static constexpr int OMERGE = KP * NTP * 8 * D * 4;
  // The FP32 queries [G][D] live only through the prologue: bulk kernels keep them in the
  // P^T buffers (zeroed after the prologue), BF16 kernels after the other extras.
  static constexpr int QF_BYTES = GMAX * D * 4;
  static constexpr int PSR = kBulk ? cmax(PS, QF_BYTES) : PS;  // the P^T (and query) buffer
  static constexpr int EXTRA = cache::align_up(QFRAG) + cache::align_up(PSR) + cache::align_up(SC) +
                               cache::align_up(MBAR) + (kBulk ? 0 : QF_BYTES);
  static constexpr int region(int ns) { return cache::align_up(cmax(ns * STAGE, cmax(BF16_NEED, OMERGE))); }
  // Two CTAs (16 warps) per SM when shared memory and the O registers allow, else one.
  static constexpr int kBudget2 = 115712, kBudget1 = 232448;
  static constexpr bool kTwo = CGW * NTP * 4 <= 32 && region(3) + EXTRA <= kBudget2;
  // Stages: the lagged P.V keeps two pages resident (S of page i, P.V of page i - 1), so a
  // bulk kernel has NS - 2 pages in flight (NS >= 3); a BF16 kernel NS - 2 for NS >= 3.
  static constexpr int pick_ns() {
    for (int ns = kTwo ? 5 : 6; ns > (kBulk ? 3 : 1); --ns)
      if (region(ns) + EXTRA <= (kTwo ? kBudget2 : kBudget1)) return ns;
    return kBulk ? 3 : 1;
  }
  static constexpr int NS = pick_ns();
  static_assert(NS <= MBAR / 8, "one mbarrier per stage");
  static constexpr int kMinBlocks = kTwo ? 2 : 1;
  static constexpr int REGION = region(NS);
  static constexpr int QFRAG_OFF = REGION;
  static constexpr int PS_OFF = QFRAG_OFF + cache::align_up(QFRAG);
  static constexpr int SC_OFF = PS_OFF + cache::align_up(PSR);
  static constexpr int MBAR_OFF = SC_OFF + cache::align_up(SC);
  static constexpr int QF_OFF = kBulk ? PS_OFF : MBAR_OFF + cache::align_up(MBAR);
  static constexpr int smem_bytes(int G) { return kBulk ? MBAR_OFF + cache::align_up(MBAR) : QF_OFF + G * D * 4; }
  static_assert(smem_bytes(GMAX) <= kBudget1, "decode kernel shared memory over the per-block limit");
};

// ---- Page loads ---------------------------------------------------------------------------

// BF16 page: cp.async with a zero fill past the valid tokens (garbage there could be NaN)
// and rows swizzled by 16-byte chunk (conflict-free ldmatrix).
template <int D>
__device__ __forceinline__ void load_bf16_page(uint8_t* stage, const uint8_t* src, int valid_tokens, int tid) {
  constexpr auto L = cache::PageLayout::make(KvFormat::bf16, D);
  const uint32_t dst = smem_u32(stage);
  constexpr int CPR = D / 8;  // 16-byte chunks per row
  for (int c = tid; c < 2 * kPageTokens * CPR; c += kThreads) {
    const int kv = c / (kPageTokens * CPR), rem = c % (kPageTokens * CPR);
    const int t = rem / CPR, ch = rem % CPR;
    const int off = (kv ? L.v_codes : L.k_codes);
    cp_async16(dst + off + (t * CPR + (ch ^ (t % 8))) * 16, src + off + (t * CPR + ch) * 16, t < valid_tokens ? 16 : 0);
  }
}

// ---- A fragments ----------------------------------------------------------------------------

// a * (s.lo, s.lo) and a * (s.hi, s.hi), FP16, round to nearest (exact here).
__device__ __forceinline__ uint32_t hmul2_by_lo(uint32_t a, uint32_t s) {
  const __half2 r = __hmul2(*reinterpret_cast<const __half2*>(&a), __low2half2(*reinterpret_cast<const __half2*>(&s)));
  return *reinterpret_cast<const uint32_t*>(&r);
}
__device__ __forceinline__ uint32_t hmul2_by_hi(uint32_t a, uint32_t s) {
  const __half2 r = __hmul2(*reinterpret_cast<const __half2*>(&a), __high2half2(*reinterpret_cast<const __half2*>(&s)));
  return *reinterpret_cast<const uint32_t*>(&r);
}

// Expands one FP4 word (a 16 x 16 tile of a lane) into the 4 A registers; `sc` holds the
// FP16 block scales of rows r (low half) and r + 8 (high half).
__device__ __forceinline__ void expand_fp4(uint32_t (&a)[4], uint32_t word, uint32_t sc) {
  uint32_t raw[4];
  fp4_word_to_a_regs(word, raw);
  a[0] = hmul2_by_lo(raw[0], sc);
  a[1] = hmul2_by_hi(raw[1], sc);
  a[2] = hmul2_by_lo(raw[2], sc);
  a[3] = hmul2_by_hi(raw[3], sc);
}
__device__ __forceinline__ void expand_fp8(uint32_t (&a)[4], uint32_t w0, uint32_t w1) {
  a[0] = e4m3x2_to_half2_bits(w0);
  a[1] = e4m3x2_to_half2_bits(w0 >> 16);
  a[2] = e4m3x2_to_half2_bits(w1);
  a[3] = e4m3x2_to_half2_bits(w1 >> 16);
}
// MXFP4 block scales stay in FP32 (e8m0_scale_value, fragment.h): the codes expand to FP16
// without them (value x 2^-14), a block's two k-step MMAs go to a fresh accumulator, and the
// power-of-two scales of its rows r, r + 8 (low and high byte of `pair`) multiply that in
// FP32: 4 FFMA per block instead of 8 HMUL2 plus an E8M0 -> FP16 conversion, and exact for
// every block scale.
__device__ __forceinline__ void mx_row_scales(uint32_t pair, float (&f)[2]) {
  f[0] = e8m0_scale_value(pair & 0xFFu);
  f[1] = e8m0_scale_value((pair >> 8) & 0xFFu);
}
// Zeroes an accumulator array of any shape (float[...][4]).
__device__ __forceinline__ void zero(float& x) { x = 0.0f; }
template <class T, int N>
__device__ __forceinline__ void zero(T (&x)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) zero(x[i]);
}

// acc += bacc x (row scale): C fragment elements 0, 1 are row r, 2, 3 row r + 8.
__device__ __forceinline__ void add_scaled(float (&acc)[4], const float (&bacc)[4], const float (&f)[2]) {
#pragma unroll
  for (int e = 0; e < 4; ++e) acc[e] = fmaf(bacc[e], f[e / 2], acc[e]);
}

// ---- Query prologue ------------------------------------------------------------------------

// Element i of an input (query) or output array of either I/O type.
__device__ __forceinline__ float load_io(const void* p, IoType type, size_t i) {
  if (type == IoType::bf16) return __uint_as_float(uint32_t(static_cast<const uint16_t*>(p)[i]) << 16);
  return static_cast<const float*>(p)[i];
}
__device__ __forceinline__ void store_io(void* p, IoType type, size_t i, float v) {
  if (type == IoType::bf16) static_cast<uint16_t*>(p)[i] = uint16_t(bf16_bits(v));
  else static_cast<float*>(p)[i] = v;
}

// E consecutive query elements from `offset` (E = 2, 4, 8; offset a multiple of E, the
// array 16-byte aligned): one vector load of either I/O type, widened to FP32 (exact).
template <int E>
__device__ __forceinline__ void load_query_lane(const void* q, IoType type, size_t offset, float (&x)[E]) {
  if (type == IoType::bf16) {
    const uint16_t* src = static_cast<const uint16_t*>(q) + offset;
    uint32_t w[E / 2];
    if constexpr (E == 2) {
      w[0] = __ldg(reinterpret_cast<const unsigned int*>(src));
    } else if constexpr (E == 4) {
      const uint2 v = __ldg(reinterpret_cast<const uint2*>(src));
      w[0] = v.x, w[1] = v.y;
    } else {
      const uint4 v = __ldg(reinterpret_cast<const uint4*>(src));
      w[0] = v.x, w[1] = v.y, w[2] = v.z, w[3] = v.w;
    }
#pragma unroll
    for (int k = 0; k < E / 2; ++k) {
      x[2 * k] = __uint_as_float(w[k] << 16);
      x[2 * k + 1] = __uint_as_float(w[k] & 0xFFFF0000u);
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

// Loads the G queries of (b, kvh) into qf [G][D] (non-finite -> 0) and applies the Hadamard
// rotation with the butterfly order of core/hadamard.h (bit-identical to the CPU). One warp
// per head: lane l holds channels E l .. E l + E - 1, so the butterflies are in-thread for
// hs < E and shuffles for hs >= E, and the prologue has one barrier, not one per stage.
template <int D>
__device__ void load_rotate_queries(const KernelArgs& a, float* qf, int b, int kvh, int tid) {
  constexpr int E = D / 32;
  static_assert(E == 2 || E == 4 || E == 8, "head_dim 64, 128 or 256");
  const int G = a.G, warp = tid / 32, lane = tid % 32;
  const size_t q0 = (size_t(b) * a.q_heads + size_t(kvh) * G) * D;
  for (int h = warp; h < G; h += kWarps) {
    float x[E];
    load_query_lane<E>(a.q, a.q_type, q0 + size_t(h) * D + lane * E, x);
#pragma unroll
    for (int e = 0; e < E; ++e) x[e] = is_finite(x[e]) ? x[e] : 0.0f;
    if (a.rotate) {
#pragma unroll
      for (int hs = 1; hs < E; hs *= 2)
#pragma unroll
        for (int e = 0; e < E; ++e)
          if ((e & hs) == 0) {
            const float u = x[e], v = x[e + hs];
            x[e] = __fadd_rn(u, v);
            x[e + hs] = __fsub_rn(u, v);
          }
#pragma unroll
      for (int hs = E; hs < D; hs *= 2) {
        const int lm = hs / E;
        const bool upper = (lane & lm) != 0;
#pragma unroll
        for (int e = 0; e < E; ++e) {
          const float other = __shfl_xor_sync(0xffffffffu, x[e], lm);
          x[e] = upper ? __fsub_rn(other, x[e]) : __fadd_rn(x[e], other);
        }
      }
      const float sc = hadamard_scale(D);
#pragma unroll
      for (int e = 0; e < E; ++e) x[e] = __fmul_rn(x[e], sc);
    }
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

// Builds the B operand columns (T terms per head) and their FP32 factors gfac[t][h].
template <int FMT, int D, int T, int NT>
__device__ void build_query_operand(const KernelArgs& a, float* qf, uint16_t* qfrag, float* gfac, int* ebuf,
                                    int tid) {
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
  if constexpr (FMT == kNv) {
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
          put_q<NT>(qfrag, h * T + t, blk * kNvfp4Block + i, half_bits(__fmul_rn(e2m1_value(codes[i]), sv)));
        if (t + 1 < T) nvfp4_block_residual(x, codes, s, g, x);
        if (blk == 0) gfac[t * kMaxG + h] = g;
      }
      __syncthreads();
    }
  } else if constexpr (FMT == kMx) {
    // One (head, block) per thread (G * NB <= 128), its 32 elements 16 at a time
    // (mxfp4_quantize_block without search, then mxfp4_block_residual): a 32-code array
    // held the dual-residual kernel above 128 registers, i.e. to one CTA per SM.
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
        ebuf[idx] = amax > 0.0f ? e : -1000;  // zero blocks do not set the shift
      }
      __syncthreads();
      if (mine) {
        int emax = -1000;
        for (int j = 0; j < NB; ++j) emax = max(emax, ebuf[h * NB + j]);
        if (emax == -1000) emax = 0;
        const float unit = pow2f(max(e - emax + 13, -149));
        const float inv = pow2f(-e), sc = e8m0_value(uint8_t(e + kE8M0Bias));
#pragma unroll 1
        for (int i0 = 0; i0 < kMxfp4Block; i0 += 16) {  // 16 loads in flight, then 16 elements
          float xv[16];
#pragma unroll
          for (int j = 0; j < 16; ++j) xv[j] = x[i0 + j];
#pragma unroll
          for (int j = 0; j < 16; ++j) {
            const uint8_t c = mxfp4_element_code(xv[j], inv);
            put_q<NT>(qfrag, h * T + t, blk * kMxfp4Block + i0 + j, half_bits(__fmul_rn(e2m1_value(c), unit)));
            if (t + 1 < T) x[i0 + j] = sub_rn(xv[j], mul_rn(e2m1_value(c), sc));
          }
        }
        if (blk == 0) gfac[t * kMaxG + h] = pow2f(max(emax - 13, -149));
      }
      __syncthreads();
    }
  }
}

// ---- The BF16 sink + recent CTA (FP32 CUDA cores) --------------------------------------------

// All rows are fetched at once (one memory latency), S = q'.k' by 8 lanes per key with
// 3 shuffles, P.V by (channel pair, head group) threads over the keys in order.
template <int D>
__device__ void bf16_part(const KernelArgs& a, uint8_t* region, float* qf, float* red, int b, int kvh,
                          const DecodeLayout& L, int tid) {
  const int G = a.G, warp = tid / 32, lane = tid % 32;
  const int nbf = L.bf16_tokens();
  uint16_t* Kc = reinterpret_cast<uint16_t*>(region);  // [144][D] bf16
  uint16_t* Vc = Kc + kBf16Rows * D;                   // [144][D] bf16
  float* Sb = reinterpret_cast<float*>(Vc + kBf16Rows * D);  // [kMaxG][144]
  const int S1 = a.max_splits + 1;
  const size_t obase = size_t(b) * a.q_heads + size_t(kvh) * G;
  const int slot = a.row_slot ? a.row_slot[b] : b;
  if (slot < 0 || slot >= a.slots) {  // the control kernel failed this row: contribute nothing
    if (tid < G) a.part_lse[(obase + tid) * S1 + a.max_splits] = neg_inf();
    return;
  }
  const uint16_t* kb = a.slot_buffer + cache::slot_row_offset(0, slot, kvh, 0, 0, a.slots, a.kv_heads, D);
  const uint16_t* vb = a.slot_buffer + cache::slot_row_offset(0, slot, kvh, 1, 0, a.slots, a.kv_heads, D);
  auto row_of = [&](int i) { return i < L.sink_tokens ? i : kSinkTokens + (L.recent_begin + i - L.sink_tokens) % kPageTokens; };
  constexpr int CPR = D / 8;  // 16-byte chunks per row
  auto load_rows = [&](uint16_t* dst, const uint16_t* src0) {
    for (int c = tid; c < nbf * CPR; c += kThreads) {
      const int i = c / CPR, ch = c % CPR;
      cp_async16(smem_u32(dst + i * D + ch * 8), src0 + size_t(row_of(i)) * D + ch * 8);
    }
    cp_async_commit();
  };
  load_rows(Kc, kb);
  load_rows(Vc, vb);
  load_rotate_queries<D>(a, qf, b, kvh, tid);
  cp_async_wait<0>();
  __syncthreads();

  // S: key i = pass * 32 + warp * 4 + lane / 8; lane % 8 takes the 16-byte chunks sub, sub + 8, ...
  const int sub = lane % 8;
  constexpr int CH = D / 64;  // chunks per lane
  for (int base = 0; base < nbf; base += 4 * kWarps) {
    const int i = base + warp * 4 + lane / 8;
    float dot[kMaxG];
#pragma unroll
    for (int h = 0; h < kMaxG; ++h) dot[h] = 0.0f;
    if (i < nbf) {
#pragma unroll
      for (int k = 0; k < CH; ++k) {
        const int c0 = (sub + 8 * k) * 8;
        const uint4 w = *reinterpret_cast<const uint4*>(Kc + i * D + c0);
        const uint32_t wv[4] = {w.x, w.y, w.z, w.w};
        float kv[8];
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          kv[2 * e] = __uint_as_float(wv[e] << 16);
          kv[2 * e + 1] = __uint_as_float(wv[e] & 0xFFFF0000u);
        }
#pragma unroll
        for (int h = 0; h < kMaxG; ++h) {
          if (h < G) {
            const float4 q0 = *reinterpret_cast<const float4*>(qf + h * D + c0);
            const float4 q1 = *reinterpret_cast<const float4*>(qf + h * D + c0 + 4);
            dot[h] = fmaf(q0.x, kv[0], dot[h]);
            dot[h] = fmaf(q0.y, kv[1], dot[h]);
            dot[h] = fmaf(q0.z, kv[2], dot[h]);
            dot[h] = fmaf(q0.w, kv[3], dot[h]);
            dot[h] = fmaf(q1.x, kv[4], dot[h]);
            dot[h] = fmaf(q1.y, kv[5], dot[h]);
            dot[h] = fmaf(q1.z, kv[6], dot[h]);
            dot[h] = fmaf(q1.w, kv[7], dot[h]);
          }
        }
      }
    }
#pragma unroll
    for (int h = 0; h < kMaxG; ++h) {
      if (h < G) {
        float x = dot[h];
        x += __shfl_xor_sync(0xffffffffu, x, 1);
        x += __shfl_xor_sync(0xffffffffu, x, 2);
        x += __shfl_xor_sync(0xffffffffu, x, 4);
        if (sub == 0 && i < nbf) Sb[h * kBf16Rows + i] = __fmul_rn(x, a.gamma);
      }
    }
  }
  __syncthreads();
  for (int h = warp; h < G; h += kWarps) {
    float m = neg_inf();
    for (int i = lane; i < nbf; i += 32) m = fmaxf(m, Sb[h * kBf16Rows + i]);
    m = warp_max_xor(m, 1);
    float l = 0.0f;
    for (int i = lane; i < nbf; i += 32) {
      const float p = exp2f(__fsub_rn(Sb[h * kBf16Rows + i], m));
      Sb[h * kBf16Rows + i] = p;
      l += p;
    }
    l = warp_sum_xor(l, 1);
    if (lane == 0) {
      red[h] = m;
      red[kMaxG + h] = l;
    }
  }
  __syncthreads();
  // P.V: thread owns channels 2 cp, 2 cp + 1 and heads hg, hg + HG, ...
  constexpr int PAIRS = D / 2;
  constexpr int HG = kThreads / PAIRS;
  constexpr int HPT = kMaxG / HG;
  const int cp = tid % PAIRS, hg = tid / PAIRS;
  float o0[HPT], o1[HPT];
#pragma unroll
  for (int k = 0; k < HPT; ++k) o0[k] = o1[k] = 0.0f;
  const uint32_t* V32 = reinterpret_cast<const uint32_t*>(Vc);
#pragma unroll 4
  for (int i = 0; i < nbf; ++i) {
    const uint32_t w = V32[i * PAIRS + cp];
    const float v0 = __uint_as_float(w << 16), v1 = __uint_as_float(w & 0xFFFF0000u);
#pragma unroll
    for (int k = 0; k < HPT; ++k) {
      const int h = hg + k * HG;
      if (h < G) {
        const float p = Sb[h * kBf16Rows + i];
        o0[k] = fmaf(p, v0, o0[k]);
        o1[k] = fmaf(p, v1, o1[k]);
      }
    }
  }
#pragma unroll
  for (int k = 0; k < HPT; ++k) {
    const int h = hg + k * HG;
    if (h < G) {
      const float l = red[kMaxG + h];
      float* dst = a.part_o + ((obase + h) * S1 + a.max_splits) * D + 2 * cp;
      dst[0] = o0[k] / l;
      dst[1] = o1[k] / l;
      if (cp == 0) a.part_lse[(obase + h) * S1 + a.max_splits] = red[h] + log2f(l);
    }
  }
}

// ---- The split kernel -------------------------------------------------------------------------

template <int FMT, int D, int OM, int NT>
__global__ void __launch_bounds__(kThreads, (Geo<FMT, D, query_terms(OM), NT>::kMinBlocks))
    decode_kernel(const KernelArgs a) {
  constexpr int T = query_terms(OM);
  constexpr bool kPFp4 = OM != kOm16;  // P quantized to FP4 (else FP16, BF16 on BF16 pages)
  using G_ = Geo<FMT, D, T, NT>;
  constexpr auto L = G_::L;
  constexpr int NS = G_::NS;
  constexpr int NSL = T == 2 ? NT : 2 * NT;  // softmax slots (heads) per thread
  constexpr int NTP = G_::NTP;               // n-tiles of P.V (heads / 8)
  constexpr int NSLP = 2 * NTP;              // P.V head slots per thread
  constexpr int KS = G_::KS;
  constexpr int CGW = G_::CGW;               // channel groups of O a warp holds
  constexpr bool kBf = FMT == kBf16;
  constexpr bool kBulk = G_::kBulk;

  extern __shared__ __align__(128) uint8_t smem[];
  uint16_t* qfrag = reinterpret_cast<uint16_t*>(smem + G_::QFRAG_OFF);
  uint16_t* ps = reinterpret_cast<uint16_t*>(smem + G_::PS_OFF);  // [1 or 2 buffers][16][kPsStride]
  float* qf = reinterpret_cast<float*>(smem + G_::QF_OFF);
  float* gfac = reinterpret_cast<float*>(smem + G_::SC_OFF);  // [2][kMaxG]
  float* red_max = gfac + 2 * kMaxG;                           // [2 buffers][kMaxG][kWarps]
  float* red_sum = red_max + 2 * kMaxG * kWarps;               // [kMaxG][kWarps]
  float* red_m = red_sum + kMaxG * kWarps;                     // [kMaxG]
  int* ebuf = reinterpret_cast<int*>(red_m + kMaxG);           // [kMaxG * 16]
  const uint32_t bar0 = smem_u32(smem + G_::MBAR_OFF);         // [NS] mbarriers (bulk pages)

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

  DecodeLayout lay;
  if constexpr (kBf) {
    lay.quant_pages = (n + kPageTokens - 1) / kPageTokens;
    lay.last_page_tokens = n - (lay.quant_pages - 1) * kPageTokens;
  } else {
    lay = decode_layout(n, true, a.sink != 0, a.recent != 0);
  }

  if (split == a.max_splits) {  // the BF16 sink + recent CTA
    if constexpr (!kBf) {
      if (lay.bf16_tokens() > 0) bf16_part<D>(a, smem, qf, red_max, b, kvh, lay, tid);
    }
    return;
  }
  const int pages = lay.quant_pages;
  const int splits = min(row_splits, a.max_splits);
  if (split >= splits || pps <= 0 || split * pps >= pages) return;
  const int p_begin = split * pps, p_end = min(p_begin + pps, pages), npg = p_end - p_begin;

  const int32_t* btab = a.block_tables + size_t(b) * a.max_pages;
  auto block_src = [&](int blk) { return a.pool + size_t(blk) * size_t(a.block_stride) + size_t(kvh) * size_t(a.head_bytes); };
  auto valid_of = [&](int pg) { return pg == pages - 1 ? lay.last_page_tokens : kPageTokens; };
  auto stage = [&](int s) { return smem + s * G_::STAGE; };
  auto bulk_load = [&](int s, int blk) { bulk_copy_to_shared(smem_u32(stage(s)), block_src(blk), G_::STAGE, bar0 + 8 * s); };

  // Zero the operand buffers (padding columns stay zero), then start the page stream.
  for (int i = tid; i < G_::QFRAG / 4; i += kThreads) reinterpret_cast<uint32_t*>(qfrag)[i] = 0u;
  if constexpr (!kBulk)
    for (int i = tid; i < G_::PS / 4; i += kThreads) reinterpret_cast<uint32_t*>(ps)[i] = 0u;
  if constexpr (kBulk) {
    if (tid == 0) {  // pages 0 .. NS - 1; the query prologue's barriers publish the mbarriers
#pragma unroll
      for (int s = 0; s < NS; ++s) mbar_init(bar0 + 8 * s, 1);
      mbar_init_fence();
      int first_blocks[NS];  // all table reads first: one latency
#pragma unroll
      for (int s = 0; s < NS; ++s) first_blocks[s] = s < npg ? __ldg(btab + p_begin + s) : 0;
#pragma unroll
      for (int s = 0; s < NS; ++s)
        if (s < npg) bulk_load(s, first_blocks[s]);
    }
  } else if constexpr (NS > 1) {
    int first_blocks[NS - 1];
#pragma unroll
    for (int s = 0; s < NS - 1; ++s) first_blocks[s] = s < npg ? __ldg(btab + p_begin + s) : 0;
#pragma unroll
    for (int s = 0; s < NS - 1; ++s) {
      if (s < npg) load_bf16_page<D>(stage(s), block_src(first_blocks[s]), valid_of(p_begin + s), tid);
      cp_async_commit();
    }
  }
  load_rotate_queries<D>(a, qf, b, kvh, tid);
  build_query_operand<FMT, D, T, NT>(a, qf, qfrag, gfac, ebuf, tid);
  if constexpr (kBulk)  // the queries are consumed (barrier above): zero the P buffers they used
    for (int i = tid; i < G_::PS / 4; i += kThreads) reinterpret_cast<uint32_t*>(ps)[i] = 0u;

  // Per-thread state. Softmax slots: T == 2: head 4 nt + lane % 4; T == 1: head
  // 8 nt + 2 (lane % 4) + e. P.V slots: head 8 ntp + 2 (lane % 4) + e.
  auto sm_head = [&](int sl) { return T == 2 ? 4 * sl + lane % 4 : 8 * (sl / 2) + 2 * (lane % 4) + sl % 2; };
  auto pv_head = [&](int sp) { return 8 * (sp / 2) + 2 * (lane % 4) + sp % 2; };
  // FP8/FP4 mixed mode with one column tile and G <= 4: only lanes 0, 1 of each quad hold
  // real heads (columns 0-3), so the softmax is split across the quad: lane q < 2 keeps
  // head 2q (its slot 0), lane q + 2 takes head 2q + 1 (lane q's slot 1, by shuffle) in its
  // slot 0; every lane then runs one slot instead of half the lanes two. own_head: the head
  // whose running max and sum (m_s, l_s) a softmax slot holds. (Not BF16: measured slower.)
  constexpr bool kSplitType = T == 1 && NT == 1 && !kPFp4 && kBulk;
  const bool quad_split = kSplitType && a.G <= 4;
  auto own_head = [&](int sl) {
    if (!quad_split) return sm_head(sl);
    return sl == 0 ? ((lane & 2) ? 2 * (lane & 1) + 1 : 2 * (lane % 4)) : kMaxG;
  };
  float gf0[NSL], gf1[NSL], m_s[NSL], l_s[NSL];
#pragma unroll
  for (int sl = 0; sl < NSL; ++sl) {
    const int h = min(sm_head(sl), kMaxG - 1);
    gf0[sl] = gfac[h];
    gf1[sl] = T == 2 ? gfac[kMaxG + h] : 0.0f;
    m_s[sl] = neg_inf();
    l_s[sl] = 0.0f;
  }
  // O^T fragments: channel group cg_of(ci) (16 channels) x n-tile j (8 heads).
  auto cg_of = [&](int ci) { return kBulk ? warp % (G_::CG / CGW) + (G_::CG / CGW) * ci : ci; };
  const int slice = kBulk ? warp / (G_::CG / CGW) : warp;  // which partial O this warp adds to
  float o[CGW][NTP][4];
  zero(o);

  constexpr bool mx_p = FMT == kMx && kPFp4;  // MXFP4 P: the tile exponent scales P.V
  const uint32_t* qfrag32 = reinterpret_cast<const uint32_t*>(qfrag);
  // Query B fragments (k-step ks, n-tile nt) in registers when few.
  uint32_t qreg[G_::kQReg ? KS : 1][NT][2];
  if constexpr (G_::kQReg) {
#pragma unroll
    for (int ks = 0; ks < KS; ++ks)
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        const uint2 v = reinterpret_cast<const uint2*>(qfrag32)[(ks * NT + nt) * 32 + lane];
        qreg[ks][nt][0] = v.x;
        qreg[ks][nt][1] = v.y;
      }
  }
  auto qb = [&](int ks, int nt, int r) -> uint32_t {
    if constexpr (G_::kQReg) return qreg[G_::kQReg ? ks : 0][nt][r];
    else return qfrag32[((ks * NT + nt) * 32 + lane) * 2 + r];
  };

  // ---- S^T = K Q^T for key group `warp`, logits, masks, warp maxima -> red_max[buf] -----------
  auto score = [&](const uint8_t* st, float kfac, int first, int end, int buf, float (&sv)[NSL][2],
                   float (&wm)[NSL]) {
    // Two accumulator chains (even and odd k-steps), added at the end: half the dependent
    // MMA latency per page.
    float acc2[2][NT][4];
    zero(acc2);
    if constexpr (kBf) {
      constexpr int CPR = D / 8;
#pragma unroll
      for (int ks = 0; ks < KS; ++ks) {
        const int i = lane / 8;
        const int row = warp * 16 + (i % 2) * 8 + lane % 8, ch = ks * 2 + i / 2;
        uint32_t af[4];
        ldmatrix_x4(af, smem_u32(st + L.k_codes + (row * CPR + (ch ^ (row % 8))) * 16));
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) mma_bf16(acc2[ks % 2][nt], af, qb(ks, nt, 0), qb(ks, nt, 1));
      }
    } else {
      constexpr int NBK = G_::kFp4 ? D / G_::BLK : 1;  // scale blocks per key row
      uint32_t ksc[FMT == kNv ? NBK : 1];              // NVFP4: FP16 scale pairs (rows r, r + 8) per block
      float kscf[FMT == kMx ? NBK : 1][2];             // MXFP4: FP32 row scales per block
      if constexpr (G_::kFp4) {
        const uint16_t* p = reinterpret_cast<const uint16_t*>(st + L.k_scales + scale_row_offset(warp, lane, NBK));
        uint32_t raw[NBK];
        if constexpr (NBK % 8 == 0) {
#pragma unroll
          for (int q = 0; q < NBK / 8; ++q) {
            const uint4 w = reinterpret_cast<const uint4*>(p)[q];
            const uint32_t wv[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              raw[8 * q + 2 * e] = wv[e] & 0xFFFFu;
              raw[8 * q + 2 * e + 1] = wv[e] >> 16;
            }
          }
        } else {
#pragma unroll
          for (int q = 0; q < NBK; ++q) raw[q] = p[q];
        }
#pragma unroll
        for (int q = 0; q < NBK; ++q) {
          if constexpr (FMT == kNv) ksc[q] = e4m3x2_to_half2_bits(raw[q]);
          else mx_row_scales(raw[q], kscf[q]);
        }
      }
      float bacc[NT][4];  // MXFP4: the current block's product
#pragma unroll
      for (int part = 0; part < G_::KCPL; ++part) {
        const uint4 kw = *reinterpret_cast<const uint4*>(st + L.k_codes + code_part_offset(warp, part, lane, G_::KCPL));
        const uint32_t wv[4] = {kw.x, kw.y, kw.z, kw.w};
#pragma unroll
        for (int sub = 0; sub < G_::KS_PER_PART; ++sub) {
          const int ks = part * G_::KS_PER_PART + sub;
          uint32_t af[4];
          if constexpr (FMT == kMx) {
            fp4_word_to_a_regs(wv[sub], af);
            if (ks % 2 == 0) zero(bacc);
#pragma unroll
            for (int nt = 0; nt < NT; ++nt) mma_f16(bacc[nt], af, qb(ks, nt, 0), qb(ks, nt, 1));
            if (ks % 2 == 1) {
#pragma unroll
              for (int nt = 0; nt < NT; ++nt) add_scaled(acc2[(ks / 2) % 2][nt], bacc[nt], kscf[ks / 2]);
            }
          } else {
            if constexpr (FMT == kNv) expand_fp4(af, wv[sub], ksc[ks]);
            else expand_fp8(af, wv[2 * sub], wv[2 * sub + 1]);
#pragma unroll
            for (int nt = 0; nt < NT; ++nt) mma_f16(acc2[ks % 2][nt], af, qb(ks, nt, 0), qb(ks, nt, 1));
          }
        }
      }
    }
    // Mixed mode: one factor per column and page, g of the query x (kfac x gamma). FP4 P
    // (native) keeps the reference's order, ((acc1 g1 + acc2 g2) kfac) gamma: its E2M1
    // rounding of p turns an ulp of difference into a code flip.
    const float kg = __fmul_rn(kfac, a.gamma);
#pragma unroll
    for (int sl = 0; sl < NSL; ++sl) {
      const int h = sm_head(sl);
      const float f0 = kPFp4 ? gf0[sl] : __fmul_rn(gf0[sl], kg);
      // Keys outside [first, end) (the masked sink copy, the tail of a last page) get -inf.
      // Columns of heads >= G need no mask: their maxima and P are never used.
#pragma unroll
      for (int rr = 0; rr < 2; ++rr) {
        const int key = 16 * warp + lane / 4 + 8 * rr;
        float x;
        if constexpr (T == 2) {
          x = __fadd_rn(__fmul_rn(acc2[0][sl][2 * rr] + acc2[1][sl][2 * rr], f0),
                        __fmul_rn(acc2[0][sl][2 * rr + 1] + acc2[1][sl][2 * rr + 1], gf1[sl]));
        } else {
          x = __fmul_rn(acc2[0][sl / 2][2 * rr + sl % 2] + acc2[1][sl / 2][2 * rr + sl % 2], f0);
        }
        if constexpr (kPFp4) x = __fmul_rn(__fmul_rn(x, kfac), a.gamma);
        sv[sl][rr] = (key >= first && key < end) ? x : neg_inf();
      }
      wm[sl] = warp_max_xor(fmaxf(sv[sl][0], sv[sl][1]), 4);
      if (lane < 4 && h < G) red_max[(buf * kMaxG + h) * kWarps + warp] = wm[sl];
    }
  };

  // ---- softmax of one page (after the barrier that publishes red_max[buf]) -------------------
  // Writes P^T of the warp's 16 keys into psb, updates m_s/l_s, and returns the rescale and
  // page factors of the P.V slots (alpha_p, fac_p) and whether any alpha differs from 1.
  static_assert(kWarps == 8, "tile_max reads 8 warp maxima");
  auto softmax = [&](int buf, const float (&sv)[NSL][2], const float (&wm)[NSL], float vfac, uint16_t* psb,
                     float (&alpha_p)[NSLP], float (&fac_p)[NSLP]) {
    // Tile maximum of head h over the 8 warps (and the warp pair's maximum: MXFP4 P blocks).
    auto tile_max = [&](int h) {
      const float4 x0 = *reinterpret_cast<const float4*>(red_max + (buf * kMaxG + h) * kWarps);
      const float4 x1 = *reinterpret_cast<const float4*>(red_max + (buf * kMaxG + h) * kWarps + 4);
      return fmaxf(fmaxf(fmaxf(x0.x, x0.y), fmaxf(x0.z, x0.w)), fmaxf(fmaxf(x1.x, x1.y), fmaxf(x1.z, x1.w)));
    };
    auto pair_max_of = [&](int h) {
      const float* r = red_max + (buf * kMaxG + h) * kWarps + (warp & ~1);
      return fmaxf(r[0], r[1]);
    };
    // T == 1: the P.V slots are the same heads, so their rescale and page factors are kept.
    float alpha_s[NSL], fac_s[NSL];
    float sx[NSL][2], wx[NSL];  // the slots' logits and warp maxima (own_head's)
#pragma unroll
    for (int sl = 0; sl < NSL; ++sl) {
      sx[sl][0] = sv[sl][0], sx[sl][1] = sv[sl][1], wx[sl] = wm[sl];
    }
    if constexpr (kSplitType) {
      if (quad_split) {  // lanes q + 2 take lane q's slot 1 (head 2q + 1)
        const float s0 = __shfl_xor_sync(0xffffffffu, sv[1][0], 2), s1 = __shfl_xor_sync(0xffffffffu, sv[1][1], 2);
        const float w1 = __shfl_xor_sync(0xffffffffu, wm[1], 2);
        if (lane & 2) sx[0][0] = s0, sx[0][1] = s1, wx[0] = w1;
      }
    }
#pragma unroll
    for (int sl = 0; sl < NSL; ++sl) {
      const int h = own_head(sl);
      alpha_s[sl] = 1.0f;
      fac_s[sl] = vfac;
      if (h >= G) continue;
      const float mt = tile_max(h);
      const float mn = fmaxf(m_s[sl], mt);
      // A tile (and split) with no attended key yet (the masked sink copy on page 0 with
      // no BF16 recent and n <= 16): subtract 0 so that p = 0 and alpha = 0, not NaN.
      const float mz = mn == neg_inf() ? 0.0f : mn;
      const float alpha = fast_exp2(__fsub_rn(m_s[sl], mz));
      m_s[sl] = mn;
      float lsum = 0.0f;
      int etile = 0;
      int pexp = 0;  // MXFP4 P: the block exponent (a block is the warp pair's 32 keys)
      alpha_s[sl] = alpha;
      if constexpr (mx_p) {
        etile = mxfp4_ocp_exponent(fast_exp2(__fadd_rn(__fsub_rn(mt, mz), a.log2c)));
        pexp = mxfp4_ocp_exponent(fast_exp2(__fadd_rn(__fsub_rn(pair_max_of(h), mz), a.log2c)));
        fac_s[sl] = __fmul_rn(vfac, pow2f(max(etile - 13, -149)));
      }
      float psc = 0.0f;  // NVFP4 P: the block scale value (the warp's 16 keys are one block)
      if constexpr (FMT == kNv && kPFp4)
        psc = nvfp4_prob_scale_value(fast_exp2(__fadd_rn(__fsub_rn(wx[sl], mz), a.log2c)), a.pmode == kPNvUnderflow, a.tau);
#pragma unroll
      for (int rr = 0; rr < 2; ++rr) {
        // log2 c is 0 unless P is FP4 (decode.cu): mixed mode skips the add.
        const float p = fast_exp2(kPFp4 ? __fadd_rn(__fsub_rn(sx[sl][rr], mz), a.log2c) : __fsub_rn(sx[sl][rr], mz));
        lsum += p;
        uint32_t bits;
        if constexpr (!kPFp4) {
          bits = FMT == kBf16 ? bf16_bits(p) : half_bits(p);
        } else if constexpr (FMT == kMx) {  // e2m1_round_value: the value of mxfp4_prob_code
          const float v = e2m1_round_value(__fmul_rn(p, pow2f(-pexp)));
          bits = half_bits(__fmul_rn(v, pow2f(max(pexp - etile + 13, -149))));
        } else {
          bits = half_bits(nvfp4_prob_value(p, psc));
        }
        const int key = 16 * warp + lane / 4 + 8 * rr;
        psb[h * kPsStride + key] = uint16_t(bits);
      }
      l_s[sl] = __fadd_rn(__fmul_rn(l_s[sl], alpha), lsum);
    }
    if constexpr (T == 1) {
      static_assert(T != 1 || NSL == NSLP, "T == 1: softmax and P.V slots coincide");
#pragma unroll
      for (int sp = 0; sp < NSLP; ++sp) {
        alpha_p[sp] = alpha_s[sp];
        fac_p[sp] = fac_s[sp];
      }
      if constexpr (kSplitType) {
        // Head 2q + 1's rescale lives in lane q + 2 (lanes q + 2 get lane q's: their
        // columns are padding heads, whose P is zero).
        if (quad_split) alpha_p[1] = __shfl_xor_sync(0xffffffffu, alpha_s[0], 2);
      }
    } else {
      // T == 2: the head of a P.V slot is a softmax slot of a lane of this quad (head
      // 4 sl + lane % 4): its rescale and page factors come by shuffles, not a second
      // tile maximum. Padding heads (>= G) take head G - 1's (finite, multiply zeros).
#pragma unroll
      for (int sp = 0; sp < NSLP; ++sp) {
        const int h = min(pv_head(sp), G - 1), src = (lane & ~3) | (h % 4);
        alpha_p[sp] = 1.0f;
        fac_p[sp] = vfac;
#pragma unroll
        for (int sl = 0; sl < NSL; ++sl) {
          const float al = __shfl_sync(0xffffffffu, alpha_s[sl], src), fa = __shfl_sync(0xffffffffu, fac_s[sl], src);
          if (sl == h / 4) {
            alpha_p[sp] = al;
            fac_p[sp] = fa;
          }
        }
      }
    }
  };

  // o = alpha o + fac tmp, per P.V slot (head column); the rescale only when an alpha moved.
  auto accumulate = [&](const float (&tmp)[CGW][NTP][4], const float (&alpha_p)[NSLP], const float (&fac_p)[NSLP]) {
    bool rescale = false;
#pragma unroll
    for (int sp = 0; sp < NSLP; ++sp) rescale |= alpha_p[sp] != 1.0f;
    if (__any_sync(0xffffffffu, rescale)) {
#pragma unroll
      for (int i = 0; i < CGW; ++i)
#pragma unroll
        for (int j = 0; j < NTP; ++j)
#pragma unroll
          for (int e = 0; e < 4; ++e) o[i][j][e] = fmaf(o[i][j][e], alpha_p[2 * j + e % 2], tmp[i][j][e] * fac_p[2 * j + e % 2]);
    } else {
#pragma unroll
      for (int i = 0; i < CGW; ++i)
#pragma unroll
        for (int j = 0; j < NTP; ++j)
#pragma unroll
          for (int e = 0; e < 4; ++e) o[i][j][e] = fmaf(tmp[i][j][e], fac_p[2 * j + e % 2], o[i][j][e]);
    }
  };

  if constexpr (kBulk) {
    // ---- FP4 / FP8 pages: one bulk copy per page, P.V one page behind ------------------------
    // Iteration it: wait for page it (mbarrier), S of page it, one barrier (publishes the
    // tile maxima of page it and P of page it - 1, and frees the stage of page it - 2, which
    // the next bulk copy refills with page it + NS - 2), then P.V of page it - 1 by channel
    // owners and the softmax of page it. NS - 2 pages stay in flight.
    constexpr int PSW = 16 * kPsStride / 2;  // 32-bit words of one P buffer
    constexpr int NBV = G_::kFp4 ? kPageTokens / G_::BLK : 1;  // V scale blocks per channel row
    const int ks0 = G_::KP == 1 ? 0 : slice * G_::KSP;         // the warp's first P.V k-step
    // ldmatrix row of this lane in the P^T buffer [head][key]: matrix q = lane / 8 holds
    // heads 0..7 x keys 16 (ks0 + q / 2) + 8 (q % 2) .. + 7, i.e. b0, b1 of two k-steps.
    const uint32_t p_addr =
        smem_u32(ps) + ((lane % 8) * kPsStride + (ks0 + lane / 16) * 16 + ((lane / 8) % 2) * 8) * 2;
    int blk_next = (tid == 0 && NS < npg) ? __ldg(btab + p_begin + NS) : 0;
    float alpha_prev[NSLP], fac_prev[NSLP];

    // P.V of the page in stage `st` with P^T from buffer `pbuf`: the warp's channel groups
    // over its KSP k-steps, two accumulator chains.
    auto pv = [&](const uint8_t* st, int pbuf, const float (&alpha_p)[NSLP], const float (&fac_p)[NSLP]) {
      float tmp2[2][CGW][NTP][4];
      zero(tmp2);
#pragma unroll
      for (int ci = 0; ci < CGW; ++ci) {
        const int cg = cg_of(ci);
        constexpr int KPP = G_::kFp4 ? 4 : 2;  // k-steps per 16-byte part
        uint32_t vw[G_::KSP * (G_::kFp4 ? 1 : 2)];
#pragma unroll
        for (int q = 0; q < G_::KSP / KPP; ++q) {
          const uint4 w = *reinterpret_cast<const uint4*>(st + L.v_codes + code_part_offset(cg, ks0 / KPP + q, lane, G_::VCPL));
          vw[4 * q] = w.x;
          vw[4 * q + 1] = w.y;
          vw[4 * q + 2] = w.z;
          vw[4 * q + 3] = w.w;
        }
        // 16-bit scale pairs (rows r, r + 8) of the warp's key blocks: NVFP4 one per k-step,
        // MXFP4 one per two.
        constexpr int NPAIR = FMT == kNv ? G_::KSP : G_::KSP / 2;
        uint32_t vraw[G_::kFp4 ? NPAIR : 1];
        if constexpr (G_::kFp4) {
          const uint8_t* sp = st + L.v_scales + scale_row_offset(cg, lane, NBV) + 2 * (FMT == kNv ? ks0 : ks0 / 2);
          uint32_t wv[NPAIR / 2];
          if constexpr (NPAIR == 8) {
            const uint4 w = *reinterpret_cast<const uint4*>(sp);
            wv[0] = w.x, wv[1] = w.y, wv[2] = w.z, wv[3] = w.w;
          } else if constexpr (NPAIR == 4) {
            const uint2 w = *reinterpret_cast<const uint2*>(sp);
            wv[0] = w.x, wv[1] = w.y;
          } else {
            wv[0] = *reinterpret_cast<const uint32_t*>(sp);
          }
#pragma unroll
          for (int e = 0; e < NPAIR / 2; ++e) {
            vraw[2 * e] = wv[e] & 0xFFFFu;
            vraw[2 * e + 1] = wv[e] >> 16;
          }
        }
        float bacc[NTP][4];   // MXFP4: the current block's product
        uint32_t pb[NTP][4];  // P^T B fragments of k-steps kk, kk + 1 (n-tile j): one ldmatrix.x4
#pragma unroll
        for (int kk = 0; kk < G_::KSP; ++kk) {
          if (kk % 2 == 0) {
#pragma unroll
            for (int j = 0; j < NTP; ++j) ldmatrix_x4(pb[j], p_addr + pbuf * PSW * 4 + (j * 8 * kPsStride + kk * 16) * 2);
          }
          uint32_t af[4];
          if constexpr (FMT == kMx) {  // blocks of two k-steps, scaled in FP32 (mx_row_scales)
            fp4_word_to_a_regs(vw[kk], af);
            if (kk % 2 == 0) zero(bacc);
#pragma unroll
            for (int j = 0; j < NTP; ++j) mma_f16(bacc[j], af, pb[j][2 * (kk % 2)], pb[j][2 * (kk % 2) + 1]);
            if (kk % 2 == 1) {
              float f[2];
              mx_row_scales(vraw[kk / 2], f);
#pragma unroll
              for (int j = 0; j < NTP; ++j) add_scaled(tmp2[(kk / 2) % 2][ci][j], bacc[j], f);
            }
          } else {
            if constexpr (FMT == kNv) expand_fp4(af, vw[kk], e4m3x2_to_half2_bits(vraw[kk]));
            else expand_fp8(af, vw[2 * kk], vw[2 * kk + 1]);
#pragma unroll
            for (int j = 0; j < NTP; ++j) mma_f16(tmp2[kk % 2][ci][j], af, pb[j][2 * (kk % 2)], pb[j][2 * (kk % 2) + 1]);
          }
        }
      }
      float tmp[CGW][NTP][4];
#pragma unroll
      for (int i = 0; i < CGW; ++i)
#pragma unroll
        for (int j = 0; j < NTP; ++j)
#pragma unroll
          for (int e = 0; e < 4; ++e) tmp[i][j][e] = tmp2[0][i][j][e] + tmp2[1][i][j][e];
      accumulate(tmp, alpha_p, fac_p);
    };

    for (int it = 0; it < npg; ++it) {
      const int s = it % NS;
      mbar_wait(bar0 + 8 * s, uint32_t(it / NS) & 1u);
      const uint8_t* st = stage(s);
      const int pg = p_begin + it;
      const int first = pg == 0 ? lay.masked_prefix : 0, end = valid_of(pg);
      const int buf = it & 1;
      // Page factors of S and of the P.V partial: the FP32 page scale g (NVFP4, FP8) and the
      // 2^14 of the FP4 expansion; MXFP4 applies its block scales in FP32 and needs no g.
      const float* pscale = reinterpret_cast<const float*>(st + L.page_scales);
      float kfac = FMT == kMx ? 1.0f : pscale[0], vfac = FMT == kMx ? 1.0f : pscale[1];
      if constexpr (G_::kFp4) {
        kfac = __fmul_rn(kfac, 16384.0f);
        vfac = __fmul_rn(vfac, 16384.0f);
      }
      float sv[NSL][2], wm[NSL];
      score(st, kfac, first, end, buf, sv, wm);
      __syncthreads();
      if (tid == 0 && it >= 2 && it + NS - 2 < npg) {
        bulk_load((it + NS - 2) % NS, blk_next);
        if (it + NS - 1 < npg) blk_next = __ldg(btab + p_begin + it + NS - 1);
      }
      if (it > 0) pv(stage((it - 1) % NS), buf ^ 1, alpha_prev, fac_prev);
      softmax(buf, sv, wm, vfac, ps + buf * (PSW * 2), alpha_prev, fac_prev);
    }
    __syncthreads();  // P of the last page visible
    pv(stage((npg - 1) % NS), (npg - 1) & 1, alpha_prev, fac_prev);
  } else {
    // ---- BF16 pages: cp.async stages, every warp does P.V of its own 16 keys -----------------
    if constexpr (NS >= 3) {
      cp_async_wait<NS - 2>();  // page 0 (this thread's copies)
      __syncthreads();          // page 0 visible
    }
    // Block id of the next page to load, fetched one iteration ahead so that the table read's
    // latency is not paid after the barrier.
    constexpr int kAhead = NS >= 3 ? NS - 1 : NS == 2 ? 1 : 0;
    int blk_next = kAhead < npg ? __ldg(btab + p_begin + kAhead) : 0;
    const uint32_t* ps32 = reinterpret_cast<const uint32_t*>(ps);
    for (int it = 0; it < npg; ++it) {
      if constexpr (NS == 1) {
        if (it > 0) __syncthreads();  // everyone is done with page it - 1
        load_bf16_page<D>(stage(0), block_src(blk_next), valid_of(p_begin + it), tid);
        cp_async_commit();
        if (it + 1 < npg) blk_next = __ldg(btab + p_begin + it + 1);
        cp_async_wait<0>();
        __syncthreads();
      } else if constexpr (NS == 2) {
        cp_async_wait<0>();
        __syncthreads();  // page it visible; everyone is done with page it - 1
        if (it + 1 < npg) load_bf16_page<D>(stage((it + 1) % 2), block_src(blk_next), valid_of(p_begin + it + 1), tid);
        cp_async_commit();
        if (it + 2 < npg) blk_next = __ldg(btab + p_begin + it + 2);
      }
      const uint8_t* st = stage(NS == 1 ? 0 : it % NS);
      const int pg = p_begin + it;
      const int first = pg == 0 ? lay.masked_prefix : 0, end = valid_of(pg);
      const int buf = it & 1;
      float sv[NSL][2], wm[NSL];
      score(st, 1.0f, first, end, buf, sv, wm);
      if constexpr (NS >= 3) cp_async_wait<NS - 3>();  // page it + 1 (this thread's copies)
      __syncthreads();  // maxima of page it; page it + 1 visible; everyone is done with page it - 1
      if constexpr (NS >= 3) {
        const int nx = it + NS - 1;
        if (nx < npg) load_bf16_page<D>(stage(nx % NS), block_src(blk_next), valid_of(p_begin + nx), tid);
        cp_async_commit();
        if (nx + 1 < npg) blk_next = __ldg(btab + p_begin + nx + 1);
      }
      float alpha_p[NSLP], fac_p[NSLP];
      softmax(buf, sv, wm, 1.0f, ps, alpha_p, fac_p);
      __syncwarp();  // this warp's P columns visible to the warp

      // O^T += V^T P^T: all channel groups, k-step = this warp's 16 keys.
      uint32_t pb[NTP][2];
#pragma unroll
      for (int j = 0; j < NTP; ++j) {
        pb[j][0] = ps32[ps_word_index(j, lane, warp, 0)];
        pb[j][1] = ps32[ps_word_index(j, lane, warp, 1)];
      }
      float tmp[CGW][NTP][4];
      zero(tmp);
      constexpr int CPR = D / 8;
#pragma unroll
      for (int i = 0; i < CGW; ++i) {
        const int q4 = lane / 8;
        const int row = warp * 16 + (q4 / 2) * 8 + lane % 8, ch = i * 2 + q4 % 2;
        uint32_t af[4];
        ldmatrix_x4_trans(af, smem_u32(st + L.v_codes + (row * CPR + (ch ^ (row % 8))) * 16));
#pragma unroll
        for (int j = 0; j < NTP; ++j) mma_bf16(tmp[i][j], af, pb[j][0], pb[j][1]);
      }
      accumulate(tmp, alpha_p, fac_p);
    }
  }

  // ---- epilogue: sum the partial Os and row sums, normalize, base-2 LSE ----------------------
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  if constexpr (!kBulk) cp_async_wait<0>();
#pragma unroll
  for (int sl = 0; sl < NSL; ++sl) {
    const float l = warp_sum_xor(l_s[sl], 4);
    const int h = own_head(sl);
    if (lane < 4 && h < G) {
      red_sum[h * kWarps + warp] = l;
      if (warp == 0) red_m[h] = m_s[sl];
    }
  }
  __syncthreads();  // every warp is done with the stages: the region holds the O partials
  float* om = reinterpret_cast<float*>(smem);  // [slice][NTP * 8 heads][D]
#pragma unroll
  for (int i = 0; i < CGW; ++i)
#pragma unroll
    for (int j = 0; j < NTP; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int c = 16 * cg_of(i) + lane / 4 + 8 * (e / 2), hc = 8 * j + 2 * (lane % 4) + e % 2;
        om[(slice * NTP * 8 + hc) * D + c] = o[i][j][e];
      }
  __syncthreads();
  const int S1 = a.max_splits + 1;
  const size_t obase = size_t(b) * a.q_heads + size_t(kvh) * G;
  for (int idx = tid; idx < G * D; idx += kThreads) {
    const int h = idx / D, c = idx % D;
    float l = 0.0f, s = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) l += red_sum[h * kWarps + w];
#pragma unroll
    for (int w = 0; w < G_::KP; ++w) s += om[(w * NTP * 8 + h) * D + c];
    const float inv = l > 0.0f ? 1.0f / l : 0.0f;
    a.part_o[((obase + h) * S1 + split) * D + c] = s * inv;
    if (c == 0) a.part_lse[(obase + h) * S1 + split] = l > 0.0f ? red_m[h] + log2f(l) - a.log2c : neg_inf();
  }
}

// ---- combine -----------------------------------------------------------------------------------

template <int D>
__global__ void __launch_bounds__(D) combine_kernel(const CombineArgs a) {
  const int qh = blockIdx.x, b = blockIdx.y, c = threadIdx.x;
  __shared__ float red[D / 32];
  extern __shared__ float s_lse[];  // [max_splits + 1]: the valid splits' LSE, else -inf
  const size_t oi = (size_t(b) * a.q_heads + qh) * D + c;
  // Launched as a programmatic dependent of the decode kernel: wait for its results (a
  // no-op when launched normally).
  asm volatile("griddepcontrol.wait;" ::: "memory");
  // The row's scalars in one memory latency (no branch between the loads).
  const int err = a.error_flags ? a.error_flags[0] : 0;
  const int rows = a.num_rows ? a.num_rows[0] : a.batch;
  const int n_row = a.seq_lens[b];
  const int row_splits = a.row_splits[b], pps = a.row_pps[b];
  if (err != 0) {
    store_io(a.out, a.out_type, oi, __int_as_float(0x7fc00000));
    if (a.lse && c == 0) a.lse[size_t(b) * a.q_heads + qh] = __int_as_float(0x7fc00000);
    return;
  }
  const int n = b >= rows ? 0 : n_row;
  if (n <= 0) {
    store_io(a.out, a.out_type, oi, 0.0f);
    if (a.lse && c == 0) a.lse[size_t(b) * a.q_heads + qh] = neg_inf();
    return;
  }
  const KvFormat f = KvFormat(a.kv_format);
  const int pages = attended_pages(n, f, a.sink != 0, a.recent != 0);
  const int splits = pages > 0 ? min(row_splits, a.max_splits) : 0;
  const bool bf = f != KvFormat::bf16 && decode_layout(n, true, a.sink != 0, a.recent != 0).bf16_tokens() > 0;
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
  float wsum = 0.0f, acc = 0.0f;
  auto add = [&](int s, float x) {
    const float ls = s_lse[s];
    const float w = ls == neg_inf() ? 0.0f : exp2f(ls - big);
    wsum += w;
    acc = fmaf(w, x, acc);
  };
#pragma unroll
  for (int k = 0; k < R; ++k)
    if (k < nsplit) add(k, v[k]);
  for (int s = R; s < nsplit; s += 8) {
    float x[8];
#pragma unroll
    for (int k = 0; k < 8; ++k) x[k] = s + k < nsplit ? a.part_o[(base + s + k) * D + c] : 0.0f;
#pragma unroll
    for (int k = 0; k < 8; ++k)
      if (s + k < nsplit) add(s + k, x[k]);
  }
  if (bf) add(a.max_splits, v_bf);
  if (!(wsum > 0.0f)) {  // no split contributed (a row the control kernel gave no work)
    store_io(a.out, a.out_type, oi, 0.0f);
    if (a.lse && c == 0) a.lse[size_t(b) * a.q_heads + qh] = neg_inf();
    return;
  }
  store_io(a.out, a.out_type, oi, acc / wsum);
  if (!a.lse) return;
  float shift = 0.0f;
  if (a.mu_k) {
    const float qv = load_io(a.q, a.q_type, oi);
    float x = (is_finite(qv) ? qv : 0.0f) * a.mu_k[size_t(qh / a.G) * D + c];
    x = warp_sum_xor(x, 1);
    if (c % 32 == 0) red[c / 32] = x;
    __syncthreads();
    float tot = 0.0f;
    for (int w = 0; w < D / 32; ++w) tot += red[w];
    shift = tot * rsqrtf(float(D));
  }
  if (c == 0) a.lse[size_t(b) * a.q_heads + qh] = (big + log2f(wsum)) * 0.693147180559945309f + shift;
}

// ---- launchers (explicitly instantiated in decode_*.cu) ---------------------------------------

template <int FMT, int D, int OM, int NT>
int decode_smem_bytes(int G) {
  return Geo<FMT, D, query_terms(OM), NT>::smem_bytes(G);
}

template <int FMT, int D, int OM, int NT>
cudaError_t configure_decode() {
  using G_ = Geo<FMT, D, query_terms(OM), NT>;
  return cudaFuncSetAttribute(decode_kernel<FMT, D, OM, NT>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                              G_::smem_bytes(G_::GMAX));
}

template <int FMT, int D, int OM, int NT>
void launch_decode(const KernelArgs& a, cudaStream_t stream) {
  const dim3 grid(a.max_splits + 1, a.kv_heads, a.batch);
  decode_kernel<FMT, D, OM, NT><<<grid, kThreads, decode_smem_bytes<FMT, D, OM, NT>(a.G), stream>>>(a);
}

template <int FMT, int D, int OM, int NT>
int decode_occupancy(int G) {
  int n = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, decode_kernel<FMT, D, OM, NT>, kThreads,
                                                    decode_smem_bytes<FMT, D, OM, NT>(G)) != cudaSuccess)
    return 0;
  return n;
}

template <int D>
void launch_combine(const CombineArgs& a, cudaStream_t stream) {
  // Programmatic dependent launch: the combine grid is set up while the decode kernel
  // finishes and waits for it in griddepcontrol.wait.
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(a.q_heads, a.batch);
  cfg.blockDim = dim3(D);
  cfg.dynamicSmemBytes = (a.max_splits + 1) * sizeof(float);
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  if (cudaLaunchKernelEx(&cfg, combine_kernel<D>, a) != cudaSuccess) {
    (void)cudaGetLastError();  // not available here: a plain launch
    combine_kernel<D><<<dim3(a.q_heads, a.batch), D, (a.max_splits + 1) * sizeof(float), stream>>>(a);
  }
}

}  // namespace fp4kv::attention::detail
