// Per-format page traits of the decode kernel: what differs between NVFP4, MXFP4, FP8 and
// BF16 pages once a page is in shared memory (cache/layout.h owns the bytes, fragment.h the
// register-level index mapping). Each traits type gives
//   - its format, block size and how its pages arrive (one bulk copy, or cp.async rows);
//   - the page factors of S and of the P.V partial (FP32 page scales, the FP4 expansion's
//     2^14);
//   - the key side of S^T = K Q^T: the block scales of a warp's 16 key rows and one k-step
//     of A fragments into the accumulator chains (`key_kstep`);
//   - the value side of O^T += V^T P^T: one k-step of a channel group (`value_kstep`).
// The loops around these steps are shared (decode_mainloop.cuh); a step reads only its
// arguments.
#pragma once

#include "fp4kv/attention/device_common.cuh"
#include "fp4kv/attention/fragment.h"
#include "fp4kv/cache/layout.h"
#include "fp4kv/core/block_quant.h"

namespace fp4kv::attention::detail {

// FP4 codes expand to FP16 as value x 2^-14 (fragment.h: E2M1 0.5 is the subnormal 2^-15);
// the page factors carry the 2^14 back.
inline constexpr float kFp4ExpansionScale = 16384.0f;
// MXFP4 codes (queries and native P) live in FP16 as code x 2^(e - emax + 13): exponents
// relative to the largest of their group (emax), and the 2^13 keeps the E2M1 grid (down to
// 0.5 x 2^-13 = 2^-14) in FP16's normal range; an FP32 factor restores 2^(emax - 13).
// Shifts below FP32's smallest exponent clamp there (those codes are zero anyway).
inline constexpr int kFp16CodeShift = 13;
inline constexpr int kMinFloatExponent = -149;

// ---- Fragment building blocks ---------------------------------------------------------------

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
// MXFP4 block scales stay in FP32 (e8m0_pair_values_x2, fragment.h): the codes expand to
// FP16 without them (value x 2^-14), a block's two k-step MMAs go to a fresh accumulator,
// and the power-of-two scales of its rows r, r + 8 (low and high byte of a scale pair),
// doubled so that every code is a normal float without a case of its own, multiply that in
// FP32: 4 FFMA per block instead of 8 HMUL2 plus an E8M0 -> FP16 conversion, exact for every
// block scale. The page factors take the doubling back (kMxExpansionScale).
inline constexpr float kMxExpansionScale = kFp4ExpansionScale / 2;
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

// The 16-bit scale pairs (rows r, r + 8) of `N` consecutive blocks from shared memory, as
// N / 2 words (pair 2k in the low half of word k), 16 bytes at a time when N is a multiple of
// 8 (the address is then 16-byte aligned: scale_row_offset), else 8 or 4.
template <int N>
__device__ __forceinline__ void load_scale_words(const uint16_t* p, uint32_t (&w)[N / 2]) {
  static_assert(N % 2 == 0 && N >= 2, "whole words of scale pairs");
  if constexpr (N % 8 == 0) {
#pragma unroll
    for (int q = 0; q < N / 8; ++q) {
      const uint4 v = reinterpret_cast<const uint4*>(p)[q];
      w[4 * q] = v.x, w[4 * q + 1] = v.y, w[4 * q + 2] = v.z, w[4 * q + 3] = v.w;
    }
  } else if constexpr (N == 4) {
    const uint2 v = *reinterpret_cast<const uint2*>(p);
    w[0] = v.x, w[1] = v.y;
  } else {
    w[0] = *reinterpret_cast<const uint32_t*>(p);
  }
}
// Pair i (the row-r byte low) of such words; only the low 16 bits are meaningful.
__device__ __forceinline__ uint32_t scale_pair(const uint32_t* words, int i) { return words[i / 2] >> (16 * (i % 2)); }

// ---- The formats ------------------------------------------------------------------------------

struct NvFp4Page {
  static constexpr KvFormat kFormat = KvFormat::nvfp4;
  static constexpr bool kFp4 = true;
  static constexpr bool kBulk = true;       // one bulk copy per page; P.V one page behind S
  static constexpr bool kBf16Mma = false;   // 16-bit operands are FP16
  static constexpr bool kE8M0Scales = false;
  static constexpr int kBlock = kNvfp4Block;
  static constexpr int kKStepsPerPart = 4;  // k-steps in one 16-byte code part of a lane

  __device__ __forceinline__ static void page_factors(const uint8_t* stage, int page_scales, float& kfac, float& vfac) {
    const float* pscale = reinterpret_cast<const float*>(stage + page_scales);
    kfac = __fmul_rn(pscale[0], kFp4ExpansionScale);
    vfac = __fmul_rn(pscale[1], kFp4ExpansionScale);
  }

  // Block scales of the warp's key rows: one FP16 pair (rows r, r + 8) per block.
  template <int NBK>
  struct KeyScales {
    uint32_t h2[NBK];
  };
  template <int NBK>
  __device__ __forceinline__ static void load_key_scales(const uint16_t* p, KeyScales<NBK>& s) {
    uint32_t words[NBK / 2];
    load_scale_words<NBK>(p, words);
#pragma unroll
    for (int q = 0; q < NBK; ++q) s.h2[q] = e4m3_pair_to_half2_bits(words, q);
  }
  template <int NC, int NT, int NBK, class Q>
  __device__ __forceinline__ static void key_kstep(float (&acc2)[NC][NT][4], float (&)[NT][4], const KeyScales<NBK>& s,
                                                   const uint32_t (&wv)[4], int sub, int ks, const Q& q) {
    uint32_t af[4];
    expand_fp4(af, wv[sub], s.h2[ks]);
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) mma_f16(acc2[ks % NC][nt], af, q.b(ks, nt, 0), q.b(ks, nt, 1));
  }

  // V: scale pairs of the blocks of `ksteps` k-steps (one block per k-step of 16 keys).
  static constexpr int value_scale_pairs(int ksteps) { return ksteps; }
  template <int CGW, int NTP, int NV, int NW>
  __device__ __forceinline__ static void value_kstep(float (&tmp2)[2][CGW][NTP][4], float (&)[NTP][4], int ci,
                                                     const uint32_t (&vw)[NV], const uint32_t (&vsw)[NW], int kk,
                                                     const uint32_t (&pb)[NTP][4]) {
    uint32_t af[4];
    expand_fp4(af, vw[kk], e4m3_pair_to_half2_bits(vsw, kk));
#pragma unroll
    for (int j = 0; j < NTP; ++j) mma_f16(tmp2[kk % 2][ci][j], af, pb[j][2 * (kk % 2)], pb[j][2 * (kk % 2) + 1]);
  }
};

struct MxFp4Page {
  static constexpr KvFormat kFormat = KvFormat::mxfp4;
  static constexpr bool kFp4 = true;
  static constexpr bool kBulk = true;
  static constexpr bool kBf16Mma = false;
  static constexpr bool kE8M0Scales = true;  // power-of-two block scales, applied in FP32
  static constexpr int kBlock = kMxfp4Block;
  static constexpr int kKStepsPerPart = 4;

  // No page scale: the block scales carry the magnitude (applied in FP32 per block, doubled).
  __device__ __forceinline__ static void page_factors(const uint8_t*, int, float& kfac, float& vfac) {
    kfac = kMxExpansionScale;
    vfac = kMxExpansionScale;
  }

  template <int NBK>
  struct KeyScales {
    float f[NBK][2];  // twice the FP32 scales of rows r, r + 8 per block
  };
  template <int NBK>
  __device__ __forceinline__ static void load_key_scales(const uint16_t* p, KeyScales<NBK>& s) {
    uint32_t words[NBK / 2];
    load_scale_words<NBK>(p, words);
#pragma unroll
    for (int q = 0; q < NBK; ++q) e8m0_pair_values_x2(scale_pair(words, q), s.f[q]);
  }
  // A block is two k-steps: its product goes to a fresh accumulator, then in FP32 times the
  // row scales into the chain of the block.
  template <int NC, int NT, int NBK, class Q>
  __device__ __forceinline__ static void key_kstep(float (&acc2)[NC][NT][4], float (&bacc)[NT][4],
                                                   const KeyScales<NBK>& s, const uint32_t (&wv)[4], int sub, int ks,
                                                   const Q& q) {
    uint32_t af[4];
    fp4_word_to_a_regs(wv[sub], af);
    if (ks % 2 == 0) zero(bacc);
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) mma_f16(bacc[nt], af, q.b(ks, nt, 0), q.b(ks, nt, 1));
    if (ks % 2 == 1) {
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) add_scaled(acc2[(ks / 2) % NC][nt], bacc[nt], s.f[ks / 2]);
    }
  }

  // V: scale pairs of the blocks of `ksteps` k-steps (a block is two k-steps).
  static constexpr int value_scale_pairs(int ksteps) { return ksteps / 2; }
  template <int CGW, int NTP, int NV, int NW>
  __device__ __forceinline__ static void value_kstep(float (&tmp2)[2][CGW][NTP][4], float (&bacc)[NTP][4], int ci,
                                                     const uint32_t (&vw)[NV], const uint32_t (&vsw)[NW], int kk,
                                                     const uint32_t (&pb)[NTP][4]) {
    uint32_t af[4];
    fp4_word_to_a_regs(vw[kk], af);
    if (kk % 2 == 0) zero(bacc);
#pragma unroll
    for (int j = 0; j < NTP; ++j) mma_f16(bacc[j], af, pb[j][2 * (kk % 2)], pb[j][2 * (kk % 2) + 1]);
    if (kk % 2 == 1) {
      float f[2];
      e8m0_pair_values_x2(scale_pair(vsw, kk / 2), f);
#pragma unroll
      for (int j = 0; j < NTP; ++j) add_scaled(tmp2[(kk / 2) % 2][ci][j], bacc[j], f);
    }
  }
};

struct Fp8Page {
  static constexpr KvFormat kFormat = KvFormat::fp8;
  static constexpr bool kFp4 = false;
  static constexpr bool kBulk = true;
  static constexpr bool kBf16Mma = false;
  static constexpr bool kE8M0Scales = false;
  static constexpr int kBlock = 0;          // per-page scales only
  static constexpr int kKStepsPerPart = 2;  // 8 bytes of codes per lane and k-step

  __device__ __forceinline__ static void page_factors(const uint8_t* stage, int page_scales, float& kfac, float& vfac) {
    const float* pscale = reinterpret_cast<const float*>(stage + page_scales);
    kfac = pscale[0];
    vfac = pscale[1];
  }

  template <int NBK>
  struct KeyScales {};
  template <int NBK>
  __device__ __forceinline__ static void load_key_scales(const uint16_t*, KeyScales<NBK>&) {}
  template <int NC, int NT, int NBK, class Q>
  __device__ __forceinline__ static void key_kstep(float (&acc2)[NC][NT][4], float (&)[NT][4], const KeyScales<NBK>&,
                                                   const uint32_t (&wv)[4], int sub, int ks, const Q& q) {
    uint32_t af[4];
    expand_fp8(af, wv[2 * sub], wv[2 * sub + 1]);
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) mma_f16(acc2[ks % NC][nt], af, q.b(ks, nt, 0), q.b(ks, nt, 1));
  }

  static constexpr int value_scale_pairs(int) { return 0; }
  template <int CGW, int NTP, int NV, int NW>
  __device__ __forceinline__ static void value_kstep(float (&tmp2)[2][CGW][NTP][4], float (&)[NTP][4], int ci,
                                                     const uint32_t (&vw)[NV], const uint32_t (&)[NW], int kk,
                                                     const uint32_t (&pb)[NTP][4]) {
    uint32_t af[4];
    expand_fp8(af, vw[2 * kk], vw[2 * kk + 1]);
#pragma unroll
    for (int j = 0; j < NTP; ++j) mma_f16(tmp2[kk % 2][ci][j], af, pb[j][2 * (kk % 2)], pb[j][2 * (kk % 2) + 1]);
  }
};

// BF16 pages keep every token (no slot rows, no scales) and stream through cp.async stages
// with a zero fill past the last token and rows swizzled by 16-byte chunk (conflict-free
// ldmatrix); every warp multiplies its own 16 keys into all channels (decode_mainloop.cuh).
struct Bf16Page {
  static constexpr KvFormat kFormat = KvFormat::bf16;
  static constexpr bool kFp4 = false;
  static constexpr bool kBulk = false;
  static constexpr bool kBf16Mma = true;
  static constexpr bool kE8M0Scales = false;
  static constexpr int kBlock = 0;

  // Swizzled 16-byte chunk `ch` of row `row` (D / 8 chunks per row).
  template <int D>
  __device__ __forceinline__ static int chunk_offset(int row, int ch) {
    return (row * (D / 8) + (ch ^ (row % 8))) * 16;
  }

  // Copies a page's K and V rows; rows at or past valid_tokens are zero-filled (garbage
  // there could be NaN, and NaN x 0 is NaN in the MMA).
  template <int D>
  __device__ __forceinline__ static void load_page(uint8_t* stage, const uint8_t* src, int valid_tokens, int tid) {
    constexpr auto L = cache::PageLayout::make(KvFormat::bf16, D);
    const uint32_t dst = smem_u32(stage);
    constexpr int CPR = D / 8;  // 16-byte chunks per row
    // Unsigned chunk indices: the divisions by powers of two are shifts (no signed rounding).
    for (unsigned c = tid; c < 2 * kPageTokens * CPR; c += kThreads) {
      const int kv = c / (kPageTokens * CPR), rem = c % (kPageTokens * CPR);
      const int t = rem / CPR, ch = rem % CPR;
      const int off = (kv ? L.v_codes : L.k_codes);
      cp_async16(dst + off + chunk_offset<D>(t, ch), src + off + (t * CPR + ch) * 16, t < valid_tokens ? 16 : 0);
    }
  }

  // S^T of the warp's 16 keys: the K tile by ldmatrix from the swizzled rows.
  template <int D, int NC, int NT, class Q>
  __device__ __forceinline__ static void key_product(const uint8_t* k_rows, int warp, int lane, const Q& q,
                                                     float (&acc2)[NC][NT][4]) {
#pragma unroll
    for (int ks = 0; ks < D / 16; ++ks) {
      const int i = lane / 8;
      const int row = warp * 16 + (i % 2) * 8 + lane % 8, ch = ks * 2 + i / 2;
      uint32_t af[4];
      ldmatrix_x4(af, smem_u32(k_rows + chunk_offset<D>(row, ch)));
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) mma_bf16(acc2[ks % NC][nt], af, q.b(ks, nt, 0), q.b(ks, nt, 1));
    }
  }
};

}  // namespace fp4kv::attention::detail
