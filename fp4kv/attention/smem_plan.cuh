// The shared-memory plan and tile geometry of one decode kernel instance (page traits F,
// head_dim D, T query terms per head, NT column tiles): which warp owns which keys and
// channels, how many page stages fit, and where each buffer lives. Everything is a
// compile-time constant; smem_bytes(G) is the launch's dynamic shared memory.
//
// Layout: [region: page stages | BF16 sink/recent rows | final O merge][extras], the region
// reused by the three phases of a CTA (a CTA is either the sink/recent CTA or a split CTA,
// and a split CTA merges its partial Os only after its last page).
#pragma once

#include "fp4kv/attention/device_common.cuh"
#include "fp4kv/attention/fragment.h"
#include "fp4kv/cache/layout.h"

namespace fp4kv::attention::detail {

inline constexpr int kBf16Rows = cache::kSlotRows;  // sink + recent rows of a slot (144)

// Hopper (sm_90) shared memory: 228 KB per SM, of which a block may opt in to 227 KB; the
// runtime reserves 1 KB per resident block. Two CTAs per SM leave each (228 KB / 2 - 1 KB).
inline constexpr int kSmemPerSm = 228 * 1024;
inline constexpr int kSmemReservedPerCta = 1024;
inline constexpr int kSmemPerCtaMax = 227 * 1024;
inline constexpr int kSmemPerCtaAtTwoPerSm = kSmemPerSm / 2 - kSmemReservedPerCta;
inline constexpr int kMaxStages = 8;
inline constexpr int kMbarrierBytes = 8;

constexpr int cmax(int a, int b) { return a > b ? a : b; }

template <class F, int D, int T, int NT>
struct SmemPlan {
  static constexpr cache::PageLayout L = cache::PageLayout::make(F::kFormat, D);
  static constexpr bool kFp4 = F::kFp4;
  // FP4/FP8 pages arrive by one bulk copy each and P.V runs one page behind S;
  // BF16 pages need a zero fill past the last token and a row swizzle: cp.async.
  static constexpr bool kBulk = F::kBulk;
  static constexpr int BLK = F::kBlock;
  static constexpr int KS = D / 16;                                   // k-steps of Q.K
  static constexpr int KW = kFp4 ? KS * 4 : KS * 8;                   // K code bytes per lane per key group
  static constexpr int VW = kFp4 ? 8 * 4 : 8 * 8;                     // V code bytes per lane per channel group
  static constexpr int KCPL = KW / 16, VCPL = VW / 16;                // 16-byte parts per lane
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
  // Query B fragments in registers when they are few, else re-read from shared memory every
  // page. The dual-residual query's two column tiles at d = 128 (32 registers; G = 8, the
  // native presets of Qwen3-30B-A3B) fit beside everything else and save 16 LDS a page (2 %
  // faster where the loop is issue-bound); one query term's two tiles (G = 9-16) would spill.
  static constexpr bool kQReg = KS * NT * 2 <= (T == 2 ? 32 : 16);
  // shared memory: [region: page stages | BF16 sink/recent rows | final O merge][extras]
  static constexpr int QFRAG = KS * NT * 32 * 8;
  static constexpr int PS = 16 * kPsStride * 2 * (kBulk ? 2 : 1);   // P^T, double-buffered when lagged
  // Scalars: gfac [2][kMaxG], red_max [2][kMaxG][kWarps], red_sum [kMaxG][kWarps],
  // red_m [kMaxG], ebuf [kMaxG * 16] (the query quantizer's per-block exponents).
  static constexpr int SC = 4 * (2 * kMaxG + 2 * kMaxG * kWarps + kMaxG * kWarps + kMaxG + kMaxG * 16);
  static constexpr int MBAR = kMaxStages * kMbarrierBytes;            // one mbarrier per stage
  static constexpr int BF16_NEED = !kBulk ? 0 : 2 * kBf16Rows * D * 2 + kMaxG * kBf16Rows * 4;
  static constexpr int OMERGE = KP * NTP * 8 * D * 4;
  // The FP32 queries [G][D] live only through the prologue: bulk kernels keep them in the
  // P^T buffers (zeroed after the prologue), BF16 kernels after the other extras.
  static constexpr int QF_BYTES = GMAX * D * 4;
  static constexpr int PSR = kBulk ? cmax(PS, QF_BYTES) : PS;  // the P^T (and query) buffer
  static constexpr int EXTRA = cache::align_up(QFRAG) + cache::align_up(PSR) + cache::align_up(SC) +
                               cache::align_up(MBAR) + (kBulk ? 0 : QF_BYTES);
  static constexpr int region(int ns) { return cache::align_up(cmax(ns * STAGE, cmax(BF16_NEED, OMERGE))); }
  // Two CTAs (16 warps) per SM when shared memory and the O registers allow, else one.
  static constexpr int kBudget2 = kSmemPerCtaAtTwoPerSm, kBudget1 = kSmemPerCtaMax;
  static constexpr bool kTwo = CGW * NTP * 4 <= 32 && region(3) + EXTRA <= kBudget2;
  // Stages: the lagged P.V keeps two pages resident (S of page i, P.V of page i - 1), so a
  // bulk kernel has NS - 2 pages in flight (NS >= 3); a BF16 kernel NS - 2 for NS >= 3.
  static constexpr int pick_ns() {
    for (int ns = kTwo ? 5 : 6; ns > (kBulk ? 3 : 1); --ns)
      if (region(ns) + EXTRA <= (kTwo ? kBudget2 : kBudget1)) return ns;
    return kBulk ? 3 : 1;
  }
  static constexpr int NS = pick_ns();
  static_assert(NS <= kMaxStages, "one mbarrier per stage");
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

}  // namespace fp4kv::attention::detail
