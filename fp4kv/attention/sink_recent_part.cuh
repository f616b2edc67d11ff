// The BF16 sink + recent CTA of a (row, KV head): the tokens the recipe keeps in BF16 (the
// first kSinkTokens and the recent ring of the slot buffer, cache/layout.h) attended with
// FP32 CUDA-core math, its partial (o, base-2 LSE) written as split max_splits for the
// combine. All rows are fetched at once (one memory latency), S = q'.k' by 8 lanes per key
// with 3 shuffles, P.V by (channel pair, head group) threads over the keys in four chains.
#pragma once

#include "fp4kv/attention/device_common.cuh"
#include "fp4kv/attention/smem_plan.cuh"
#include "fp4kv/cache/layout.h"
#include "fp4kv/core/decode_layout.h"

namespace fp4kv::attention::detail {

// Slot row of the i-th BF16 token the row attends: the sink rows first, then the recent
// ring (slot rows kSinkTokens + position % kPageTokens).
__device__ __forceinline__ int slot_row_of(int i, const DecodeLayout& L) {
  return i < L.sink_tokens ? i : kSinkTokens + (L.recent_begin + i - L.sink_tokens) % kPageTokens;
}

// Copies the BF16 rows the row attends (in attention order) from the slot to dst [rows][D].
template <int D>
__device__ __forceinline__ void load_slot_rows(uint16_t* dst, const uint16_t* src0, const DecodeLayout& L, int tid) {
  constexpr int CPR = D / 8;  // 16-byte chunks per row
  const int nbf = L.bf16_tokens();
  for (int c = tid; c < nbf * CPR; c += kThreads) {
    const int i = c / CPR, ch = c % CPR;
    cp_async16(smem_u32(dst + i * D + ch * 8), src0 + size_t(slot_row_of(i, L)) * D + ch * 8);
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
  uint16_t* Kc = reinterpret_cast<uint16_t*>(region);  // [144][D] bf16
  uint16_t* Vc = Kc + kBf16Rows * D;                   // [144][D] bf16
  const uint16_t* kb = a.slot_buffer + cache::slot_row_offset(0, slot, kvh, 0, 0, a.slots, a.kv_heads, D);
  const uint16_t* vb = a.slot_buffer + cache::slot_row_offset(0, slot, kvh, 1, 0, a.slots, a.kv_heads, D);
  load_slot_rows<D>(Kc, kb, L, tid);
  load_slot_rows<D>(Vc, vb, L, tid);
  return true;
}

// The rest of the CTA's work, after start_sink_recent and the query prologue (qf: the rotated
// FP32 queries; red: [2][kMaxG] maxima and sums).
template <int D>
__device__ void sink_recent_part(const KernelArgs& a, uint8_t* region, const float* qf, float* red, int b, int kvh,
                                 const DecodeLayout& L, int tid) {
  const int G = a.G, warp = tid / 32, lane = tid % 32;
  const int nbf = L.bf16_tokens();
  const uint16_t* Kc = reinterpret_cast<const uint16_t*>(region);
  const uint16_t* Vc = Kc + kBf16Rows * D;
  float* Sb = reinterpret_cast<float*>(region + 2 * kBf16Rows * D * sizeof(uint16_t));  // [kMaxG][144]
  const int S1 = a.max_splits + 1;
  const size_t obase = size_t(b) * a.q_heads + size_t(kvh) * G;
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
          kv[2 * e] = bf16_low_as_float(wv[e]);
          kv[2 * e + 1] = bf16_high_as_float(wv[e]);
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
  // P.V: thread owns channels 2 cp, 2 cp + 1 of heads hg, hg + HG, ... below G. Per head the
  // keys run in kChains interleaved FMA chains (added in a fixed order at the end) and the
  // key loop holds no branch, so the shared-memory loads of successive keys overlap; a loop
  // over all kMaxG heads with a test per head serialized them (a third of this CTA's time).
  constexpr int PAIRS = D / 2;
  constexpr int HG = kThreads / PAIRS;
  constexpr int kChains = 4;
  static_assert(kChains == 4, "the partials below add four chains");
  const int cp = tid % PAIRS, hg = tid / PAIRS;
  const uint32_t* V32 = reinterpret_cast<const uint32_t*>(Vc);
  for (int h = hg; h < G; h += HG) {
    const float* p_row = Sb + h * kBf16Rows;
    float o0[kChains], o1[kChains];
#pragma unroll
    for (int c = 0; c < kChains; ++c) o0[c] = o1[c] = 0.0f;
    int i = 0;
#pragma unroll 2
    for (; i + kChains <= nbf; i += kChains) {
#pragma unroll
      for (int c = 0; c < kChains; ++c) {
        const uint32_t w = V32[(i + c) * PAIRS + cp];
        const float p = p_row[i + c];
        o0[c] = fmaf(p, bf16_low_as_float(w), o0[c]);
        o1[c] = fmaf(p, bf16_high_as_float(w), o1[c]);
      }
    }
    for (; i < nbf; ++i) {  // the last nbf % kChains keys
      const uint32_t w = V32[i * PAIRS + cp];
      const float p = p_row[i];
      o0[0] = fmaf(p, bf16_low_as_float(w), o0[0]);
      o1[0] = fmaf(p, bf16_high_as_float(w), o1[0]);
    }
    const float l = red[kMaxG + h];
    float* dst = a.part_o + ((obase + h) * S1 + a.max_splits) * D + 2 * cp;
    dst[0] = ((o0[0] + o0[1]) + (o0[2] + o0[3])) / l;
    dst[1] = ((o1[0] + o1[1]) + (o1[2] + o1[3])) / l;
    if (cp == 0) a.part_lse[(obase + h) * S1 + a.max_splits] = red[h] + log2f(l);
  }
}

}  // namespace fp4kv::attention::detail
