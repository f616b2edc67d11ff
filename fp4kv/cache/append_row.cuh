// Writing one token's K or V row into the cache from a warp's registers: the rows of a
// prefill chunk and of a decode append (append.cu's row kernel), and the decode append done
// by the kernel that produced the row (ops::qk_norm_rope_append), which saves the row's trip
// through global memory and a kernel boundary per layer. One code path for both, so a row
// fused into its producer has the bits of KvCache::append.
//
// A row: keys are transformed (k' = H (k - mu) per the recipe), every value rounded to BF16
// (non-finite values counted and stored as 0); quantized formats write the slot's recent
// row pos % 128 (and the sink row pos when pos < 16 with BF16 sink), the BF16 format the
// row of its pool page. Every call is by a whole warp (the transform shuffles), the row
// held as RowFrag<D> (lane l: elements l E .. l E + E - 1).
#pragma once

#include "fp4kv/cache/append_target.h"
#include "fp4kv/cache/device_common.cuh"

namespace fp4kv::cache {
namespace detail {

enum class RowMode { prefill, append };

// BF16 pool row: token row t of a BF16 page (K or V part; latent pages: the latent or r rows).
__device__ __forceinline__ uint16_t* bf16_pool_row(const CacheDims& dims, const CacheMem& mem, int layer, int block,
                                                   int head, int kv, int t) {
  uint8_t* base = block_head(dims, mem, layer, block, head);
  const PageLayout& L = dims.layout;
  if (dims.latent() && kv == 1) return reinterpret_cast<uint16_t*>(base + dims.r_rows) + t * dims.rope_dim;
  return reinterpret_cast<uint16_t*>(base + (kv == 0 ? bf16_k_offset(L, t, 0) : bf16_v_offset(L, t, 0)));
}

// Where one warp's row goes.
struct RowTarget {
  int layer = 0, head = 0, kv = 0, pos = 0;
  int slot = -1, block = -1;  // quantized formats: the slot; BF16: the pool block
  bool to_sink = false;       // also (prefill: only) the sink row `pos`
  bool count = true;          // count its non-finite elements here
  bool write = true;          // false: the step failed (error flags); the row is read, not written
};

// Transforms (K), rounds and writes one row of W values held by the warp.
template <int W>
__device__ __forceinline__ void write_row(const CacheDims& dims, const CacheMem& mem, RowMode mode, const RowTarget& t,
                                          RowFrag<W>& r) {
  constexpr int E = W / 32;
  const int lane = threadIdx.x % 32;
  const bool is_key = t.kv == 0;
  uint16_t v[E];
  int bad = 0;
  cached_row<W>(r, is_key ? mu_row(dims, mem, t.layer, t.head) : nullptr, is_key, dims.smooth, dims.rotate, lane, v,
                bad);
  if (!t.write) return;
  if (t.count) flush_nonfinite(mem.nonfinite, bad);
  if (dims.quantized()) {
    const int row = t.to_sink && mode == RowMode::prefill ? t.pos : kSinkTokens + t.pos % kPage;
    store_bf16<E>(slot_row(dims, mem, t.layer, t.slot, t.head, t.kv, row) + lane * E, v);
    if (t.to_sink && mode == RowMode::append)  // a decode token below 16 goes to both rows
      store_bf16<E>(slot_row(dims, mem, t.layer, t.slot, t.head, t.kv, t.pos) + lane * E, v);
  } else {
    store_bf16<E>(bf16_pool_row(dims, mem, t.layer, t.block, t.head, t.kv, t.pos % kPage) + lane * E, v);
  }
}

}  // namespace detail

// The decode append of one row, in two calls so that the target's loads overlap the
// producer's own: append_row_site as soon as the step's plan may be read (after the
// kernel's wait for its producer), append_row once the warp holds the row's values.
// Not for latent (MLA) caches, whose V side is narrower than D.
using AppendRowSite = detail::RowTarget;

// The site of row `row`'s new token, KV head `head`, K (kv 0) or V (1). Reads the sticky
// error flags (uniform: nothing writes them during a step's appends), the row's length and
// its slot together, one memory latency; a BF16 pool row's block needs the length first.
// Returns false when nothing may be written or read (a failed BF16 step).
__device__ __forceinline__ bool append_row_site(const AppendTarget& a, int row, int head, int kv, AppendRowSite& t) {
  const bool failed = *a.mem.error_flags != 0;
  t.layer = a.step.layer;
  t.head = head;
  t.kv = kv;
  t.pos = a.step.seq_lens[row] - 1;
  t.write = !failed;
  if (a.dims.quantized()) {
    t.slot = a.plan.row_slot[row];
    t.to_sink = a.dims.sink && t.pos < kSinkTokens;
    return true;
  }
  if (failed) return false;
  t.block = a.step.block_tables[static_cast<long long>(row) * a.step.max_pages + t.pos / kPage];
  return true;
}
template <int D>
__device__ __forceinline__ void append_row(const AppendTarget& a, const AppendRowSite& site, detail::RowFrag<D>& x) {
  detail::write_row<D>(a.dims, a.mem, detail::RowMode::append, site, x);
}

}  // namespace fp4kv::cache
