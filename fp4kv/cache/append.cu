// BF16 rows: one CTA of two warps per (token, KV head); warp 0 writes K' (transformed),
// warp 1 writes V (latent caches: the latent c' and the positional key r). Quantized formats
// write the slot's sink/recent rows; the BF16 format writes the row straight into its pool
// block (a BF16 page). Used by prefill (the chunk's sink tokens and its last 128 tokens) and
// by the decode append (one token per row). The row rules themselves are append_row.cuh's,
// shared with kernels that append the rows they produce.
#include "fp4kv/cache/append_row.cuh"
#include "fp4kv/cache/cuda_check.h"
#include "fp4kv/cache/dependent_launch.cuh"
#include "fp4kv/core/error.h"

namespace fp4kv::cache::detail {
namespace {

struct RowKernelArgs {
  AppendTarget cache;  // the cache's shape and memory; decode append: also the step (its k and v are the rows)
  RowMode mode = RowMode::prefill;
  PrefillArgs prefill;
  int sink_rows = 0;  // prefill: the chunk's tokens [first, first + sink_rows) go to sink rows
  int recent_lo = 0;  // prefill: tokens [recent_lo, end) go to recent rows (or the BF16 pool)
  int count_from = 0; // prefill: tokens >= count_from are counted here (the others by the page kernel)
};

template <int W>
__device__ __forceinline__ void load_and_write_row(const CacheDims& dims, const CacheMem& mem, RowMode mode,
                                                   const RowTarget& t, const float* input) {
  RowFrag<W> r;
  load_row<W>(input, threadIdx.x % 32, r);
  write_row<W>(dims, mem, mode, t, r);
}

template <int D>
__global__ void __launch_bounds__(64) rows_kernel(const RowKernelArgs a) {
  // Launched as a programmatic dependent (launch()): the grid is set up while the op that
  // wrote the K/V rows finishes; wait for it before reading anything.
  wait_for_producer();
  const CacheDims& dims = a.cache.dims;
  const CacheMem& mem = a.cache.mem;
  RowTarget t;
  t.kv = threadIdx.x / 32;
  t.head = blockIdx.y;
  const bool is_key = t.kv == 0;
  const long long width = dims.width(t.kv);
  const float* input;
  if (a.mode == RowMode::append) {
    // The target's scalars and the row's values are loaded together (no store between).
    const int row = blockIdx.x;
    if (!append_row_site(a.cache, row, t.head, t.kv, t)) return;
    input = (is_key ? a.cache.step.k : a.cache.step.v) + (static_cast<long long>(row) * dims.heads + t.head) * width;
  } else {
    t.layer = a.prefill.layer;
    if (blockIdx.x < a.sink_rows) {  // sink copy (the token is counted where its recent row or page is written)
      t.pos = a.prefill.first + blockIdx.x;
      t.to_sink = true;
      t.count = false;
    } else {
      t.pos = a.recent_lo + (blockIdx.x - a.sink_rows);
      t.count = t.pos >= a.count_from;
    }
    input = (is_key ? a.prefill.k : a.prefill.v) + (static_cast<long long>(t.pos - a.prefill.first) * dims.heads + t.head) * width;
    if (dims.quantized()) {
      t.slot = *mem.prefill_slot;
      if (t.slot < 0) return;
    } else {
      t.block = a.prefill.block_row[t.pos / kPage];
      if (t.block < 0 || t.block >= dims.num_blocks) {
        if (threadIdx.x == 0) atomicOr(mem.error_flags, kErrorBadSequence);
        return;
      }
    }
  }
  if constexpr (D == kMlaLatentDim) {  // d = 512 is only a latent cache's: its V side is r
    if (!is_key) return load_and_write_row<kMlaRopeDim>(dims, mem, a.mode, t, input);
  }
  load_and_write_row<D>(dims, mem, a.mode, t, input);
}

// A decode step's append is a few CTAs whose cost is launch latency: as a programmatic
// dependent launch, its grid is set up while the producer of K/V (QK-norm + RoPE) finishes,
// and it waits for that producer in wait_for_producer().
template <int D>
void launch_rows(const RowKernelArgs& a, int rows, cudaStream_t stream) {
  launch_dependent(rows_kernel<D>, dim3(rows, a.cache.dims.heads), dim3(64), 0, stream, a);
}

void launch(const RowKernelArgs& a, int rows, cudaStream_t stream) {
  if (rows <= 0) return;
  switch (a.cache.dims.d) {
    case 64: launch_rows<64>(a, rows, stream); break;
    case 128: launch_rows<128>(a, rows, stream); break;
    case 256: launch_rows<256>(a, rows, stream); break;
    case kMlaLatentDim: launch_rows<kMlaLatentDim>(a, rows, stream); break;
    default: throw Error("cache row kernel: unsupported head_dim " + std::to_string(a.cache.dims.d));
  }
  cuda_check_launch("cache row kernel launch");
}

}  // namespace

void launch_prefill_rows(const CacheDims& dims, const CacheMem& mem, const PrefillArgs& args, cudaStream_t stream) {
  RowKernelArgs a;
  a.cache.dims = dims;
  a.cache.mem = mem;
  a.mode = RowMode::prefill;
  a.prefill = args;
  if (dims.quantized()) {
    // Sink rows for the chunk's tokens below 16; recent rows for its last 128 tokens (so
    // recent row r always holds the latest token = r mod 128, as after decode appends).
    a.sink_rows = dims.sink ? std::max(0, std::min(args.end, kSinkTokens) - args.first) : 0;
    a.recent_lo = std::max(args.first, args.end - kPage);
    // Tokens of pages quantized by this chunk are counted by the page kernel.
    a.count_from = dims.recent ? args.end / kPage * kPage : args.end;
  } else {
    a.recent_lo = args.first;  // every token goes to its BF16 page
    a.count_from = args.first;
  }
  launch(a, a.sink_rows + (args.end - a.recent_lo), stream);
}

void launch_append(const CacheDims& dims, const CacheMem& mem, const StepPlan& plan, const StepArgs& step,
                   cudaStream_t stream) {
  RowKernelArgs a;
  a.cache = AppendTarget{dims, mem, plan, step};
  a.mode = RowMode::append;
  launch(a, step.batch, stream);
}

}  // namespace fp4kv::cache::detail
