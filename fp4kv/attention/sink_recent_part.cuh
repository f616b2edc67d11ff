// The BF16 sink + recent CTA of a (row, KV head): the tokens the recipe keeps in BF16 (the
// first kSinkTokens and the recent ring of the slot buffer, cache/layout.h) attended with
// FP32 CUDA-core math, its partial (o, base-2 LSE) written as split max_splits for the
// combine. All rows are fetched at once (one memory latency), S = q'.k' by 8 lanes per key
// with 3 shuffles (the lanes' query channels in registers), P.V by (channel pair, head
// group) threads over the keys in four chains. This CTA is on the critical path of short
// contexts (it runs beside split CTAs of a few pages each), so every phase is written to
// keep shared-memory traffic and dependent chains short; the order of each sum is fixed.
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

// S of the BF16 rows: Sb[h][i] = gamma (q_h . k_i) for heads h < G and keys i < nbf. Key
// i = pass * 32 + warp * 4 + lane / 8; lane % 8 (`sub`) takes the 16-byte chunks sub, sub + 8,
// ... of the key row and holds the same channels of HQ heads' queries in registers through
// all passes, so each query element is read from shared memory once per lane, not once per
// key (per key, 4 warps x G heads x d floats a pass made this loop shared-memory bound), and
// the HQ heads' FMA chains overlap. A group past G reads query rows up to HQ ceil(G / HQ) - 1
// of qf (inside its buffer, which holds GMAX rows, a multiple of 4) and drops their sums.
template <int D>
__device__ __forceinline__ void sink_recent_scores(const uint16_t* Kc, const float* qf, float* Sb, int G, int nbf,
                                                   float gamma, int warp, int lane) {
  constexpr int CH = D / 64;            // chunks per lane
  constexpr int HQ = D <= 128 ? 4 : 2;  // heads per register group: HQ x CH x 8 floats
  const int sub = lane % 8;
  for (int h0 = 0; h0 < G; h0 += HQ) {
    float q[HQ][CH][8];
#pragma unroll
    for (int j = 0; j < HQ; ++j)
#pragma unroll
      for (int k = 0; k < CH; ++k) {
        const float* src = qf + (h0 + j) * D + (sub + 8 * k) * 8;
        const float4 q0 = *reinterpret_cast<const float4*>(src);
        const float4 q1 = *reinterpret_cast<const float4*>(src + 4);
        q[j][k][0] = q0.x, q[j][k][1] = q0.y, q[j][k][2] = q0.z, q[j][k][3] = q0.w;
        q[j][k][4] = q1.x, q[j][k][5] = q1.y, q[j][k][6] = q1.z, q[j][k][7] = q1.w;
      }
    for (int base = 0; base < nbf; base += 4 * kWarps) {
      const int i = base + warp * 4 + lane / 8;
      const bool key_ok = i < nbf;
      float dot[HQ];
#pragma unroll
      for (int j = 0; j < HQ; ++j) dot[j] = 0.0f;
#pragma unroll
      for (int k = 0; k < CH; ++k) {
        uint4 w = make_uint4(0u, 0u, 0u, 0u);
        if (key_ok) w = *reinterpret_cast<const uint4*>(Kc + i * D + (sub + 8 * k) * 8);
        const uint32_t wv[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          const float kv = e % 2 ? bf16_high_as_float(wv[e / 2]) : bf16_low_as_float(wv[e / 2]);
#pragma unroll
          for (int j = 0; j < HQ; ++j) dot[j] = fmaf(q[j][k][e], kv, dot[j]);
        }
      }
#pragma unroll
      for (int j = 0; j < HQ; ++j) {
        float x = dot[j];
        x += __shfl_xor_sync(0xffffffffu, x, 1);
        x += __shfl_xor_sync(0xffffffffu, x, 2);
        x += __shfl_xor_sync(0xffffffffu, x, 4);
        if (sub == 0 && key_ok && h0 + j < G) Sb[(h0 + j) * kBf16Rows + i] = __fmul_rn(x, gamma);
      }
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

// Heads one pass of the P.V threads covers: kThreads threads over D / 2 channel pairs.
template <int D>
inline constexpr int kSinkValueHeadsPerPass = kThreads / (D / 2);

// P.V of the BF16 rows and the partial (o, base-2 LSE) of each head, written as split
// max_splits. Thread owns channels 2 cp, 2 cp + 1 of NH heads a pass: h, h + HG, ... (h = hg,
// hg + NH HG, ...), so each V word it loads serves NH heads. Per head the keys run in kChains
// interleaved FMA chains (added in a fixed order at the end) and the key loop holds no
// branch, so the shared-memory loads of successive keys overlap. A head of the pass at or
// past G (NH = 2) reads a probability row below kMaxG (h + HG <= 15 for every G <= 16) and
// is not written.
template <int D, int NH>
__device__ __forceinline__ void sink_recent_values(const KernelArgs& a, const uint16_t* Vc, const float* Sb,
                                                   const float* red, size_t obase, int G, int nbf, int tid) {
  constexpr int PAIRS = D / 2;
  constexpr int HG = kSinkValueHeadsPerPass<D>;
  constexpr int kChains = 4;
  static_assert(kChains == 4, "the partials below add four chains");
  const int S1 = a.max_splits + 1;
  const int cp = tid % PAIRS, hg = tid / PAIRS;
  const uint32_t* V32 = reinterpret_cast<const uint32_t*>(Vc);
  for (int h = hg; h < G; h += NH * HG) {
    float o0[NH][kChains], o1[NH][kChains];
#pragma unroll
    for (int n = 0; n < NH; ++n)
#pragma unroll
      for (int c = 0; c < kChains; ++c) o0[n][c] = o1[n][c] = 0.0f;
    int i = 0;
#pragma unroll 2
    for (; i + kChains <= nbf; i += kChains) {
      float p[NH][kChains];
#pragma unroll
      for (int n = 0; n < NH; ++n) {  // i is a multiple of 4: one 16-byte load per head
        const float4 p4 = *reinterpret_cast<const float4*>(Sb + (h + n * HG) * kBf16Rows + i);
        p[n][0] = p4.x, p[n][1] = p4.y, p[n][2] = p4.z, p[n][3] = p4.w;
      }
#pragma unroll
      for (int c = 0; c < kChains; ++c) {
        const uint32_t w = V32[(i + c) * PAIRS + cp];
        const float vlo = bf16_low_as_float(w), vhi = bf16_high_as_float(w);
#pragma unroll
        for (int n = 0; n < NH; ++n) {
          o0[n][c] = fmaf(p[n][c], vlo, o0[n][c]);
          o1[n][c] = fmaf(p[n][c], vhi, o1[n][c]);
        }
      }
    }
    for (; i < nbf; ++i) {  // the last nbf % kChains keys
      const uint32_t w = V32[i * PAIRS + cp];
#pragma unroll
      for (int n = 0; n < NH; ++n) {
        const float p = Sb[(h + n * HG) * kBf16Rows + i];
        o0[n][0] = fmaf(p, bf16_low_as_float(w), o0[n][0]);
        o1[n][0] = fmaf(p, bf16_high_as_float(w), o1[n][0]);
      }
    }
#pragma unroll
    for (int n = 0; n < NH; ++n) {
      const int hn = h + n * HG;
      if (hn >= G) continue;
      const float l = red[kMaxG + hn];
      float* dst = a.part_o + ((obase + hn) * S1 + a.max_splits) * D + 2 * cp;
      dst[0] = ((o0[n][0] + o0[n][1]) + (o0[n][2] + o0[n][3])) / l;
      dst[1] = ((o1[n][0] + o1[n][1]) + (o1[n][2] + o1[n][3])) / l;
      if (cp == 0) a.part_lse[(obase + hn) * S1 + a.max_splits] = red[hn] + log2f(l);
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
  const uint16_t* Kc = reinterpret_cast<const uint16_t*>(region);
  const uint16_t* Vc = Kc + kBf16Rows * D;
  float* Sb = reinterpret_cast<float*>(region + 2 * kBf16Rows * D * sizeof(uint16_t));  // [kMaxG][144]
  const size_t obase = size_t(b) * a.q_heads + size_t(kvh) * G;
  cp_async_wait<0>();
  __syncthreads();
  sink_recent_scores<D>(Kc, qf, Sb, G, nbf, a.gamma, warp, lane);
  __syncthreads();
  sink_recent_softmax(Sb, red, G, nbf, warp, lane);
  __syncthreads();
  if (G > kSinkValueHeadsPerPass<D>)
    sink_recent_values<D, 2>(a, Vc, Sb, red, obase, G, nbf, tid);
  else
    sink_recent_values<D, 1>(a, Vc, Sb, red, obase, G, nbf, tid);
}

}  // namespace fp4kv::attention::detail
