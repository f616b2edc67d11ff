// The online softmax of a split CTA, one page at a time (paper Algorithm 1, lines 8-17):
// which heads a thread's slots hold, its running maxima and sums, the logits of a page
// from the S^T accumulators, the page's P (FP16/BF16, or FP4 codes in native mode) and the
// rescale of the O accumulators.
//
// Slots. The S^T C fragment gives a thread 2 keys x 2 columns per column tile. Softmax
// slots (NSL per thread): T == 2 in one tile (dual-residual query at G <= 4, columns 2h and
// 2h + 1 the two terms of head h): head lane % 4; otherwise (one term, or the two terms in
// tiles t NT / 2 + .., fragment.h query_column) head 8 (sl / 2) + 2 (lane % 4) + sl % 2, the
// heads of the P.V slots (NSLP): head 8 ntp + 2 (lane % 4) + e of the O^T C fragment.
#pragma once

#include "fp4kv/attention/device_common.cuh"
#include "fp4kv/attention/fragment.h"
#include "fp4kv/attention/page_traits.cuh"
#include "fp4kv/attention/smem_plan.cuh"
#include "fp4kv/core/block_quant.h"
#include "fp4kv/core/minifloat.h"
#include "fp4kv/core/operand_quant.h"

namespace fp4kv::attention::detail {

// Compile-time shape of one split-kernel instance (page traits F, head_dim D, operand mode
// OM, NT column tiles).
template <class F, int D, int OM, int NT_>
struct SplitConfig {
  using Fmt = F;
  static constexpr int kD = D;
  static constexpr int NT = NT_;
  static constexpr int T = query_terms(OM);
  // Two query terms in one column tile (G <= 4): a thread's softmax slot is one head, whose
  // P.V slot lives in another lane of its quad (pv_slot_factors exchanges the factors).
  static constexpr bool kTermsShareTile = T == 2 && NT == 1;
  static constexpr bool kPFp4 = OM != kOm16;  // P quantized to FP4 (else FP16, BF16 on BF16 pages)
  using Plan = SmemPlan<F, D, T, NT>;
  static constexpr int NSL = T == 2 ? NT : 2 * NT;  // softmax slots (heads) per thread
  static constexpr int NTP = Plan::NTP;              // n-tiles of P.V (heads / 8)
  static constexpr int NSLP = 2 * NTP;               // P.V head slots per thread
  static constexpr int KS = Plan::KS;
  // Accumulator chains of S^T: with one column tile two (even and odd k-steps, summed by the
  // logits) halve the dependent MMA latency of a page; two or more column tiles are already
  // independent chains, and one chain each saves the logits' sums.
  static constexpr int kSChains = NT >= 2 ? 1 : 2;
  static constexpr int CGW = Plan::CGW;              // channel groups of O a warp holds
  // FP8/FP4 mixed mode with one column tile and G <= 4: only lanes 0, 1 of each quad hold
  // real heads (columns 0-3), so the softmax is split across the quad: lane q < 2 keeps
  // head 2q (its slot 0), lane q + 2 takes head 2q + 1 (lane q's slot 1, by shuffle) in its
  // slot 0; every lane then runs one slot instead of half the lanes two. (Not BF16: measured
  // slower.)
  static constexpr bool kQuadSplitType = T == 1 && NT == 1 && !kPFp4 && F::kBulk;
  // MXFP4 P (native): a P block is a warp pair's 32 keys; the tile exponent scales P.V.
  static constexpr bool kMxProb = F::kE8M0Scales && kPFp4;
  // Mixed mode, bulk pages, one column tile: the softmax tile is a page pair
  // (bulk_pair_loop), halving the per-tile work (maxima, rescale, barriers' share), where
  // the stages hold a pair and keep two pages in flight. FP4 P keeps the reference's
  // one-page tile (its codes round against the tile maximum).
  static constexpr bool kPagePairs = !kPFp4 && T == 1 && NT == 1 && F::kBulk && Plan::NS >= 4;
};

// The heads of a thread's slots.
template <class K>
struct SlotMap {
  int lane, G;
  bool quad_split;  // K::kQuadSplitType and G <= 4

  // Two terms in one tile: the column pair (2h, 2h + 1) of the thread's C fragment.
  __device__ __forceinline__ int sm_head(int sl) const {
    return K::kTermsShareTile ? c_frag_col(lane, 0) / 2 : 8 * (sl / 2) + c_frag_col(lane, sl % 2);
  }
  __device__ __forceinline__ int pv_head(int sp) const { return 8 * (sp / 2) + c_frag_col(lane, sp % 2); }
  // The head whose running max and sum a softmax slot holds.
  __device__ __forceinline__ int own_head(int sl) const {
    if (!quad_split) return sm_head(sl);
    return sl == 0 ? ((lane & 2) ? 2 * (lane & 1) + 1 : 2 * (lane % 4)) : kMaxG;
  }
};

// A thread's softmax slots: the query terms' FP32 factors, running maxima (base 2) and sums.
template <class K>
struct SoftmaxState {
  float gf0[K::NSL], gf1[K::NSL], m[K::NSL], l[K::NSL];

  __device__ __forceinline__ void init(const float* gfac, const SlotMap<K>& map) {
#pragma unroll
    for (int sl = 0; sl < K::NSL; ++sl) {
      const int h = min(map.sm_head(sl), kMaxG - 1);
      gf0[sl] = gfac[h];
      gf1[sl] = K::T == 2 ? gfac[kMaxG + h] : 0.0f;
      m[sl] = neg_inf();
      l[sl] = 0.0f;
    }
  }
};

// Slot sl's maximum over the warp's keys (x: this thread's), and its head's entry of
// red_max[buf][head][warp].
template <class K>
__device__ __forceinline__ void publish_warp_max(float x, int sl, int buf, int warp, const SlotMap<K>& map,
                                                 float* red_max, float (&wm)[K::NSL]) {
  const int h = map.sm_head(sl);
  wm[sl] = warp_max_xor(x, 4);
  if (map.lane < 4 && h < map.G) red_max[(buf * kMaxG + h) * kWarps + warp] = wm[sl];
}

// Element e of column tile nt of S^T, summed over the accumulator chains.
template <int NC, int NT>
__device__ __forceinline__ float chain_sum(const float (&acc)[NC][NT][4], int nt, int e) {
  if constexpr (NC == 1) return acc[0][nt][e];
  else return acc[0][nt][e] + acc[1][nt][e];
}

// A page's logits of the warp's 16 keys (base 2: gamma = log2 e / sqrt(d)) per softmax slot
// and row half, keys outside [first, end) masked to -inf, the warp maxima into
// red_max[buf][head][warp]. Mixed mode applies one factor per column and page, g of the
// query x (kfac x gamma); FP4 P (native) keeps the reference's order, ((acc1 g1 + acc2 g2)
// kfac) gamma: its E2M1 rounding of p turns an ulp of difference into a code flip.
// Only a row's first page (the masked sink copy) and last page (partial) mask keys: with
// 16-bit P the test is once per page (warp-uniform, so full pages skip the per-key compares:
// 1-2 % at long context); the FP4-P kernels keep the per-key select, which their register
// allocation prefers (the per-page test cost them 1-3 %).
// kPublish = false (a page pair's first page, mixed mode): the logits only; the pair's
// maxima are published by publish_pair_max.
template <class K, bool kPublish = true>
__device__ __forceinline__ void page_logits(const float (&acc2)[K::kSChains][K::NT][4], float kfac, float gamma,
                                            int first, int end, int buf, int warp, const SlotMap<K>& map,
                                            const SoftmaxState<K>& st, float* red_max, float (&sv)[K::NSL][2],
                                            float (&wm)[K::NSL]) {
  const float kg = __fmul_rn(kfac, gamma);
  const bool masked_page = first > 0 || end < kPageTokens;
#pragma unroll
  for (int sl = 0; sl < K::NSL; ++sl) {
    const float f0 = K::kPFp4 ? st.gf0[sl] : __fmul_rn(st.gf0[sl], kg);
    // Columns of heads >= G need no mask: their maxima and P are never used.
#pragma unroll
    for (int rr = 0; rr < 2; ++rr) {
      float x;
      if constexpr (K::kTermsShareTile) {
        x = __fadd_rn(__fmul_rn(chain_sum(acc2, sl, 2 * rr), f0),
                      __fmul_rn(chain_sum(acc2, sl, 2 * rr + 1), st.gf1[sl]));
      } else if constexpr (K::T == 2) {  // term 2 in the tile NT / 2 after term 1's
        const int nt = sl / 2, e = 2 * rr + sl % 2;
        x = __fadd_rn(__fmul_rn(chain_sum(acc2, nt, e), f0),
                      __fmul_rn(chain_sum(acc2, nt + K::NT / 2, e), st.gf1[sl]));
      } else {
        x = __fmul_rn(chain_sum(acc2, sl / 2, 2 * rr + sl % 2), f0);
      }
      if constexpr (K::kPFp4) {
        x = __fmul_rn(__fmul_rn(x, kfac), gamma);
        const int key = 16 * warp + c_frag_row(map.lane, 2 * rr);
        sv[sl][rr] = (key >= first && key < end) ? x : neg_inf();
      } else {
        sv[sl][rr] = x;
      }
    }
    if constexpr (K::kPFp4) publish_warp_max<K>(fmaxf(sv[sl][0], sv[sl][1]), sl, buf, warp, map, red_max, wm);
  }
  if constexpr (!K::kPFp4) {
    if (masked_page) {
#pragma unroll
      for (int rr = 0; rr < 2; ++rr) {
        const int key = 16 * warp + c_frag_row(map.lane, 2 * rr);
        if (key < first || key >= end)
#pragma unroll
          for (int sl = 0; sl < K::NSL; ++sl) sv[sl][rr] = neg_inf();
      }
    }
    if constexpr (kPublish)
#pragma unroll
      for (int sl = 0; sl < K::NSL; ++sl) publish_warp_max<K>(fmaxf(sv[sl][0], sv[sl][1]), sl, buf, warp, map, red_max, wm);
  }
}

// The maxima of a page pair's logits (mixed mode: the softmax tile is two pages), per slot
// over the warp's 32 keys, into red_max[0][head][warp] (a pair needs one buffer:
// bulk_pair_loop), and wm (as publish_warp_max's).
template <class K>
__device__ __forceinline__ void publish_pair_max(const float (&sa)[K::NSL][2], const float (&sb)[K::NSL][2], int warp,
                                                 const SlotMap<K>& map, float* red_max, float (&wm)[K::NSL]) {
  static_assert(!K::kPFp4, "page pairs are a mixed-mode tile");
#pragma unroll
  for (int sl = 0; sl < K::NSL; ++sl)
    publish_warp_max<K>(fmaxf(fmaxf(sa[sl][0], sa[sl][1]), fmaxf(sb[sl][0], sb[sl][1])), sl, 0, warp, map, red_max, wm);
}

// The recipe's P rule (uniform per launch), read from the kernel arguments where used.
struct ProbRule {
  const KernelArgs& a;
  __device__ __forceinline__ float log2c() const { return a.log2c; }  // log2 c (0 unless P is FP4)
  __device__ __forceinline__ float tau() const { return a.tau; }      // underflow-aware P threshold
  __device__ __forceinline__ bool underflow() const { return a.pmode == kPNvUnderflow; }
};

// Tile maximum of head h over the 8 warps' maxima.
__device__ __forceinline__ float tile_max(const float* red_max, int buf, int h) {
  static_assert(kWarps == 8, "tile_max reads 8 warp maxima");
  const float4 x0 = *reinterpret_cast<const float4*>(red_max + (buf * kMaxG + h) * kWarps);
  const float4 x1 = *reinterpret_cast<const float4*>(red_max + (buf * kMaxG + h) * kWarps + 4);
  return fmaxf(fmaxf(fmaxf(x0.x, x0.y), fmaxf(x0.z, x0.w)), fmaxf(fmaxf(x1.x, x1.y), fmaxf(x1.z, x1.w)));
}
// Maximum of head h over the warp pair of `warp` (an MXFP4 P block).
__device__ __forceinline__ float pair_max(const float* red_max, int buf, int h, int warp) {
  const float* r = red_max + (buf * kMaxG + h) * kWarps + (warp & ~1);
  return fmaxf(r[0], r[1]);
}

// The running maximum m of a slot raised to cover a tile whose maximum is mt: returns the
// maximum the tile's p subtract and sets alpha = 2^(m_old - m_new), the rescale of l and O.
// A tile (and split) with no attended key yet (the masked sink copy on page 0 with no BF16
// recent and n <= 16) subtracts 0, so that p = 0 and alpha = 0, not NaN.
__device__ __forceinline__ float raise_running_max(float& m, float mt, float& alpha) {
  const float mn = fmaxf(m, mt);
  const float mz = mn == neg_inf() ? 0.0f : mn;
  alpha = fast_exp2(__fsub_rn(m, mz));
  m = mn;
  return mz;
}

// The P.V slots' rescale from the softmax slots' where they hold the same heads (one query
// term, or two in separate tiles); with the quad split, head 2q + 1's rescale lives in lane
// q + 2, and lanes q + 2 get lane q's: their columns are padding heads, whose P is zero.
template <class K>
__device__ __forceinline__ void pv_slot_alphas(const float (&alpha_s)[K::NSL], const SlotMap<K>& map,
                                               float (&alpha_p)[K::NSLP]) {
  static_assert(!K::kTermsShareTile && K::NSL == K::NSLP, "softmax and P.V slots hold the same heads");
#pragma unroll
  for (int sp = 0; sp < K::NSLP; ++sp) alpha_p[sp] = alpha_s[sp];
  if constexpr (K::kQuadSplitType) {
    if (map.quad_split) alpha_p[1] = __shfl_xor_sync(0xffffffffu, alpha_s[0], 2);
  }
}

// The P.V slots' rescale and page factors from the softmax slots'. The same heads
// (pv_slot_alphas) unless two query terms share a tile; then the head of a P.V slot is the
// softmax slot of a lane of this quad (head lane % 4): its factors come by shuffles, not a
// second tile maximum; padding heads (>= G) take head G - 1's (finite, multiply zeros).
template <class K>
__device__ __forceinline__ void pv_slot_factors(const float (&alpha_s)[K::NSL], const float (&fac_s)[K::NSL],
                                                float vfac, const SlotMap<K>& map, float (&alpha_p)[K::NSLP],
                                                float (&fac_p)[K::NSLP]) {
  if constexpr (!K::kTermsShareTile) {
    pv_slot_alphas<K>(alpha_s, map, alpha_p);
#pragma unroll
    for (int sp = 0; sp < K::NSLP; ++sp) fac_p[sp] = fac_s[sp];
  } else {
#pragma unroll
    for (int sp = 0; sp < K::NSLP; ++sp) {
      const int h = min(map.pv_head(sp), map.G - 1), src = (map.lane & ~3) | (h % 4);
      alpha_p[sp] = 1.0f;
      fac_p[sp] = vfac;
#pragma unroll
      for (int sl = 0; sl < K::NSL; ++sl) {
        const float al = __shfl_sync(0xffffffffu, alpha_s[sl], src), fa = __shfl_sync(0xffffffffu, fac_s[sl], src);
        if (sl == h / 4) {
          alpha_p[sp] = al;
          fac_p[sp] = fa;
        }
      }
    }
  }
}

// The softmax of one page, after the barrier that publishes red_max[buf]: per slot the new
// running max from the tile maximum, p = 2^(s - m) quantized as the recipe says into P^T
// (psb [head][key], the warp's 16 keys), the running sum (of the unquantized p), and the
// P.V slots' rescale alpha_p and page factor fac_p (vfac, times MXFP4 P's tile exponent).
template <class K>
__device__ __forceinline__ void softmax_page(int buf, const float (&sv)[K::NSL][2], const float (&wm)[K::NSL], float vfac,
                                             uint16_t* psb, int warp, const SlotMap<K>& map, const ProbRule& rule,
                                             const float* red_max, SoftmaxState<K>& st, float (&alpha_p)[K::NSLP],
                                             float (&fac_p)[K::NSLP]) {
  using F = typename K::Fmt;
  const int lane = map.lane;
  float alpha_s[K::NSL], fac_s[K::NSL];
  float sx[K::NSL][2], wx[K::NSL];  // the slots' logits and warp maxima (own_head's)
#pragma unroll
  for (int sl = 0; sl < K::NSL; ++sl) {
    sx[sl][0] = sv[sl][0], sx[sl][1] = sv[sl][1], wx[sl] = wm[sl];
  }
  if constexpr (K::kQuadSplitType) {
    if (map.quad_split) {  // lanes q + 2 take lane q's slot 1 (head 2q + 1)
      const float s0 = __shfl_xor_sync(0xffffffffu, sv[1][0], 2), s1 = __shfl_xor_sync(0xffffffffu, sv[1][1], 2);
      const float w1 = __shfl_xor_sync(0xffffffffu, wm[1], 2);
      if (lane & 2) sx[0][0] = s0, sx[0][1] = s1, wx[0] = w1;
    }
  }
#pragma unroll
  for (int sl = 0; sl < K::NSL; ++sl) {
    const int h = map.own_head(sl);
    alpha_s[sl] = 1.0f;
    fac_s[sl] = vfac;
    if (h >= map.G) continue;
    const float mt = tile_max(red_max, buf, h);
    float alpha;
    const float mz = raise_running_max(st.m[sl], mt, alpha);
    float lsum = 0.0f;  // the first p replaces it (0 + p is p: no add to spend)
    int etile = 0;
    int pexp = 0;  // MXFP4 P: the block exponent (a block is the warp pair's 32 keys)
    alpha_s[sl] = alpha;
    if constexpr (K::kMxProb) {
      etile = mxfp4_ocp_exponent(fast_exp2(__fadd_rn(__fsub_rn(mt, mz), rule.log2c())));
      pexp = mxfp4_ocp_exponent(fast_exp2(__fadd_rn(__fsub_rn(pair_max(red_max, buf, h, warp), mz), rule.log2c())));
      fac_s[sl] = __fmul_rn(vfac, pow2f(max(etile - kFp16CodeShift, kMinFloatExponent)));
    }
    float psc = 0.0f;  // NVFP4 P: the block scale value (the warp's 16 keys are one block)
    if constexpr (!F::kE8M0Scales && K::kPFp4)
      psc = nvfp4_prob_scale_value(fast_exp2(__fadd_rn(__fsub_rn(wx[sl], mz), rule.log2c())), rule.underflow(), rule.tau());
#pragma unroll
    for (int rr = 0; rr < 2; ++rr) {
      // log2 c is 0 unless P is FP4: mixed mode skips the add.
      const float p = fast_exp2(K::kPFp4 ? __fadd_rn(__fsub_rn(sx[sl][rr], mz), rule.log2c()) : __fsub_rn(sx[sl][rr], mz));
      lsum = rr == 0 ? p : lsum + p;
      uint32_t bits;
      if constexpr (!K::kPFp4) {
        bits = F::kBf16Mma ? bf16_bits(p) : half_bits(p);
      } else if constexpr (K::kMxProb) {  // e2m1_round_value: the value of mxfp4_prob_code
        const float v = e2m1_round_value(__fmul_rn(p, pow2f(-pexp)));
        bits = half_bits(__fmul_rn(v, pow2f(max(pexp - etile + kFp16CodeShift, kMinFloatExponent))));
      } else {
        bits = half_bits(nvfp4_prob_value(p, psc));
      }
      const int key = 16 * warp + c_frag_row(lane, 2 * rr);
      psb[h * kPsStride + key] = uint16_t(bits);
    }
    st.l[sl] = __fadd_rn(__fmul_rn(st.l[sl], alpha), lsum);
  }
  pv_slot_factors<K>(alpha_s, fac_s, vfac, map, alpha_p, fac_p);
}

// The softmax of a page pair (mixed mode, one query term), after the barrier that publishes
// the pair's red_max[0]: per slot one new running max from the pair's tile maximum, p =
// 2^(s - m) as FP16 into P^T buffer 0 (page a, sa) and 1 (page b, sb; keys of a missing
// page b come as -inf, p = 0), the running sum, and the P.V slots' rescale alpha_p. The
// tile differs from softmax_page's only in how many keys share a maximum: the sums are the
// same online softmax, the FP16 p round against the pair's maximum.
template <class K>
__device__ __forceinline__ void softmax_pair(const float (&sa)[K::NSL][2], const float (&sb)[K::NSL][2],
                                             uint16_t* ps, int warp, const SlotMap<K>& map, const float* red_max,
                                             SoftmaxState<K>& st, float (&alpha_p)[K::NSLP]) {
  static_assert(!K::kPFp4 && K::T == 1, "page pairs are a mixed-mode tile of one query term");
  constexpr int kPsEntries = 16 * kPsStride;  // 16-bit entries of one P^T buffer
  const int lane = map.lane;
  float alpha_s[K::NSL];
  float sx[2][K::NSL][2];  // the slots' logits (own_head's), pages a and b
#pragma unroll
  for (int sl = 0; sl < K::NSL; ++sl)
#pragma unroll
    for (int rr = 0; rr < 2; ++rr) sx[0][sl][rr] = sa[sl][rr], sx[1][sl][rr] = sb[sl][rr];
  if constexpr (K::kQuadSplitType) {
    if (map.quad_split) {  // lanes q + 2 take lane q's slot 1 (head 2q + 1)
#pragma unroll
      for (int pg = 0; pg < 2; ++pg) {
        const float s0 = __shfl_xor_sync(0xffffffffu, sx[pg][1][0], 2), s1 = __shfl_xor_sync(0xffffffffu, sx[pg][1][1], 2);
        if (lane & 2) sx[pg][0][0] = s0, sx[pg][0][1] = s1;
      }
    }
  }
#pragma unroll
  for (int sl = 0; sl < K::NSL; ++sl) {
    const int h = map.own_head(sl);
    alpha_s[sl] = 1.0f;
    if (h >= map.G) continue;
    const float mz = raise_running_max(st.m[sl], tile_max(red_max, 0, h), alpha_s[sl]);
    const float alpha = alpha_s[sl];
    float lsum = 0.0f;  // the first p replaces it (0 + p is p: no add to spend)
#pragma unroll
    for (int pg = 0; pg < 2; ++pg)
#pragma unroll
      for (int rr = 0; rr < 2; ++rr) {
        const float p = fast_exp2(__fsub_rn(sx[pg][sl][rr], mz));
        lsum = pg == 0 && rr == 0 ? p : lsum + p;
        const int key = 16 * warp + c_frag_row(lane, 2 * rr);
        ps[pg * kPsEntries + h * kPsStride + key] = uint16_t(half_bits(p));  // bulk pages: FP16 MMAs
      }
    st.l[sl] = __fadd_rn(__fmul_rn(st.l[sl], alpha), lsum);
  }
  pv_slot_alphas<K>(alpha_s, map, alpha_p);  // the page factors: accumulate_pair
}

// The channel group (16 channels) of a warp's ci-th O accumulator: bulk formats spread the
// groups over the warps (warp w owns w % (CG / CGW) + (CG / CGW) ci; the warp's partial-O
// slice is w / (CG / CGW)); in BF16 kernels every warp holds every group.
template <class K>
__device__ __forceinline__ int o_channel_group(int warp, int ci) {
  constexpr int kStride = K::Plan::CG / K::CGW;
  return K::Plan::kBulk ? warp % kStride + kStride * ci : ci;
}
template <class K>
__device__ __forceinline__ int o_slice(int warp) {
  return K::Plan::kBulk ? warp / (K::Plan::CG / K::CGW) : warp;
}

// The O^T accumulators of a thread: channel group (16 channels) x n-tile (8 heads).
template <class K>
struct OAccum {
  float o[K::CGW][K::NTP][4];
};

// Whether any lane's running maximum moved (an alpha != 1): the warp then rescales O.
template <class K>
__device__ __forceinline__ bool alpha_moved(const float (&alpha_p)[K::NSLP]) {
  bool moved = false;
#pragma unroll
  for (int sp = 0; sp < K::NSLP; ++sp) moved |= alpha_p[sp] != 1.0f;
  return __any_sync(0xffffffffu, moved);
}

// o = alpha o + fac tmp, per P.V slot (head column); the rescale only when an alpha moved.
template <class K>
__device__ __forceinline__ void accumulate(OAccum<K>& acc, const float (&tmp)[K::CGW][K::NTP][4],
                                           const float (&alpha_p)[K::NSLP], const float (&fac_p)[K::NSLP]) {
  if (alpha_moved<K>(alpha_p)) {
#pragma unroll
    for (int i = 0; i < K::CGW; ++i)
#pragma unroll
      for (int j = 0; j < K::NTP; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e)
          acc.o[i][j][e] = fmaf(acc.o[i][j][e], alpha_p[2 * j + e % 2], tmp[i][j][e] * fac_p[2 * j + e % 2]);
  } else {
#pragma unroll
    for (int i = 0; i < K::CGW; ++i)
#pragma unroll
      for (int j = 0; j < K::NTP; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc.o[i][j][e] = fmaf(tmp[i][j][e], fac_p[2 * j + e % 2], acc.o[i][j][e]);
  }
}

// o = alpha o + fa ta + fb tb: a page pair's P.V partials (tb only when the pair has its
// second page) with their pages' factors; alpha per P.V slot (the head column 2 j + e % 2
// of element [i][j][e]), the rescale only when an alpha moved.
template <class K>
__device__ __forceinline__ void accumulate_pair(OAccum<K>& acc, const float (&ta)[K::CGW][K::NTP][4],
                                                const float (&tb)[K::CGW][K::NTP][4], bool two,
                                                const float (&alpha_p)[K::NSLP], float fa, float fb) {
  constexpr int kElems = K::CGW * K::NTP * 4;
  float* o = &acc.o[0][0][0];
  const float* a = &ta[0][0][0];
  const float* b = &tb[0][0][0];
  if (alpha_moved<K>(alpha_p)) {
#pragma unroll
    for (int x = 0; x < kElems; ++x) o[x] *= alpha_p[2 * (x / 4 % K::NTP) + x % 2];
  }
#pragma unroll
  for (int x = 0; x < kElems; ++x) o[x] = fmaf(a[x], fa, o[x]);
  if (two) {
#pragma unroll
    for (int x = 0; x < kElems; ++x) o[x] = fmaf(b[x], fb, o[x]);
  }
}

}  // namespace fp4kv::attention::detail
