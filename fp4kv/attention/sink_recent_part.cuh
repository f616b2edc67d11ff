// The BF16 sink + recent CTA of a (row, KV head): the tokens the recipe keeps in BF16 (the
// first kSinkTokens and the recent ring of the slot buffer, cache/layout.h) attended on
// tensor cores, its partial (o, base-2 LSE) written as split max_splits for the combine.
// All kBf16Rows rows are fetched at once (one memory latency; rows past the row's count are
// zero-filled, so the MMAs see zeros there, never stale NaNs). S^T = K Q^T and O^T = V^T P^T
// by BF16 mma.m16n8k16 with FP32 accumulation; the FP32 operands (the rotated queries and
// the probabilities) enter as two BF16 parts, hi = bf16(x) and lo = bf16(x - hi), whose
// products with the BF16 keys and values are exact, so each dot product carries x to ~2^-16
// relative, below the FP32 reference's summation-order differences that the tests bound.
// This CTA runs beside split CTAs of a few pages at short contexts, so its phases are
// short: two MMA passes and a warp-per-head softmax between them.
#pragma once

#include "fp4kv/attention/device_common.cuh"
#include "fp4kv/attention/page_traits.cuh"
#include "fp4kv/attention/smem_plan.cuh"
#include "fp4kv/cache/layout.h"
#include "fp4kv/core/decode_layout.h"

namespace fp4kv::attention::detail {

// Slot row of the i-th BF16 token the row attends: the sink rows first, then the recent
// ring (slot rows kSinkTokens + position % kPageTokens).
__device__ __forceinline__ int slot_row_of(int i, const DecodeLayout& L) {
  return i < L.sink_tokens ? i : kSinkTokens + (L.recent_begin + i - L.sink_tokens) % kPageTokens;
}

// Copies the BF16 rows the row attends (in attention order) from the slot to dst, kBf16Rows
// rows of D, the 16-byte chunks swizzled as a BF16 page's (conflict-free ldmatrix); rows
// from the row's count on are zero-filled.
template <int D>
__device__ __forceinline__ void load_slot_rows(uint8_t* dst, const uint16_t* src0, const DecodeLayout& L, int tid) {
  constexpr int CPR = D / 8;  // 16-byte chunks per row
  const int nbf = L.bf16_tokens();
  const uint32_t dst0 = smem_u32(dst);
  for (unsigned c = tid; c < kBf16Rows * CPR; c += kThreads) {
    const int i = c / CPR, ch = c % CPR;
    const bool attended = i < nbf;
    cp_async16(dst0 + Bf16Page::chunk_offset<D>(i, ch), src0 + size_t(slot_row_of(attended ? i : 0, L)) * D + ch * 8,
               attended ? 16 : 0);
  }
  cp_async_commit();
}

// The start of the CTA (region: the rows and scores): the row's K and V slot rows on their
// way to shared memory (cp.async, awaited by sink_recent_part), overlapping the query
// prologue the kernel runs next. False when the control kernel failed the row's slot: the
// row contributes nothing (LSE -inf) and the CTA is done.
template <int D>
__device__ bool start_sink_recent(const KernelArgs& a, uint8_t* region, int b, int kvh, const DecodeLayout& L,
                                  int tid) {
  const int slot = a.row_slot ? a.row_slot[b] : b;
  if (slot < 0 || slot >= a.slots) {
    const size_t obase = size_t(b) * a.q_heads + size_t(kvh) * a.G;
    if (tid < a.G) a.part_lse[(obase + tid) * (a.max_splits + 1) + a.max_splits] = neg_inf();
    return false;
  }
  uint8_t* Kc = region;                                     // [144][D] bf16, swizzled
  uint8_t* Vc = region + kBf16Rows * D * sizeof(uint16_t);  // [144][D] bf16, swizzled
  const uint16_t* kb = a.slot_buffer + cache::slot_row_offset(0, slot, kvh, 0, 0, a.slots, a.kv_heads, D);
  const uint16_t* vb = a.slot_buffer + cache::slot_row_offset(0, slot, kvh, 1, 0, a.slots, a.kv_heads, D);
  load_slot_rows<D>(Kc, kb, L, tid);
  load_slot_rows<D>(Vc, vb, L, tid);
  return true;
}

// x0, x1 as two BF16 pairs whose sum is (x0, x1) to ~2^-16 relative: hi = bf16(x) and
// lo = bf16(x - hi) (x - hi is exact in FP32); the lower k in the low half, as MMA operands.
__device__ __forceinline__ void split_bf16x2(float x0, float x1, uint32_t& hi, uint32_t& lo) {
  const uint32_t h0 = bf16_bits(x0), h1 = bf16_bits(x1);
  hi = h0 | (h1 << 16);
  lo = bf16_bits(__fsub_rn(x0, __uint_as_float(h0 << 16))) | (bf16_bits(__fsub_rn(x1, __uint_as_float(h1 << 16))) << 16);
}

// S of the BF16 rows: Sb[h][i] = gamma (q_h . k_i) for heads h < G and keys i < nbf, as S^T
// (keys x heads) = K Q^T: warp w takes the key tiles w, w + kWarps, ... and each column tile
// of 8 heads; A = 16 keys x 16 channels by ldmatrix, B = the queries' hi and lo parts.
template <int D>
__device__ __forceinline__ void sink_recent_scores(const uint8_t* Kc, const float* qf, float* Sb, int G, int nbf,
                                                   float gamma, int warp, int lane) {
  const int column_tiles = (G + 7) / 8;
  for (int kt = warp; kt * 16 < nbf; kt += kWarps)
    for (int nt = 0; nt < column_tiles; ++nt) {
      const int h = nt * 8 + lane / 4;  // the lane's B column
      const float* q = qf + h * D + 2 * (lane % 4);
      float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll 4
      for (int ks = 0; ks < D / 16; ++ks) {
        const int m = lane / 8;  // the ldmatrix sub-matrix this lane addresses
        uint32_t af[4];
        ldmatrix_x4(af, smem_u32(Kc + Bf16Page::chunk_offset<D>(kt * 16 + (m % 2) * 8 + lane % 8, ks * 2 + m / 2)));
        float2 q0 = make_float2(0.0f, 0.0f), q1 = q0;
        if (h < G) {
          q0 = *reinterpret_cast<const float2*>(q + ks * 16);
          q1 = *reinterpret_cast<const float2*>(q + ks * 16 + 8);
        }
        uint32_t hi0, lo0, hi1, lo1;
        split_bf16x2(q0.x, q0.y, hi0, lo0);
        split_bf16x2(q1.x, q1.y, hi1, lo1);
        mma_bf16(acc, af, hi0, hi1);
        mma_bf16(acc, af, lo0, lo1);
      }
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int i = kt * 16 + c_frag_row(lane, e), hh = nt * 8 + c_frag_col(lane, e);
        if (i < nbf && hh < G) Sb[hh * kBf16Rows + i] = __fmul_rn(acc[e], gamma);
      }
    }
}

// The softmax of the BF16 rows, a warp per head: Sb[h][i] becomes p = 2^(s - m); red[h] = m,
// red[kMaxG + h] = the sum of p.
__device__ __forceinline__ void sink_recent_softmax(float* Sb, float* red, int G, int nbf, int warp, int lane) {
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
}

// P.V of the BF16 rows and the partial (o, base-2 LSE) of each head, written as split
// max_splits: O^T (channels x heads) = V^T P^T, warp w taking the channel tiles w, w + kWarps,
// ... and each column tile of 8 heads over all keys; A = 16 channels x 16 keys by transposed
// ldmatrix, B = the probabilities' hi and lo parts (zero past nbf and past G).
template <int D>
__device__ __forceinline__ void sink_recent_values(const KernelArgs& a, const uint8_t* Vc, const float* Sb,
                                                   const float* red, size_t obase, int G, int nbf, int warp,
                                                   int lane) {
  const int column_tiles = (G + 7) / 8, key_steps = (nbf + 15) / 16;
  const int S1 = a.max_splits + 1;
  for (int ct = warp; ct < D / 16; ct += kWarps)
    for (int nt = 0; nt < column_tiles; ++nt) {
      const int h = nt * 8 + lane / 4;  // the lane's B column
      const float* p = Sb + h * kBf16Rows + 2 * (lane % 4);
      float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
      for (int ks = 0; ks < key_steps; ++ks) {
        const int m = lane / 8;
        uint32_t af[4];
        ldmatrix_x4_trans(af, smem_u32(Vc + Bf16Page::chunk_offset<D>(ks * 16 + (m / 2) * 8 + lane % 8, ct * 2 + m % 2)));
        const int k0 = ks * 16 + 2 * (lane % 4);  // the lane's keys: k0, k0 + 1, k0 + 8, k0 + 9
        float pk[4];
#pragma unroll
        for (int r = 0; r < 4; ++r) {
          const int key = k0 + (r / 2) * 8 + r % 2;
          pk[r] = h < G && key < nbf ? p[ks * 16 + (r / 2) * 8 + r % 2] : 0.0f;
        }
        uint32_t hi0, lo0, hi1, lo1;
        split_bf16x2(pk[0], pk[1], hi0, lo0);
        split_bf16x2(pk[2], pk[3], hi1, lo1);
        mma_bf16(acc, af, hi0, hi1);
        mma_bf16(acc, af, lo0, lo1);
      }
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int c = ct * 16 + c_frag_row(lane, e), hh = nt * 8 + c_frag_col(lane, e);
        if (hh >= G) continue;
        const float l = red[kMaxG + hh];
        a.part_o[((obase + hh) * S1 + a.max_splits) * D + c] = acc[e] / l;
        if (c == 0) a.part_lse[(obase + hh) * S1 + a.max_splits] = red[hh] + log2f(l);
      }
    }
}

// The rest of the CTA's work, after start_sink_recent and the query prologue (qf: the rotated
// FP32 queries; red: [2][kMaxG] maxima and sums).
template <int D>
__device__ void sink_recent_part(const KernelArgs& a, uint8_t* region, const float* qf, float* red, int b, int kvh,
                                 const DecodeLayout& L, int tid) {
  const int G = a.G, warp = tid / 32, lane = tid % 32;
  const int nbf = L.bf16_tokens();
  const uint8_t* Kc = region;
  const uint8_t* Vc = region + kBf16Rows * D * sizeof(uint16_t);
  float* Sb = reinterpret_cast<float*>(region + 2 * kBf16Rows * D * sizeof(uint16_t));  // [kMaxG][144]
  const size_t obase = size_t(b) * a.q_heads + size_t(kvh) * G;
  cp_async_wait<0>();
  __syncthreads();
  sink_recent_scores<D>(Kc, qf, Sb, G, nbf, a.gamma, warp, lane);
  __syncthreads();
  sink_recent_softmax(Sb, red, G, nbf, warp, lane);
  __syncthreads();
  sink_recent_values<D>(a, Vc, Sb, red, obase, G, nbf, warp, lane);
}

}  // namespace fp4kv::attention::detail
