// The paged decode kernel (one template for NVFP4, MXFP4, FP8 and BF16 pages) and the
// combine kernel. Included by the instantiation units decode_*.cu only.
//
// CTA = (split, KV head, batch row), 4 warps. Per page (= tile of 128 keys):
//   S^T = K Q^T   warp w owns key groups 2w, 2w+1 (32 keys); A = K tile expanded from the
//                 fragment-ordered page in registers; B = the query columns (FP16/BF16,
//                 fragment-ordered in shared memory, built once in the prologue). T = 2
//                 (native dual-residual): column 2h holds q1 of head h and 2h+1 its
//                 residual q2, so one thread holds both terms of a head and joins them in
//                 FP32 before the softmax (paper 4.2, interleaved rather than appended).
//   softmax       block maxima (16 keys = one key group; 32 = one warp for MXFP4) and the
//                 warp maximum by butterfly shuffles, tile maximum across the 4 warps
//                 through shared memory; P quantized per block in registers; row sums use
//                 the unquantized p.
//   O^T = V^T P^T P^T goes through shared memory ([head][key] FP16, the transpose is the
//                 store); warp w owns channel groups w*D/64 ... over all 128 keys; A = V^T
//                 tile expanded from the page; per-page FP32 factors (v page scale, the
//                 2^14 of the expansion trick, MXFP4 P shift) multiply the partial sums.
// Pages stream through NS shared-memory stages with cp.async (16-byte chunks, code arrays
// re-ordered on the fly so each warp reads 512 contiguous bytes per fragment load).
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

inline constexpr int kMaxG = 16;
inline constexpr int kBf16Rows = cache::kSlotRows;  // 144

template <int FMT, int D, int NT>
struct Geo {
  static constexpr cache::PageLayout L = cache::PageLayout::make(kv_format_of(FMT), D);
  static constexpr bool kFp4 = FMT == kNv || FMT == kMx;
  static constexpr int BLK = FMT == kNv ? 16 : FMT == kMx ? 32 : 0;
  static constexpr int KS = D / 16;                                   // k-steps of Q.K
  static constexpr int KW = kFp4 ? KS * 4 : KS * 8;                   // K code bytes per lane per key group
  static constexpr int VW = kFp4 ? 8 * 4 : 8 * 8;                     // V code bytes per lane per channel group
  static constexpr int KCPL = KW / 16, VCPL = VW / 16;                // 16-byte parts per lane
  static constexpr int KS_PER_PART = kFp4 ? 4 : 2;                    // k-steps in one 16-byte part
  static constexpr int STAGE = L.bytes;
  // Stages: 3 for small pages, else 2 (a 128-d FP4 page is 18.5 KB: 2 stages keep the CTA
  // near 50 KB so 4 CTAs share an SM), 1 when two do not fit (BF16 pages at d = 256).
  static constexpr int NS = STAGE < 16 * 1024 ? 3 : (2 * STAGE <= 160 * 1024 ? 2 : 1);
  static constexpr int CGW = D / 64;                                  // channel groups per warp (P.V)
  // shared memory carve-up (bytes, each 128-aligned)
  static constexpr int BF16_PART = (32 * (D + 1) + 32 * D + kMaxG * kBf16Rows) * 4;  // sink/recent CTA
  static constexpr int REGION = NS * STAGE > BF16_PART ? NS * STAGE : cache::align_up(BF16_PART);
  static constexpr int QFRAG_OFF = REGION;
  static constexpr int QFRAG = KS * NT * 32 * 8;
  static constexpr int PS_OFF = QFRAG_OFF + cache::align_up(QFRAG);
  static constexpr int PS = 16 * kPsStride * 2;
  static constexpr int SC_OFF = PS_OFF + cache::align_up(PS);
  static constexpr int SC = 4 * (2 * kMaxG + 4 * kMaxG + 4 * kMaxG + kMaxG * 16);  // gfac, red_max, red_sum, ebuf
  static constexpr int QF_OFF = SC_OFF + cache::align_up(SC);                        // queries [G][D] float, last
  static constexpr int smem_bytes(int G) { return QF_OFF + G * D * 4; }
};

// ---- Page loads ---------------------------------------------------------------------------

template <int FMT, int D, int NT>
__device__ __forceinline__ void load_page(uint8_t* stage, const uint8_t* src, int valid_tokens, int tid) {
  using G_ = Geo<FMT, D, NT>;
  constexpr auto L = G_::L;
  const uint32_t dst = smem_u32(stage);
  if constexpr (FMT == kBf16) {
    constexpr int CPR = D / 8;  // 16-byte chunks per row
    for (int c = tid; c < 2 * kPageTokens * CPR; c += kThreads) {
      const int kv = c / (kPageTokens * CPR), rem = c % (kPageTokens * CPR);
      const int t = rem / CPR, ch = rem % CPR;
      const int off = (kv ? L.v_codes : L.k_codes);
      cp_async16(dst + off + (t * CPR + (ch ^ (t % 8))) * 16, src + off + (t * CPR + ch) * 16,
                 t < valid_tokens ? 16 : 0);
    }
  } else {
    constexpr int KC = (G_::kFp4 ? kPageTokens * D / 2 : kPageTokens * D) / 16;  // chunks per code array
    for (int c = tid; c < KC; c += kThreads) {
      cp_async16(dst + L.k_codes + swizzled_chunk(c, G_::KCPL) * 16, src + L.k_codes + c * 16);
      cp_async16(dst + L.v_codes + swizzled_chunk(c, G_::VCPL) * 16, src + L.v_codes + c * 16);
    }
    if constexpr (G_::kFp4) {
      constexpr int SCH = kPageTokens * (D / G_::BLK) / 16;  // chunks per scale array
      for (int c = tid; c < SCH; c += kThreads) {
        cp_async16(dst + L.k_scales + c * 16, src + L.k_scales + c * 16);
        cp_async16(dst + L.v_scales + c * 16, src + L.v_scales + c * 16);
      }
    }
    if (tid == 0) cp_async16(dst + L.page_scales, src + L.page_scales);
  }
}

// ---- A fragments ----------------------------------------------------------------------------

// Scale pair (rows r, r + 8) of block `blk` from the lane's scale words.
template <int NWORDS>
__device__ __forceinline__ uint32_t scale_pair(const uint32_t (&w)[NWORDS], int blk) {
  return (w[blk / 2] >> (16 * (blk % 2))) & 0xFFFFu;
}

// Expands one FP4 word (a 16 x 16 tile of a lane) into the 4 A registers with the scales of
// rows r (lo) and r + 8 (hi) as half2 splats.
__device__ __forceinline__ void expand_fp4(uint32_t (&a)[4], uint32_t word, uint32_t lo, uint32_t hi) {
  a[0] = hmul2_bits(fp4_word_to_a_reg_bits(word, 0), lo);
  a[1] = hmul2_bits(fp4_word_to_a_reg_bits(word, 1), hi);
  a[2] = hmul2_bits(fp4_word_to_a_reg_bits(word, 2), lo);
  a[3] = hmul2_bits(fp4_word_to_a_reg_bits(word, 3), hi);
}
__device__ __forceinline__ void expand_fp8(uint32_t (&a)[4], uint32_t w0, uint32_t w1) {
  a[0] = e4m3x2_to_half2_bits(w0);
  a[1] = e4m3x2_to_half2_bits(w0 >> 16);
  a[2] = e4m3x2_to_half2_bits(w1);
  a[3] = e4m3x2_to_half2_bits(w1 >> 16);
}
// Scale splats of a pair of block scales.
template <int FMT>
__device__ __forceinline__ void scale_splats(uint32_t pair, int pe, uint32_t& lo, uint32_t& hi) {
  if constexpr (FMT == kNv) {
    const uint32_t h = e4m3x2_to_half2_bits(pair);
    lo = (h & 0xFFFFu) * 0x10001u;
    hi = (h >> 16) * 0x10001u;
  } else {
    lo = mx_scale_half_bits(pair & 0xFFu, pe) * 0x10001u;
    hi = mx_scale_half_bits(pair >> 8, pe) * 0x10001u;
  }
}

// ---- Query prologue ------------------------------------------------------------------------

// Loads the G queries of (b, kvh) into qf [G][D] (non-finite -> 0) and applies the Hadamard
// rotation with the butterfly order of core/hadamard.h (bit-identical to the CPU).
template <int D>
__device__ void load_rotate_queries(const KernelArgs& a, float* qf, int b, int kvh, int tid) {
  const int G = a.G;
  const float* __restrict__ q = a.q + (size_t(b) * a.q_heads + size_t(kvh) * G) * D;
  for (int base = 0; base < G * D; base += 8 * kThreads) {  // 8 loads in flight per thread
    float x[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const int i = base + j * kThreads + tid;
      x[j] = i < G * D ? __ldg(q + i) : 0.0f;
    }
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const int i = base + j * kThreads + tid;
      if (i < G * D) qf[i] = is_finite(x[j]) ? x[j] : 0.0f;
    }
  }
  if (a.rotate) {
    for (int hs = 1; hs < D; hs *= 2) {
      __syncthreads();
      for (int idx = tid; idx < G * D / 2; idx += kThreads) {
        const int h = idx / (D / 2), i = idx % (D / 2);
        const int j = (i / hs) * 2 * hs + i % hs;
        float* x = qf + h * D;
        const float u = x[j], v = x[j + hs];
        x[j] = __fadd_rn(u, v);
        x[j + hs] = __fsub_rn(u, v);
      }
    }
    __syncthreads();
    const float s = hadamard_scale(D);
    for (int i = tid; i < G * D; i += kThreads) qf[i] = __fmul_rn(qf[i], s);
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
    constexpr int NB = D / kMxfp4Block;  // G * NB <= 128: one (head, block) per thread
    for (int t = 0; t < T; ++t) {
      const int idx = tid;
      const bool mine = idx < G * NB;
      const int h = mine ? idx / NB : 0, blk = mine ? idx % NB : 0;
      float* x = qf + h * D + blk * kMxfp4Block;
      uint8_t codes[kMxfp4Block];
      uint8_t s = 0;
      if (mine) {
        const float amax = finite_amax(x, kMxfp4Block, 1);
        s = mxfp4_quantize_block(x, 1, false, codes);
        ebuf[idx] = amax > 0.0f ? int(s) - kE8M0Bias : -1000;  // zero blocks do not set the shift
      }
      __syncthreads();
      if (mine) {
        int emax = -1000;
        for (int j = 0; j < NB; ++j) emax = max(emax, ebuf[h * NB + j]);
        if (emax == -1000) emax = 0;
        const int e = int(s) - kE8M0Bias;
        const float unit = pow2f(max(e - emax + 13, -149));
        for (int i = 0; i < kMxfp4Block; ++i)
          put_q<NT>(qfrag, h * T + t, blk * kMxfp4Block + i, half_bits(__fmul_rn(e2m1_value(codes[i]), unit)));
        if (t + 1 < T) mxfp4_block_residual(x, codes, s, x);
        if (blk == 0) gfac[t * kMaxG + h] = pow2f(max(emax - 13, -149));
      }
      __syncthreads();
    }
  }
}

// ---- The BF16 sink + recent CTA (FP32 CUDA cores) --------------------------------------------

// Rows c0 .. c0 + 31 of the slot (zeros past nbf) into dst[i * stride + c] as floats. All
// loads of a thread are issued before the first use (one memory latency per chunk).
template <int D, class RowOf>
__device__ __forceinline__ void load_slot_rows(float* dst, int stride, const uint16_t* base, int c0, int nbf,
                                               const RowOf& row_of, int tid) {
  constexpr int PER = 32 * D / 2 / kThreads;  // 32-bit words per thread
  uint32_t w[PER];
#pragma unroll
  for (int j = 0; j < PER; ++j) {
    const int idx = tid + j * kThreads, i = idx / (D / 2), c = (idx % (D / 2)) * 2;
    w[j] = c0 + i < nbf ? *reinterpret_cast<const uint32_t*>(base + size_t(row_of(c0 + i)) * D + c) : 0u;
  }
#pragma unroll
  for (int j = 0; j < PER; ++j) {
    const int idx = tid + j * kThreads, i = idx / (D / 2), c = (idx % (D / 2)) * 2;
    dst[i * stride + c] = __uint_as_float(w[j] << 16);
    dst[i * stride + c + 1] = __uint_as_float(w[j] & 0xFFFF0000u);
  }
}

template <int D>
__device__ void bf16_part(const KernelArgs& a, uint8_t* region, const float* qf, float* red, int b, int kvh,
                          const DecodeLayout& L, int tid) {
  const int G = a.G, warp = tid / 32, lane = tid % 32;
  const int nbf = L.bf16_tokens();
  float* Kc = reinterpret_cast<float*>(region);  // [32][D + 1]
  float* Vc = Kc + 32 * (D + 1);                 // [32][D]
  float* Sb = Vc + 32 * D;                       // [kMaxG][144]
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

  for (int c0 = 0; c0 < nbf; c0 += 32) {
    __syncthreads();
    load_slot_rows<D>(Kc, D + 1, kb, c0, nbf, row_of, tid);
    __syncthreads();
    const int i = tid % 32;
    if (c0 + i < nbf) {
      for (int h = tid / 32; h < G; h += 4) {
        float dot = 0.0f;
#pragma unroll 8
        for (int c = 0; c < D; ++c) dot = fmaf(qf[h * D + c], Kc[i * (D + 1) + c], dot);
        Sb[h * kBf16Rows + c0 + i] = __fmul_rn(dot, a.gamma);
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
  // P.V: thread owns channel(s) c and heads hs, hs + HS, ...
  constexpr int CPT = D > kThreads ? D / kThreads : 1;   // channels per thread
  constexpr int HS = D < kThreads ? kThreads / D : 1;    // head stride
  constexpr int HPT = kMaxG / HS;
  const int cbase = tid % (D < kThreads ? D : kThreads), hs = tid / (D < kThreads ? D : kThreads);
  float o[CPT][HPT];
#pragma unroll
  for (int j = 0; j < CPT; ++j)
#pragma unroll
    for (int k = 0; k < HPT; ++k) o[j][k] = 0.0f;
  for (int c0 = 0; c0 < nbf; c0 += 32) {
    __syncthreads();
    load_slot_rows<D>(Vc, D, vb, c0, nbf, row_of, tid);
    __syncthreads();
    const int cnt = min(32, nbf - c0);
    for (int i = 0; i < cnt; ++i) {
#pragma unroll
      for (int k = 0; k < HPT; ++k) {
        const int h = hs + k * HS;
        if (h < G) {
          const float p = Sb[h * kBf16Rows + c0 + i];
#pragma unroll
          for (int j = 0; j < CPT; ++j) o[j][k] = fmaf(p, Vc[i * D + cbase + j * kThreads], o[j][k]);
        }
      }
    }
  }
#pragma unroll
  for (int k = 0; k < HPT; ++k) {
    const int h = hs + k * HS;
    if (h < G) {
      const float l = red[kMaxG + h];
#pragma unroll
      for (int j = 0; j < CPT; ++j)
        a.part_o[((obase + h) * S1 + a.max_splits) * D + cbase + j * kThreads] = o[j][k] / l;
      if (cbase == 0) a.part_lse[(obase + h) * S1 + a.max_splits] = red[h] + log2f(l);
    }
  }
}

// ---- The split kernel -------------------------------------------------------------------------

template <int FMT, int D, int T, int NT>
__global__ void __launch_bounds__(kThreads, 2) decode_kernel(const KernelArgs a) {
  using G_ = Geo<FMT, D, NT>;
  constexpr auto L = G_::L;
  constexpr int NS = G_::NS;
  constexpr int NSL = T == 2 ? NT : 2 * NT;              // softmax slots (heads) per thread
  constexpr int NTP = T == 2 ? (NT + 1) / 2 : NT;        // n-tiles of P.V (heads / 8)
  constexpr int NSLP = 2 * NTP;                          // P.V head slots per thread
  constexpr int CGW = G_::CGW;
  constexpr bool kBf = FMT == kBf16;

  extern __shared__ __align__(128) uint8_t smem[];
  uint16_t* qfrag = reinterpret_cast<uint16_t*>(smem + G_::QFRAG_OFF);
  uint16_t* ps = reinterpret_cast<uint16_t*>(smem + G_::PS_OFF);
  float* qf = reinterpret_cast<float*>(smem + G_::QF_OFF);
  float* gfac = reinterpret_cast<float*>(smem + G_::SC_OFF);  // [2][kMaxG]
  float* red_max = gfac + 2 * kMaxG;                           // [4][kMaxG]
  float* red_sum = red_max + 4 * kMaxG;                        // [4][kMaxG]
  int* ebuf = reinterpret_cast<int*>(red_sum + 4 * kMaxG);     // [kMaxG * 16]

  const int split = blockIdx.x, kvh = blockIdx.y, b = blockIdx.z;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  if (b >= a.batch || kvh >= a.kv_heads) return;
  // Sticky error flags (step_plan.h): while any bit is set the step is skipped.
  if (a.error_flags && a.error_flags[0] != 0) return;
  if (a.num_rows && b >= a.num_rows[0]) return;
  const int n = a.seq_lens[b];
  if (n <= 0) return;
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
      if (lay.bf16_tokens() > 0) {
        load_rotate_queries<D>(a, qf, b, kvh, tid);
        bf16_part<D>(a, smem, qf, red_max, b, kvh, lay, tid);
      }
    }
    return;
  }
  const int pages = lay.quant_pages;
  const int splits = min(a.row_splits[b], a.max_splits), pps = a.row_pps[b];
  if (split >= splits || pps <= 0 || split * pps >= pages) return;
  const int p_begin = split * pps, p_end = min(p_begin + pps, pages), npg = p_end - p_begin;

  const int32_t* btab = a.block_tables + size_t(b) * a.max_pages;
  auto page_src = [&](int pg) {
    return a.pool + size_t(btab[pg]) * size_t(a.block_stride) + size_t(kvh) * size_t(a.head_bytes);
  };
  auto valid_of = [&](int pg) { return pg == pages - 1 ? lay.last_page_tokens : kPageTokens; };
  auto stage = [&](int s) { return smem + s * G_::STAGE; };

  // Zero the operand buffers (padding columns stay zero), then start the page stream.
  for (int i = tid; i < G_::QFRAG / 4; i += kThreads) reinterpret_cast<uint32_t*>(qfrag)[i] = 0u;
  for (int i = tid; i < G_::PS / 4; i += kThreads) reinterpret_cast<uint32_t*>(ps)[i] = 0u;
  if constexpr (NS > 1) {
#pragma unroll
    for (int s = 0; s < NS - 1; ++s) {
      if (s < npg) load_page<FMT, D, NT>(stage(s), page_src(p_begin + s), valid_of(p_begin + s), tid);
      cp_async_commit();
    }
  }
  load_rotate_queries<D>(a, qf, b, kvh, tid);
  build_query_operand<FMT, D, T, NT>(a, qf, qfrag, gfac, ebuf, tid);

  // Per-thread state. Softmax slots: T == 2: head 4 nt + lane % 4; T == 1: head
  // 8 nt + 2 (lane % 4) + e. P.V slots: head 8 ntp + 2 (lane % 4) + e.
  auto sm_head = [&](int sl) { return T == 2 ? 4 * sl + lane % 4 : 8 * (sl / 2) + 2 * (lane % 4) + sl % 2; };
  auto pv_head = [&](int sp) { return 8 * (sp / 2) + 2 * (lane % 4) + sp % 2; };
  float gf0[NSL], gf1[NSL], m_s[NSL], l_s[NSL], m_p[NSLP];
#pragma unroll
  for (int sl = 0; sl < NSL; ++sl) {
    const int h = min(sm_head(sl), kMaxG - 1);
    gf0[sl] = gfac[h];
    gf1[sl] = T == 2 ? gfac[kMaxG + h] : 0.0f;
    m_s[sl] = neg_inf();
    l_s[sl] = 0.0f;
  }
#pragma unroll
  for (int sp = 0; sp < NSLP; ++sp) m_p[sp] = neg_inf();
  float o[CGW][NTP][4];
#pragma unroll
  for (int i = 0; i < CGW; ++i)
#pragma unroll
    for (int j = 0; j < NTP; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) o[i][j][e] = 0.0f;

  const bool mx_p = a.pmode == kPMx;
  const uint32_t* qfrag32 = reinterpret_cast<const uint32_t*>(qfrag);
  const uint32_t* ps32 = reinterpret_cast<const uint32_t*>(ps);

  for (int it = 0; it < npg; ++it) {
    if constexpr (NS == 1) {
      __syncthreads();
      load_page<FMT, D, NT>(stage(0), page_src(p_begin + it), valid_of(p_begin + it), tid);
      cp_async_commit();
      cp_async_wait<0>();
    } else {
      cp_async_wait<(NS > 1 ? NS - 2 : 0)>();
    }
    __syncthreads();  // (A) page `it` visible; everyone is done with page it - 1
    if constexpr (NS > 1) {
      const int nx = it + NS - 1;
      if (nx < npg) load_page<FMT, D, NT>(stage(nx % NS), page_src(p_begin + nx), valid_of(p_begin + nx), tid);
      cp_async_commit();
    }
    const uint8_t* st = stage(NS == 1 ? 0 : it % NS);
    const int pg = p_begin + it;
    const int first = pg == 0 ? lay.masked_prefix : 0, end = valid_of(pg);

    // ---- S^T = K Q^T for key groups 2w, 2w + 1 --------------------------------------------
    float acc[2][NT][4];
#pragma unroll
    for (int t = 0; t < 2; ++t)
#pragma unroll
      for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[t][j][e] = 0.0f;

    float kfac = 1.0f, vfac = 1.0f;
    int pek = 0, pev = 0;
    if constexpr (!kBf) {
      const float* pscale = reinterpret_cast<const float*>(st + L.page_scales);
      kfac = pscale[0];
      vfac = pscale[1];
      if constexpr (FMT == kMx) {
        pek = pow2_exponent(kfac);
        pev = pow2_exponent(vfac);
      }
      if constexpr (G_::kFp4) {
        kfac = __fmul_rn(kfac, 16384.0f);
        vfac = __fmul_rn(vfac, 16384.0f);
      }
    }

    if constexpr (kBf) {
      constexpr int CPR = D / 8;
#pragma unroll
      for (int ks = 0; ks < G_::KS; ++ks) {
        uint32_t qb[NT][2];
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
          const uint2 v = reinterpret_cast<const uint2*>(qfrag32)[(ks * NT + nt) * 32 + lane];
          qb[nt][0] = v.x;
          qb[nt][1] = v.y;
        }
#pragma unroll
        for (int t = 0; t < 2; ++t) {
          const int i = lane / 8;
          const int row = (2 * warp + t) * 16 + (i % 2) * 8 + lane % 8, ch = ks * 2 + i / 2;
          uint32_t af[4];
          ldmatrix_x4(af, smem_u32(st + L.k_codes + (row * CPR + (ch ^ (row % 8))) * 16));
#pragma unroll
          for (int nt = 0; nt < NT; ++nt) mma_bf16(acc[t][nt], af, qb[nt][0], qb[nt][1]);
        }
      }
    } else {
      constexpr int SW = G_::kFp4 ? (D / G_::BLK) / 2 : 1;  // scale words per lane per key group
      uint32_t ksw[2][SW];
      if constexpr (G_::kFp4) {
#pragma unroll
        for (int t = 0; t < 2; ++t) {
          const uint32_t* p = reinterpret_cast<const uint32_t*>(st + L.k_scales + scale_row_offset(2 * warp + t, lane, D / G_::BLK));
#pragma unroll
          for (int w = 0; w < SW; ++w) ksw[t][w] = p[w];
        }
      }
#pragma unroll
      for (int part = 0; part < G_::KCPL; ++part) {
        uint4 kw[2];
#pragma unroll
        for (int t = 0; t < 2; ++t)
          kw[t] = *reinterpret_cast<const uint4*>(st + L.k_codes + code_part_offset(2 * warp + t, part, lane, G_::KCPL));
#pragma unroll
        for (int sub = 0; sub < G_::KS_PER_PART; ++sub) {
          const int ks = part * G_::KS_PER_PART + sub;
          uint32_t qb[NT][2];
#pragma unroll
          for (int nt = 0; nt < NT; ++nt) {
            const uint2 v = reinterpret_cast<const uint2*>(qfrag32)[(ks * NT + nt) * 32 + lane];
            qb[nt][0] = v.x;
            qb[nt][1] = v.y;
          }
#pragma unroll
          for (int t = 0; t < 2; ++t) {
            const uint32_t wv[4] = {kw[t].x, kw[t].y, kw[t].z, kw[t].w};
            uint32_t af[4];
            if constexpr (G_::kFp4) {
              uint32_t lo, hi;
              scale_splats<FMT>(scale_pair(ksw[t], FMT == kNv ? ks : ks / 2), pek, lo, hi);
              expand_fp4(af, wv[sub], lo, hi);
            } else {
              expand_fp8(af, wv[2 * sub], wv[2 * sub + 1]);
            }
#pragma unroll
            for (int nt = 0; nt < NT; ++nt) mma_f16(acc[t][nt], af, qb[nt][0], qb[nt][1]);
          }
        }
      }
    }

    // ---- logits, masks, block and warp maxima --------------------------------------------
    float sv[2][NSL][2];
#pragma unroll
    for (int t = 0; t < 2; ++t) {
#pragma unroll
      for (int sl = 0; sl < NSL; ++sl) {
        const int h = sm_head(sl);
#pragma unroll
        for (int rr = 0; rr < 2; ++rr) {
          const int key = 32 * warp + 16 * t + lane / 4 + 8 * rr;
          float x;
          if constexpr (T == 2) {
            x = __fadd_rn(__fmul_rn(acc[t][sl][2 * rr], gf0[sl]), __fmul_rn(acc[t][sl][2 * rr + 1], gf1[sl]));
          } else {
            x = __fmul_rn(acc[t][sl / 2][2 * rr + sl % 2], gf0[sl]);
          }
          x = __fmul_rn(__fmul_rn(x, kfac), a.gamma);
          sv[t][sl][rr] = (key >= first && key < end && h < G) ? x : neg_inf();
        }
      }
    }
    float bm[2][NSL], wm[NSL];
#pragma unroll
    for (int sl = 0; sl < NSL; ++sl) {
#pragma unroll
      for (int t = 0; t < 2; ++t) bm[t][sl] = warp_max_xor(fmaxf(sv[t][sl][0], sv[t][sl][1]), 4);
      wm[sl] = fmaxf(bm[0][sl], bm[1][sl]);
      const int h = sm_head(sl);
      if (lane < 4 && h < G) red_max[warp * kMaxG + h] = wm[sl];
    }
    __syncthreads();  // (B)

    // ---- softmax and P quantization (softmax slots) ------------------------------------------
#pragma unroll
    for (int sl = 0; sl < NSL; ++sl) {
      const int h = sm_head(sl);
      if (h >= G) continue;
      const float mt = fmaxf(fmaxf(red_max[h], red_max[kMaxG + h]), fmaxf(red_max[2 * kMaxG + h], red_max[3 * kMaxG + h]));
      const float mn = fmaxf(m_s[sl], mt);
      // A tile (and split) with no attended key yet (the masked sink copy on page 0 with
      // no BF16 recent and n <= 16): subtract 0 so that p = 0 and alpha = 0, not NaN.
      const float mz = mn == neg_inf() ? 0.0f : mn;
      const float alpha = exp2f(__fsub_rn(m_s[sl], mz));
      m_s[sl] = mn;
      float lsum = 0.0f;
      int etile = 0;
      float wpmax = 0.0f;
      if (mx_p) {
        etile = mxfp4_ocp_exponent(exp2f(__fadd_rn(__fsub_rn(mt, mz), a.log2c)));
        wpmax = exp2f(__fadd_rn(__fsub_rn(wm[sl], mz), a.log2c));
      }
#pragma unroll
      for (int t = 0; t < 2; ++t) {
        float pmax = 0.0f;
        if (a.pmode == kPNvMax6 || a.pmode == kPNvUnderflow) pmax = exp2f(__fadd_rn(__fsub_rn(bm[t][sl], mz), a.log2c));
#pragma unroll
        for (int rr = 0; rr < 2; ++rr) {
          const float p = exp2f(__fadd_rn(__fsub_rn(sv[t][sl][rr], mz), a.log2c));
          lsum += p;
          uint32_t bits;
          switch (a.pmode) {
            case kPHalf: bits = half_bits(p); break;
            case kPBf16: bits = bf16_bits(p); break;
            case kPMx: {
              const uint8_t sc = mxfp4_prob_scale(wpmax);
              const uint8_t code = mxfp4_prob_code(p, sc);
              const int k = max(int(sc) - kE8M0Bias - etile + 13, -149);
              bits = half_bits(__fmul_rn(e2m1_value(code), pow2f(k)));
              break;
            }
            default: {
              const uint8_t sc = nvfp4_prob_scale(pmax, a.pmode == kPNvUnderflow, a.tau);
              const float svl = e4m3_value(sc);
              bits = half_bits(__fmul_rn(e2m1_value(nvfp4_prob_code(p, svl)), svl));
              break;
            }
          }
          const int key = 32 * warp + 16 * t + lane / 4 + 8 * rr;
          ps[h * kPsStride + key] = uint16_t(bits);
        }
      }
      l_s[sl] = __fadd_rn(__fmul_rn(l_s[sl], alpha), lsum);
    }
    // P.V slots: rescale factor and page factor of each head (from the same shared maxima).
    float alpha_p[NSLP], fac_p[NSLP];
#pragma unroll
    for (int sp = 0; sp < NSLP; ++sp) {
      const int h = min(pv_head(sp), G - 1);
      const float mt = fmaxf(fmaxf(red_max[h], red_max[kMaxG + h]), fmaxf(red_max[2 * kMaxG + h], red_max[3 * kMaxG + h]));
      const float mn = fmaxf(m_p[sp], mt);
      const float mz = mn == neg_inf() ? 0.0f : mn;
      alpha_p[sp] = exp2f(__fsub_rn(m_p[sp], mz));
      m_p[sp] = mn;
      fac_p[sp] = vfac;
      if (mx_p) {
        const int etile = mxfp4_ocp_exponent(exp2f(__fadd_rn(__fsub_rn(mt, mz), a.log2c)));
        fac_p[sp] = __fmul_rn(vfac, pow2f(max(etile - 13, -149)));
      }
    }
    __syncthreads();  // (C) P visible

    // ---- O^T += V^T P^T for channel groups warp * CGW ... -------------------------------------
    float tmp[CGW][NTP][4];
#pragma unroll
    for (int i = 0; i < CGW; ++i)
#pragma unroll
      for (int j = 0; j < NTP; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) tmp[i][j][e] = 0.0f;

    if constexpr (kBf) {
      constexpr int CPR = D / 8;
#pragma unroll
      for (int ks = 0; ks < 8; ++ks) {
        uint32_t pb[NTP][2];
#pragma unroll
        for (int j = 0; j < NTP; ++j) {
          pb[j][0] = ps32[ps_word_index(j, lane, ks, 0)];
          pb[j][1] = ps32[ps_word_index(j, lane, ks, 1)];
        }
#pragma unroll
        for (int i = 0; i < CGW; ++i) {
          const int cg = warp * CGW + i, q4 = lane / 8;
          const int row = ks * 16 + (q4 / 2) * 8 + lane % 8, ch = cg * 2 + q4 % 2;
          uint32_t af[4];
          ldmatrix_x4_trans(af, smem_u32(st + L.v_codes + (row * CPR + (ch ^ (row % 8))) * 16));
#pragma unroll
          for (int j = 0; j < NTP; ++j) mma_bf16(tmp[i][j], af, pb[j][0], pb[j][1]);
        }
      }
    } else {
      constexpr int VSW = G_::kFp4 ? (kPageTokens / G_::BLK) / 2 : 1;
      uint32_t vsw[CGW][VSW];
      if constexpr (G_::kFp4) {
#pragma unroll
        for (int i = 0; i < CGW; ++i) {
          const uint32_t* p = reinterpret_cast<const uint32_t*>(
              st + L.v_scales + scale_row_offset(warp * CGW + i, lane, kPageTokens / G_::BLK));
#pragma unroll
          for (int w = 0; w < VSW; ++w) vsw[i][w] = p[w];
        }
      }
#pragma unroll
      for (int part = 0; part < G_::VCPL; ++part) {
        uint4 vw[CGW];
#pragma unroll
        for (int i = 0; i < CGW; ++i)
          vw[i] = *reinterpret_cast<const uint4*>(st + L.v_codes + code_part_offset(warp * CGW + i, part, lane, G_::VCPL));
#pragma unroll
        for (int sub = 0; sub < G_::KS_PER_PART; ++sub) {
          const int ks = part * G_::KS_PER_PART + sub;
          uint32_t pb[NTP][2];
#pragma unroll
          for (int j = 0; j < NTP; ++j) {
            pb[j][0] = ps32[ps_word_index(j, lane, ks, 0)];
            pb[j][1] = ps32[ps_word_index(j, lane, ks, 1)];
          }
#pragma unroll
          for (int i = 0; i < CGW; ++i) {
            const uint32_t wv[4] = {vw[i].x, vw[i].y, vw[i].z, vw[i].w};
            uint32_t af[4];
            if constexpr (G_::kFp4) {
              uint32_t lo, hi;
              scale_splats<FMT>(scale_pair(vsw[i], FMT == kNv ? ks : ks / 2), pev, lo, hi);
              expand_fp4(af, wv[sub], lo, hi);
            } else {
              expand_fp8(af, wv[2 * sub], wv[2 * sub + 1]);
            }
#pragma unroll
            for (int j = 0; j < NTP; ++j) mma_f16(tmp[i][j], af, pb[j][0], pb[j][1]);
          }
        }
      }
    }
#pragma unroll
    for (int i = 0; i < CGW; ++i)
#pragma unroll
      for (int j = 0; j < NTP; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int sp = 2 * j + e % 2;
          o[i][j][e] = fmaf(o[i][j][e], alpha_p[sp], tmp[i][j][e] * fac_p[sp]);
        }
  }

  // ---- epilogue: row sums across the CTA, normalized partial output, base-2 LSE ---------------
#pragma unroll
  for (int sl = 0; sl < NSL; ++sl) {
    const float l = warp_sum_xor(l_s[sl], 4);
    const int h = sm_head(sl);
    if (lane < 4 && h < G) red_sum[warp * kMaxG + h] = l;
  }
  __syncthreads();
  const int S1 = a.max_splits + 1;
  const size_t obase = size_t(b) * a.q_heads + size_t(kvh) * G;
#pragma unroll
  for (int sp = 0; sp < NSLP; ++sp) {
    const int h = pv_head(sp);
    if (h >= G) continue;
    const float l = red_sum[h] + red_sum[kMaxG + h] + red_sum[2 * kMaxG + h] + red_sum[3 * kMaxG + h];
    const float inv = l > 0.0f ? 1.0f / l : 0.0f;
    const int j = sp / 2, e0 = sp % 2;
#pragma unroll
    for (int i = 0; i < CGW; ++i)
#pragma unroll
      for (int rr = 0; rr < 2; ++rr) {
        const int c = (warp * CGW + i) * 16 + lane / 4 + 8 * rr;
        a.part_o[((obase + h) * S1 + split) * D + c] = o[i][j][2 * rr + e0] * inv;
      }
    if (warp == 0 && lane < 4) a.part_lse[(obase + h) * S1 + split] = l > 0.0f ? m_p[sp] + log2f(l) - a.log2c : neg_inf();
  }
}

// ---- combine -----------------------------------------------------------------------------------

template <int D>
__global__ void __launch_bounds__(D) combine_kernel(const CombineArgs a) {
  const int qh = blockIdx.x, b = blockIdx.y, c = threadIdx.x;
  __shared__ float red[D / 32];
  extern __shared__ float s_lse[];  // [max_splits + 1]: the valid splits' LSE, else -inf
  const size_t oi = (size_t(b) * a.q_heads + qh) * D + c;
  if (a.error_flags && a.error_flags[0] != 0) {
    a.out[oi] = __int_as_float(0x7fc00000);
    if (a.lse && c == 0) a.lse[size_t(b) * a.q_heads + qh] = __int_as_float(0x7fc00000);
    return;
  }
  const int n = (a.num_rows && b >= a.num_rows[0]) ? 0 : a.seq_lens[b];
  if (n <= 0) {
    a.out[oi] = 0.0f;
    if (a.lse && c == 0) a.lse[size_t(b) * a.q_heads + qh] = neg_inf();
    return;
  }
  const KvFormat f = KvFormat(a.kv_format);
  const int pages = attended_pages(n, f, a.sink != 0, a.recent != 0);
  const int splits = pages > 0 ? min(a.row_splits[b], a.max_splits) : 0, pps = a.row_pps[b];
  const bool bf = f != KvFormat::bf16 && decode_layout(n, true, a.sink != 0, a.recent != 0).bf16_tokens() > 0;
  const int S1 = a.max_splits + 1;
  const size_t base = (size_t(b) * a.q_heads + qh) * S1;
  auto valid = [&](int s) { return s == a.max_splits ? bf : (s < splits && pps > 0 && s * pps < pages); };
  for (int s = c; s < S1; s += D) s_lse[s] = valid(s) ? a.part_lse[base + s] : neg_inf();
  __syncthreads();
  float big = neg_inf();
  for (int s = 0; s < S1; ++s) big = fmaxf(big, s_lse[s]);
  float wsum = 0.0f, acc = 0.0f;
#pragma unroll 4
  for (int s = 0; s < S1; ++s) {
    const float ls = s_lse[s];
    if (ls == neg_inf()) continue;
    const float w = exp2f(ls - big);
    wsum += w;
    acc = fmaf(w, a.part_o[(base + s) * D + c], acc);
  }
  if (!(wsum > 0.0f)) {  // no split contributed (a row the control kernel gave no work)
    a.out[oi] = 0.0f;
    if (a.lse && c == 0) a.lse[size_t(b) * a.q_heads + qh] = neg_inf();
    return;
  }
  a.out[oi] = acc / wsum;
  if (!a.lse) return;
  float shift = 0.0f;
  if (a.mu_k) {
    const float qv = a.q[oi];
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

template <int FMT, int D, int T, int NT>
void launch_decode(const KernelArgs& a, cudaStream_t stream) {
  const int smem = Geo<FMT, D, NT>::smem_bytes(a.G);
  static bool configured = false;
  if (!configured) {
    cudaFuncSetAttribute(decode_kernel<FMT, D, T, NT>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                         Geo<FMT, D, NT>::smem_bytes(kMaxG));
    configured = true;
  }
  const dim3 grid(a.max_splits + 1, a.kv_heads, a.batch);
  decode_kernel<FMT, D, T, NT><<<grid, kThreads, smem, stream>>>(a);
}

template <int D>
void launch_combine(const CombineArgs& a, cudaStream_t stream) {
  combine_kernel<D><<<dim3(a.q_heads, a.batch), D, (a.max_splits + 1) * sizeof(float), stream>>>(a);
}

}  // namespace fp4kv::attention::detail
