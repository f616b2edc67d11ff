// The page loops of a split CTA: its pages stream into shared-memory stages, and per page
// S^T = K Q^T (key_product), the softmax (softmax_state.cuh) and O^T += V^T P^T.
//
// Bulk formats (FP4, FP8): one bulk (TMA) copy per page, completed on a per-stage mbarrier
// that every thread waits on before use (the stored part-major code order, layout.h, makes
// the warp's 16-byte loads conflict-free without re-ordering). P.V runs one page behind S,
// by channel owners: warp w owns channel group(s) of O (16 channels; d = 64: two warps per
// group, half the keys each) over all keys of the page, B = P^T of the whole page from
// shared memory; so the page's one barrier publishes both the tile maxima of page i and P
// of page i - 1, and every warp keeps only its channels of O. NS - 2 pages stay in flight.
// Mixed mode (16-bit P, K::kPagePairs) takes the pages in pairs instead: one softmax tile of
// two pages, P.V of the pair after a second barrier (bulk_pair_loop).
// BF16: cp.async stages (zero fill, row swizzle) with the one barrier per page also
// publishing the next page; every warp multiplies its own 16 keys into all channels of O
// (8 partials, summed at the end), as its stages are too large for the lag.
#pragma once

#include "fp4kv/attention/device_common.cuh"
#include "fp4kv/attention/fragment.h"
#include "fp4kv/attention/page_traits.cuh"
#include "fp4kv/attention/smem_plan.cuh"
#include "fp4kv/attention/softmax_state.cuh"

namespace fp4kv::attention::detail {

// The CTA's shared memory, carved by the instance's plan.
struct CtaSmem {
  uint8_t* base;       // the region: page stages, later the O partials
  uint16_t* qfrag;     // Q^T in fragment order
  uint16_t* ps;        // P^T [1 or 2 buffers][16][kPsStride]
  float* qf;           // FP32 queries [G][D] (prologue only)
  float* gfac;         // [2][kMaxG] query term factors
  float* red_max;      // [2 buffers][kMaxG][kWarps]
  float* red_sum;      // [kMaxG][kWarps]
  float* red_m;        // [kMaxG]
  int* ebuf;           // [kMaxG * 16]
  uint32_t bar0;       // [NS] mbarriers (bulk pages)
};

template <class Plan>
__device__ __forceinline__ CtaSmem carve_smem(uint8_t* smem) {
  CtaSmem s;
  s.base = smem;
  s.qfrag = reinterpret_cast<uint16_t*>(smem + Plan::QFRAG_OFF);
  s.ps = reinterpret_cast<uint16_t*>(smem + Plan::PS_OFF);
  s.qf = reinterpret_cast<float*>(smem + Plan::QF_OFF);
  s.gfac = reinterpret_cast<float*>(smem + Plan::SC_OFF);
  s.red_max = s.gfac + 2 * kMaxG;
  s.red_sum = s.red_max + 2 * kMaxG * kWarps;
  s.red_m = s.red_sum + kMaxG * kWarps;
  s.ebuf = reinterpret_cast<int*>(s.red_m + kMaxG);
  s.bar0 = smem_u32(smem + Plan::MBAR_OFF);
  return s;
}

// The pages of this CTA's split of one (row, KV head). The pool's address fields are read
// from the kernel arguments where a block address is formed.
struct PageSource {
  const KernelArgs& a;
  int kvh;
  const int32_t* btab;  // the row's block table
  int pages;            // pages the row attends
  int last_page_tokens, masked_prefix;
  int p_begin, npg;     // the split: pages p_begin .. p_begin + npg - 1

  __device__ __forceinline__ const uint8_t* block(int blk) const {
    return a.pool + size_t(blk) * size_t(a.block_stride) + size_t(kvh) * size_t(a.head_bytes);
  }
  __device__ __forceinline__ int valid_tokens(int pg) const { return pg == pages - 1 ? last_page_tokens : kPageTokens; }
  // Keys of page pg the softmax sees: [first, end).
  __device__ __forceinline__ int first_key(int pg) const { return pg == 0 ? masked_prefix : 0; }
};

// The query B fragments (k-step ks, n-tile nt): in registers when few, else re-read from
// shared memory (32 registers at d = 128 with two n-tiles measured no faster and spilled
// MXFP4).
template <class K>
struct QueryOperand {
  static constexpr bool kInRegs = K::Plan::kQReg;
  uint32_t reg[kInRegs ? K::KS : 1][K::NT][2];
  const uint32_t* frag;
  int lane;

  __device__ __forceinline__ void load(const uint16_t* qfrag, int lane_) {
    frag = reinterpret_cast<const uint32_t*>(qfrag);
    lane = lane_;
    if constexpr (kInRegs) {
#pragma unroll
      for (int ks = 0; ks < K::KS; ++ks)
#pragma unroll
        for (int nt = 0; nt < K::NT; ++nt) {
          const uint2 v = reinterpret_cast<const uint2*>(frag)[(ks * K::NT + nt) * 32 + lane];
          reg[ks][nt][0] = v.x;
          reg[ks][nt][1] = v.y;
        }
    }
  }
  __device__ __forceinline__ uint32_t b(int ks, int nt, int r) const {
    if constexpr (kInRegs) return reg[kInRegs ? ks : 0][nt][r];
    else return frag[((ks * K::NT + nt) * 32 + lane) * 2 + r];
  }
};

// S^T of key group `warp` (keys 16 warp .. + 15) of the page in stage `st`, into the
// accumulator chains (K::kSChains; the logits add them).
template <class K>
__device__ __forceinline__ void key_product(const uint8_t* st, int warp, int lane, const QueryOperand<K>& q,
                                            float (&acc2)[K::kSChains][K::NT][4]) {
  using F = typename K::Fmt;
  using P = typename K::Plan;
  constexpr auto L = P::L;
  zero(acc2);
  if constexpr (!F::kBulk) {
    F::template key_product<K::kD, K::kSChains, K::NT>(st + L.k_codes, warp, lane, q, acc2);
  } else {
    constexpr int NBK = F::kFp4 ? K::kD / F::kBlock : 1;  // scale blocks per key row
    typename F::template KeyScales<NBK> scales;
    F::load_key_scales(reinterpret_cast<const uint16_t*>(st + L.k_scales + scale_row_offset(warp, lane, NBK)), scales);
    float bacc[K::NT][4];  // MXFP4: the current block's product
#pragma unroll
    for (int part = 0; part < P::KCPL; ++part) {
      const uint4 kw = *reinterpret_cast<const uint4*>(st + L.k_codes + code_part_offset(warp, part, lane, P::KCPL));
      const uint32_t wv[4] = {kw.x, kw.y, kw.z, kw.w};
#pragma unroll
      for (int sub = 0; sub < F::kKStepsPerPart; ++sub)
        F::key_kstep(acc2, bacc, scales, wv, sub, part * F::kKStepsPerPart + sub, q);
    }
  }
}

// The warp's P.V work of a bulk page: channel group of its ci-th group, first k-step ks0.
template <class K>
struct ValueOwner {
  int warp, lane, ks0;
  uint32_t p_addr;  // this lane's ldmatrix row in P^T buffer 0
};

// The P.V role of a warp in a bulk page loop: its channel groups (o_channel_group), its
// slice's first k-step, and its lane's ldmatrix row in P^T buffer 0 [head][key]: matrix
// q = lane / 8 holds heads 0..7 x keys 16 (ks0 + q / 2) + 8 (q % 2) .. + 7, i.e. b0, b1
// of two k-steps.
template <class K>
__device__ __forceinline__ ValueOwner<K> make_value_owner(const CtaSmem& sm, int warp, int lane, int slice) {
  using P = typename K::Plan;
  ValueOwner<K> vo;
  vo.warp = warp;
  vo.lane = lane;
  vo.ks0 = P::KP == 1 ? 0 : slice * P::KSP;
  vo.p_addr = smem_u32(sm.ps) + ((lane % 8) * kPsStride + (vo.ks0 + lane / 16) * 16 + ((lane / 8) % 2) * 8) * 2;
  return vo;
}

// V^T P^T of the page in stage `st` with P^T from buffer `pbuf`: the warp's channel groups
// over its KSP k-steps, two accumulator chains, summed into tmp.
template <class K>
__device__ __forceinline__ void value_tiles(const uint8_t* st, int pbuf, const ValueOwner<K>& vo,
                                            float (&tmp)[K::CGW][K::NTP][4]) {
  using F = typename K::Fmt;
  using P = typename K::Plan;
  constexpr auto L = P::L;
  constexpr int CGW = K::CGW, NTP = K::NTP, KSP = P::KSP;
  constexpr int PSW = 16 * kPsStride / 2;                      // 32-bit words of one P buffer
  constexpr int NBV = F::kFp4 ? kPageTokens / F::kBlock : 1;  // V scale blocks per channel row
  const int lane = vo.lane, ks0 = vo.ks0;
  float tmp2[2][CGW][NTP][4];
  zero(tmp2);
#pragma unroll
  for (int ci = 0; ci < CGW; ++ci) {
    const int cg = o_channel_group<K>(vo.warp, ci);
    constexpr int KPP = F::kKStepsPerPart;
    uint32_t vw[KSP * (F::kFp4 ? 1 : 2)];
#pragma unroll
    for (int q = 0; q < KSP / KPP; ++q) {
      const uint4 w = *reinterpret_cast<const uint4*>(st + L.v_codes + code_part_offset(cg, ks0 / KPP + q, lane, P::VCPL));
      vw[4 * q] = w.x;
      vw[4 * q + 1] = w.y;
      vw[4 * q + 2] = w.z;
      vw[4 * q + 3] = w.w;
    }
    // 16-bit scale pairs (rows r, r + 8) of the warp's key blocks, two to a word.
    constexpr int NPAIR = F::value_scale_pairs(KSP);
    uint32_t vsw[F::kFp4 ? NPAIR / 2 : 1];
    if constexpr (F::kFp4)
      load_scale_words<NPAIR>(
          reinterpret_cast<const uint16_t*>(st + L.v_scales + scale_row_offset(cg, lane, NBV) + 2 * F::value_scale_pairs(ks0)),
          vsw);
    float bacc[NTP][4];   // MXFP4: the current block's product
    uint32_t pb[NTP][4];  // P^T B fragments of k-steps kk, kk + 1 (n-tile j): one ldmatrix.x4
#pragma unroll
    for (int kk = 0; kk < KSP; ++kk) {
      if (kk % 2 == 0) {
#pragma unroll
        for (int j = 0; j < NTP; ++j) ldmatrix_x4(pb[j], vo.p_addr + pbuf * PSW * 4 + (j * 8 * kPsStride + kk * 16) * 2);
      }
      F::value_kstep(tmp2, bacc, ci, vw, vsw, kk, pb);
    }
  }
#pragma unroll
  for (int i = 0; i < CGW; ++i)
#pragma unroll
    for (int j = 0; j < NTP; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) tmp[i][j][e] = tmp2[0][i][j][e] + tmp2[1][i][j][e];
}

// O^T += V^T P^T of the page in stage `st` (P^T in buffer `pbuf`) with the online-softmax
// update.
template <class K>
__device__ __forceinline__ void value_product(const uint8_t* st, int pbuf, const ValueOwner<K>& vo,
                                              const float (&alpha_p)[K::NSLP], const float (&fac_p)[K::NSLP],
                                              OAccum<K>& acc) {
  float tmp[K::CGW][K::NTP][4];
  value_tiles<K>(st, pbuf, vo, tmp);
  accumulate<K>(acc, tmp, alpha_p, fac_p);
}

// Starts the page stream before the query prologue: bulk formats initialize the stages'
// mbarriers and copy pages 0 .. NS - 1 (the prologue's barriers publish the mbarriers);
// BF16 copies pages 0 .. NS - 2.
template <class K>
__device__ __forceinline__ void start_page_stream(const CtaSmem& sm, const PageSource& src, int tid) {
  using F = typename K::Fmt;
  using P = typename K::Plan;
  constexpr int NS = P::NS;
  if constexpr (F::kBulk) {
    if (tid == 0) {
#pragma unroll
      for (int s = 0; s < NS; ++s) mbar_init(sm.bar0 + 8 * s, 1);
      mbar_init_fence();
      int first_blocks[NS];  // all table reads first: one latency
#pragma unroll
      for (int s = 0; s < NS; ++s) first_blocks[s] = s < src.npg ? __ldg(src.btab + src.p_begin + s) : 0;
#pragma unroll
      for (int s = 0; s < NS; ++s)
        if (s < src.npg)
          bulk_copy_to_shared(smem_u32(sm.base + s * P::STAGE), src.block(first_blocks[s]), P::STAGE, sm.bar0 + 8 * s);
    }
  } else if constexpr (NS > 1) {
    int first_blocks[NS - 1];
#pragma unroll
    for (int s = 0; s < NS - 1; ++s) first_blocks[s] = s < src.npg ? __ldg(src.btab + src.p_begin + s) : 0;
#pragma unroll
    for (int s = 0; s < NS - 1; ++s) {
      if (s < src.npg)
        F::template load_page<K::kD>(sm.base + s * P::STAGE, src.block(first_blocks[s]), src.valid_tokens(src.p_begin + s),
                                     tid);
      cp_async_commit();
    }
  }
}

// What a page loop needs besides its state: the recipe's scalars (kernel arguments), the
// CTA's buffers, pages, query operand and slots.
template <class K>
struct PageLoopInputs {
  const KernelArgs& a;
  const CtaSmem& sm;
  const PageSource& src;
  const QueryOperand<K>& q;
  const SlotMap<K>& map;

  __device__ __forceinline__ ProbRule prob_rule() const { return ProbRule{a}; }
};

// The stages of pages it, it - 1 and it - 2 in a ring of NS stages, and the parity of page
// it's pass over its stage's mbarrier, (it / NS) & 1: counters advanced once per page
// instead of three divisions by NS per page.
template <int NS>
struct StageRing {
  static_assert(NS >= 3, "bulk page streams keep NS - 2 pages in flight");
  int cur = 0, prev = NS - 1, prev2 = NS - 2;
  uint32_t parity = 0;
  __device__ __forceinline__ void advance() {
    prev2 = prev;
    prev = cur;
    cur = cur + 1 == NS ? 0 : cur + 1;
    if (cur == 0) parity ^= 1u;
  }
};

// Bulk pages (FP4, FP8). Iteration it: wait for page it (mbarrier), S of page it, one
// barrier (publishes the tile maxima of page it and P of page it - 1, and frees the stage
// of page it - 2, which the next bulk copy refills with page it + NS - 2), then P.V of page
// it - 1 by channel owners and the softmax of page it.
template <class K>
__device__ __forceinline__ void bulk_page_loop(const PageLoopInputs<K>& in, int tid, int warp, int lane, int slice,
                                               SoftmaxState<K>& st, OAccum<K>& acc) {
  using F = typename K::Fmt;
  using P = typename K::Plan;
  constexpr auto L = P::L;
  constexpr int NS = P::NS, NSL = K::NSL, NSLP = K::NSLP;
  constexpr int PSW = 16 * kPsStride / 2;  // 32-bit words of one P buffer
  const CtaSmem& sm = in.sm;
  const PageSource& src = in.src;
  const ValueOwner<K> vo = make_value_owner<K>(sm, warp, lane, slice);
  int blk_next = (tid == 0 && NS < src.npg) ? __ldg(src.btab + src.p_begin + NS) : 0;
  float alpha_prev[NSLP], fac_prev[NSLP];
  StageRing<NS> ring;

  for (int it = 0; it < src.npg; ++it, ring.advance()) {
    mbar_wait(sm.bar0 + 8 * ring.cur, ring.parity);
    const uint8_t* stage = sm.base + ring.cur * P::STAGE;
    const int pg = src.p_begin + it;
    const int first = src.first_key(pg), end = src.valid_tokens(pg);
    const int buf = it & 1;
    // Page factors of S and of the P.V partial (page_traits.cuh).
    float kfac, vfac;
    F::page_factors(stage, L.page_scales, kfac, vfac);
    float sv[NSL][2], wm[NSL];
    float acc2[K::kSChains][K::NT][4];
    key_product<K>(stage, warp, lane, in.q, acc2);
    page_logits<K>(acc2, kfac, in.a.gamma, first, end, buf, warp, in.map, st, sm.red_max, sv, wm);
    __syncthreads();
    if (tid == 0 && it >= 2 && it + NS - 2 < src.npg) {  // refill the stage of page it - 2
      const int ns = ring.prev2;
      bulk_copy_to_shared(smem_u32(sm.base + ns * P::STAGE), src.block(blk_next), P::STAGE, sm.bar0 + 8 * ns);
      if (it + NS - 1 < src.npg) blk_next = __ldg(src.btab + src.p_begin + it + NS - 1);
    }
    if (it > 0) value_product<K>(sm.base + ring.prev * P::STAGE, buf ^ 1, vo, alpha_prev, fac_prev, acc);
    softmax_page<K>(buf, sv, wm, vfac, sm.ps + buf * (PSW * 2), warp, in.map, in.prob_rule(), sm.red_max, st, alpha_prev,
                    fac_prev);
  }
  __syncthreads();  // P of the last page visible
  value_product<K>(sm.base + ring.prev * P::STAGE, (src.npg - 1) & 1, vo, alpha_prev, fac_prev, acc);  // page npg - 1
}

// Stage and mbarrier parity of a page in a ring of NS stages (page p: stage p % NS, parity
// (p / NS) & 1), stepped a page at a time.
template <int NS>
struct StagePos {
  int stage = 0;
  uint32_t parity = 0;
  __device__ __forceinline__ StagePos next() const {
    StagePos n = *this;
    if (++n.stage == NS) n.stage = 0, n.parity ^= 1u;
    return n;
  }
};

// Block ids of the split's pages first, first + 1 (those that exist), from the row's table.
__device__ __forceinline__ void read_block_ids(const PageSource& src, int first, int (&blk)[2]) {
#pragma unroll
  for (int i = 0; i < 2; ++i)
    if (first + i < src.npg) blk[i] = __ldg(src.btab + src.p_begin + first + i);
}

// The logits of page pg of the split (its stage at `pos`, once its copy has landed) and its
// V page factor: S^T of the warp's 16 keys, scaled and masked (page_logits, nothing
// published).
template <class K>
__device__ __forceinline__ void page_scores(const PageLoopInputs<K>& in, StagePos<K::Plan::NS> pos, int pg, int warp,
                                            int lane, const SoftmaxState<K>& st, float (&sv)[K::NSL][2], float& vfac) {
  using P = typename K::Plan;
  mbar_wait(in.sm.bar0 + 8 * pos.stage, pos.parity);
  const uint8_t* stage = in.sm.base + pos.stage * P::STAGE;
  float kfac, unused[K::NSL];
  K::Fmt::page_factors(stage, P::L.page_scales, kfac, vfac);
  float acc2[K::kSChains][K::NT][4];
  key_product<K>(stage, warp, lane, in.q, acc2);
  page_logits<K, false>(acc2, kfac, in.a.gamma, in.src.first_key(pg), in.src.valid_tokens(pg), 0, warp, in.map, st,
                        in.sm.red_max, sv, unused);
}

// Bulk pages in pairs (K::kPagePairs: mixed mode). Pair j = pages a = 2j, b = 2j + 1 (b
// absent at the end of an odd split): S of both, the pair's warp maxima, barrier 1 (tile
// maxima published; every warp is past pair j - 1's P.V, so its two stages are refilled
// with the pages NS ahead of them), the pair's softmax into P^T buffers 0 and 1, barrier 2
// (P visible), O^T += V^T P^T of both pages by the channel owners. Two barriers a pair is
// the single-page loop's one a page; what halves is the per-tile work: one tile maximum,
// one rescale, one published maximum per slot for 32 keys a warp. red_max needs one buffer:
// its reads (between the barriers) end before the next pair's writes (after barrier 2).
template <class K>
__device__ __forceinline__ void bulk_pair_loop(const PageLoopInputs<K>& in, int tid, int warp, int lane, int slice,
                                               SoftmaxState<K>& st, OAccum<K>& acc) {
  using P = typename K::Plan;
  constexpr int NS = P::NS, NSL = K::NSL, NSLP = K::NSLP, CGW = K::CGW, NTP = K::NTP;
  static_assert(NS >= 4, "a page pair in use and the next pair's copies in flight: four stages at least");
  const CtaSmem& sm = in.sm;
  const PageSource& src = in.src;
  const ValueOwner<K> vo = make_value_owner<K>(sm, warp, lane, slice);
  // start_page_stream copied pages 0 .. NS - 1; page fill_pg goes to stage fill_stage.
  int fill_pg = NS, fill_stage = 0;
  int blk_next[2] = {0, 0};  // block ids of pages fill_pg, fill_pg + 1 (thread 0)
  if (tid == 0) read_block_ids(src, fill_pg, blk_next);
  StagePos<NS> pos_a;
  for (int j = 0, pa = 0; pa < src.npg; ++j, pa += 2) {
    const bool two = pa + 1 < src.npg;
    const StagePos<NS> pos_b = pos_a.next();
    float sa[NSL][2], sb[NSL][2], wm[NSL], fa, fb = 0.0f;
    page_scores<K>(in, pos_a, src.p_begin + pa, warp, lane, st, sa, fa);
    if (two) {
      page_scores<K>(in, pos_b, src.p_begin + pa + 1, warp, lane, st, sb, fb);
    } else {
#pragma unroll
      for (int sl = 0; sl < NSL; ++sl) sb[sl][0] = sb[sl][1] = neg_inf();
    }
    publish_pair_max<K>(sa, sb, warp, in.map, sm.red_max, wm);
    __syncthreads();
    if (tid == 0 && j > 0) {
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        if (fill_pg < src.npg)
          bulk_copy_to_shared(smem_u32(sm.base + fill_stage * P::STAGE), src.block(blk_next[i]), P::STAGE,
                              sm.bar0 + 8 * fill_stage);
        ++fill_pg;
        fill_stage = fill_stage + 1 == NS ? 0 : fill_stage + 1;
      }
      read_block_ids(src, fill_pg, blk_next);
    }
    float alpha_p[NSLP];
    softmax_pair<K>(sa, sb, sm.ps, warp, in.map, sm.red_max, st, alpha_p);
    __syncthreads();
    float ta[CGW][NTP][4], tb[CGW][NTP][4];
    value_tiles<K>(sm.base + pos_a.stage * P::STAGE, 0, vo, ta);
    if (two) value_tiles<K>(sm.base + pos_b.stage * P::STAGE, 1, vo, tb);
    accumulate_pair<K>(acc, ta, tb, two, alpha_p, fa, fb);
    pos_a = pos_b.next();
  }
}

// BF16 pages: cp.async stages; every warp does P.V of its own 16 keys into all channels.
template <class K>
__device__ __forceinline__ void bf16_page_loop(const PageLoopInputs<K>& in, int tid, int warp, int lane,
                                               SoftmaxState<K>& st, OAccum<K>& acc) {
  using F = typename K::Fmt;
  using P = typename K::Plan;
  constexpr auto L = P::L;
  constexpr int NS = P::NS, NSL = K::NSL, NSLP = K::NSLP, NTP = K::NTP, CGW = K::CGW, D = K::kD;
  const CtaSmem& sm = in.sm;
  const PageSource& src = in.src;
  const int npg = src.npg;
  auto stage = [&sm](int s) { return sm.base + s * P::STAGE; };
  if constexpr (NS >= 3) {
    cp_async_wait<NS - 2>();  // page 0 (this thread's copies)
    __syncthreads();          // page 0 visible
  }
  // Block id of the next page to load, fetched one iteration ahead so that the table read's
  // latency is not paid after the barrier.
  constexpr int kAhead = NS >= 3 ? NS - 1 : NS == 2 ? 1 : 0;
  int blk_next = kAhead < npg ? __ldg(src.btab + src.p_begin + kAhead) : 0;
  const uint32_t* ps32 = reinterpret_cast<const uint32_t*>(sm.ps);
  for (int it = 0; it < npg; ++it) {
    if constexpr (NS == 1) {
      if (it > 0) __syncthreads();  // everyone is done with page it - 1
      F::template load_page<D>(stage(0), src.block(blk_next), src.valid_tokens(src.p_begin + it), tid);
      cp_async_commit();
      if (it + 1 < npg) blk_next = __ldg(src.btab + src.p_begin + it + 1);
      cp_async_wait<0>();
      __syncthreads();
    } else if constexpr (NS == 2) {
      cp_async_wait<0>();
      __syncthreads();  // page it visible; everyone is done with page it - 1
      if (it + 1 < npg)
        F::template load_page<D>(stage((it + 1) % 2), src.block(blk_next), src.valid_tokens(src.p_begin + it + 1), tid);
      cp_async_commit();
      if (it + 2 < npg) blk_next = __ldg(src.btab + src.p_begin + it + 2);
    }
    const uint8_t* st_page = stage(NS == 1 ? 0 : it % NS);
    const int pg = src.p_begin + it;
    const int first = src.first_key(pg), end = src.valid_tokens(pg);
    const int buf = it & 1;
    float sv[NSL][2], wm[NSL];
    float acc2[K::kSChains][K::NT][4];
    key_product<K>(st_page, warp, lane, in.q, acc2);
    page_logits<K>(acc2, 1.0f, in.a.gamma, first, end, buf, warp, in.map, st, sm.red_max, sv, wm);
    if constexpr (NS >= 3) cp_async_wait<NS - 3>();  // page it + 1 (this thread's copies)
    __syncthreads();  // maxima of page it; page it + 1 visible; everyone is done with page it - 1
    if constexpr (NS >= 3) {
      const int nx = it + NS - 1;
      if (nx < npg) F::template load_page<D>(stage(nx % NS), src.block(blk_next), src.valid_tokens(src.p_begin + nx), tid);
      cp_async_commit();
      if (nx + 1 < npg) blk_next = __ldg(src.btab + src.p_begin + nx + 1);
    }
    float alpha_p[NSLP], fac_p[NSLP];
    softmax_page<K>(buf, sv, wm, 1.0f, sm.ps, warp, in.map, in.prob_rule(), sm.red_max, st, alpha_p, fac_p);
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
#pragma unroll
    for (int i = 0; i < CGW; ++i) {
      const int q4 = lane / 8;
      const int row = warp * 16 + (q4 / 2) * 8 + lane % 8, ch = i * 2 + q4 % 2;
      uint32_t af[4];
      ldmatrix_x4_trans(af, smem_u32(st_page + L.v_codes + F::template chunk_offset<D>(row, ch)));
#pragma unroll
      for (int j = 0; j < NTP; ++j) mma_bf16(tmp[i][j], af, pb[j][0], pb[j][1]);
    }
    accumulate<K>(acc, tmp, alpha_p, fac_p);
  }
}

}  // namespace fp4kv::attention::detail
