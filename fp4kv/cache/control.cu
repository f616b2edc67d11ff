// The slot table and the control kernel (paper section 4.3, SPEC section 5), all on the
// device so that a decode step needs no host synchronization.
//
// Slot table: owner[s] = first cache block of the request that holds slot s (-1 free),
// last_seen[s] = the step counter when its request last ran (-1 never). A request is
// identified by block_tables[row][0], fixed for its life.
//
// Control kernel (one CTA, once per decode step): for each row find the slot its request
// owns; rows of requests without a slot take, in row order, the least recently seen slots
// not claimed by any row of this batch (free slots first: they were last seen at -1; ties
// by slot index). Everything is decided in shared memory and committed only when the
// step is valid: with more requests than slots, a duplicated request, a bad sequence
// length or a block id out of range, the error flag is raised, the slot table, the step
// counter and the plan are left as they were, and every kernel of the step skips.
#include <climits>

#include <cub/block/block_scan.cuh>

#include "fp4kv/cache/cuda_check.h"
#include "fp4kv/cache/once_per_device.h"
#include "fp4kv/cache/device_common.cuh"
#include "fp4kv/cache/split_plan.h"
#include "fp4kv/core/error.h"

namespace fp4kv::cache::detail {
namespace {

constexpr int kControlThreads = 1024;
constexpr int kRowsPerThread = kControlMaxRows / kControlThreads;  // 2
static_assert(kRowsPerThread * kControlThreads == kControlMaxRows);

// Order of slots for a new request: least recently seen first, then lowest index.
__device__ __forceinline__ unsigned long long slot_key(long long last_seen, int slot) {
  return (static_cast<unsigned long long>(last_seen + 1) << 16) | static_cast<unsigned>(slot);
}

struct ControlArgs {
  CacheDims dims;
  CacheMem mem;
  StepPlan plan;
  StepArgs step;
  int resident_ctas = 0;  // split-KV: decode CTAs the GPU holds at once (split_plan.h step_split_policy)
};

size_t control_smem_bytes(int slots, int max_batch) {
  return size_t(slots) * (sizeof(int) * 3 + sizeof(long long)) + size_t(max_batch) * sizeof(int) * 4;
}

__global__ void __launch_bounds__(kControlThreads) control_kernel(const ControlArgs a) {
  extern __shared__ __align__(16) uint8_t smem[];
  using Scan = cub::BlockScan<int, kControlThreads>;
  __shared__ typename Scan::TempStorage scan_storage;
  __shared__ int s_err, s_unclaimed, s_rows_with_pages, s_promote;
  __shared__ long long s_step;
  __shared__ int s_flags;

  const int S = a.dims.slots, batch = a.step.batch, mp = a.step.max_pages, tid = threadIdx.x;
  long long* s_last = reinterpret_cast<long long*>(smem);
  int* s_owner = reinterpret_cast<int*>(s_last + S);
  int* s_claim = s_owner + S;
  int* s_rank_slot = s_claim + S;        // [S] slot of rank i among the unclaimed slots
  int* r_id = s_rank_slot + S;           // [max_batch] request id (first block)
  int* r_slot = r_id + a.step.max_batch;  // [max_batch] slot, -1 new
  int* r_seq = r_slot + a.step.max_batch;
  int* r_pages = r_seq + a.step.max_batch;

  if (tid == 0) {
    s_flags = *a.mem.error_flags;
    s_step = *a.mem.step_counter + 1;
    s_err = 0;
    s_unclaimed = 0;
    s_rows_with_pages = 0;
    s_promote = 0;
  }
  __syncthreads();
  if (s_flags != 0) return;  // a previous error stands until the host clears it

  for (int s = tid; s < S; s += kControlThreads) {
    s_owner[s] = a.mem.slot_owner[s];
    s_last[s] = a.mem.slot_last_seen[s];
    s_claim[s] = 0;
  }
  for (int r = tid; r < batch; r += kControlThreads) {
    const int seq = a.step.seq_lens[r];
    const int id = a.step.block_tables[static_cast<long long>(r) * mp];
    r_seq[r] = seq;
    r_id[r] = id;
    if (seq < 1 || (seq + kPage - 1) / kPage > mp) atomicOr(&s_err, kErrorBadSequence);
  }
  __syncthreads();

  // Every block id a row's pages use must be in range (one warp per row).
  {
    const int warp = tid / 32, lane = tid % 32;
    for (int r = warp; r < batch; r += kControlThreads / 32) {
      const int pages = min((r_seq[r] + kPage - 1) / kPage, mp);
      const int32_t* bt = a.step.block_tables + static_cast<long long>(r) * mp;
      bool bad = false;
      for (int p = lane; p < pages; p += 32) bad |= bt[p] < 0 || bt[p] >= a.dims.num_blocks;
      if (__any_sync(kFullMask, bad) && lane == 0) atomicOr(&s_err, kErrorBadSequence);
    }
  }

  // Rows whose request already owns a slot.
  for (int r = tid; r < batch; r += kControlThreads) {
    int found = -1;
    for (int s = 0; s < S; ++s)
      if (s_owner[s] == r_id[r]) {
        found = s;
        break;
      }
    r_slot[r] = found;
    if (found >= 0 && atomicAdd(&s_claim[found], 1) > 0) atomicOr(&s_err, kErrorDuplicateRequest);
  }
  __syncthreads();

  // New requests: their order among the new rows, and duplicates among them.
  int is_new[kRowsPerThread], new_idx[kRowsPerThread];
#pragma unroll
  for (int i = 0; i < kRowsPerThread; ++i) {
    const int r = tid * kRowsPerThread + i;
    is_new[i] = r < batch && r_slot[r] < 0;
    if (is_new[i])
      for (int q = 0; q < r; ++q)
        if (r_slot[q] < 0 && r_id[q] == r_id[r]) {
          atomicOr(&s_err, kErrorDuplicateRequest);
          break;
        }
  }
  int n_new = 0;
  Scan(scan_storage).ExclusiveSum(is_new, new_idx, n_new);
  if (n_new > 0) {
    // Rank of every unclaimed slot by (last seen, index); rank i goes to new row i.
    for (int s = tid; s < S; s += kControlThreads) {
      if (s_claim[s]) continue;
      atomicAdd(&s_unclaimed, 1);
      const unsigned long long key = slot_key(s_last[s], s);
      int rank = 0;
      for (int q = 0; q < S; ++q) rank += !s_claim[q] && slot_key(s_last[q], q) < key;
      if (rank < n_new) s_rank_slot[rank] = s;
    }
    __syncthreads();
    // An atomic, not `s_err |= ...`: the compiler loads s_err in every thread for a
    // predicated read-modify-write, a (benign) hazard that racecheck reports.
    if (tid == 0 && n_new > s_unclaimed) atomicOr(&s_err, kErrorSlotsExhausted);
    __syncthreads();
    if (s_err == 0) {
#pragma unroll
      for (int i = 0; i < kRowsPerThread; ++i)
        if (is_new[i]) r_slot[tid * kRowsPerThread + i] = s_rank_slot[new_idx[i]];
    }
  }
  __syncthreads();
  if (s_err != 0) {
    if (tid == 0) atomicOr(a.mem.error_flags, s_err);
    return;
  }

  // Commit: slot table, step counter, plan.
  const bool quantized = a.dims.quantized();
  for (int r = tid; r < batch; r += kControlThreads) {
    const int s = r_slot[r];
    a.mem.slot_owner[s] = r_id[r];
    a.mem.slot_last_seen[s] = s_step;
    const int seq = r_seq[r];
    const int pages = attended_pages(seq, a.dims.format, a.dims.sink, a.dims.recent);
    r_pages[r] = pages;
    if (pages > 0) atomicAdd(&s_rows_with_pages, 1);
    int promote = -1;
    if (quantized && a.dims.recent && seq % kPage == 0)
      promote = a.step.block_tables[static_cast<long long>(r) * mp + seq / kPage - 1];
    a.plan.row_promote_block[r] = promote;
    if (promote >= 0) a.mem.promote_rows[atomicAdd(&s_promote, 1)] = r;
  }
  __syncthreads();
  if (tid == 0) {
    *a.mem.step_counter = s_step;
    *a.mem.promote_count = s_promote;
    if (a.plan.num_rows) *a.plan.num_rows = batch;
  }

  // Split-KV plan (split_plan.h, the same planner as host-filled plans): one wave of whole
  // splits over the rows with pages (the BF16 sink/recent CTAs of a quantized cache given
  // slots when that is cheap), splits over kMaxSplitPages cut to it unless a one-wave plan
  // beside the sink/recent CTAs keeps them at most kMaxOneWavePages (not for native recipes:
  // dims.max_one_wave_pages), at least the recipe's split floor of pages, at most max_splits
  // per row.
  const int head_rows = s_rows_with_pages * a.dims.heads;
  const SplitPolicy policy =
      step_split_policy(a.resident_ctas, head_rows, slot_row_ctas(a.dims.format, a.dims.sink, a.dims.recent, head_rows),
                        a.plan.max_splits, a.dims.split_floor, a.dims.max_one_wave_pages, a.dims.balance_sms);
  for (int r = tid; r < a.step.max_batch; r += kControlThreads) {
    int slot = -1, pages = 0;
    if (r < batch) {
      slot = r_slot[r];
      pages = r_pages[r];
    } else {
      a.plan.row_promote_block[r] = -1;
    }
    const RowSplit split = plan_row_split(pages, policy);
    a.plan.row_slot[r] = slot;
    a.plan.row_splits[r] = split.splits;
    a.plan.row_pages_per_split[r] = split.pages_per_split;
    if (a.plan.row_pages) a.plan.row_pages[r] = pages;
  }
}

// Finds or claims the slot of the request being prefilled: the slot it owns, else the
// least recently seen slot not used by the last decode step (last_seen < step counter).
__global__ void __launch_bounds__(256) claim_kernel(const CacheDims dims, const CacheMem mem, const int32_t* block_row) {
  __shared__ unsigned long long scratch[32];
  __shared__ int s_found;
  const int tid = threadIdx.x, S = dims.slots;
  const int id = block_row[0];
  if (id < 0 || id >= dims.num_blocks) {
    if (tid == 0) {
      *mem.prefill_slot = -1;
      atomicOr(mem.error_flags, kErrorBadSequence);
    }
    return;
  }
  const long long step = *mem.step_counter;
  if (tid == 0) s_found = INT_MAX;
  __syncthreads();
  for (int s = tid; s < S; s += blockDim.x)
    if (mem.slot_owner[s] == id) atomicMin(&s_found, s);
  __syncthreads();
  int slot = s_found;
  if (slot == INT_MAX) {
    // Minimum key over the candidates; keys are unique, ~0 means none.
    unsigned long long best = ~0ull;
    for (int s = tid; s < S; s += blockDim.x) {
      const long long seen = mem.slot_last_seen[s];
      if (seen < step) {
        const unsigned long long k = slot_key(seen, s);
        best = k < best ? k : best;
      }
    }
    // block minimum = ~block_max(~x)
    best = ~block_max(~best, scratch);
    slot = best == ~0ull ? -1 : static_cast<int>(best & 0xFFFFu);
  }
  if (tid == 0) {
    *mem.prefill_slot = slot;
    if (slot < 0) {
      atomicOr(mem.error_flags, kErrorSlotsExhausted);
    } else {
      mem.slot_owner[slot] = id;
      mem.slot_last_seen[slot] = step;
    }
  }
}

__global__ void release_kernel(const CacheDims dims, const CacheMem mem, int32_t first_block) {
  for (int s = threadIdx.x; s < dims.slots; s += blockDim.x)
    if (mem.slot_owner[s] == first_block) {
      mem.slot_owner[s] = -1;
      mem.slot_last_seen[s] = -1;
    }
}

}  // namespace

namespace {
cudaError_t set_control_kernel_smem() {
  return cudaFuncSetAttribute(control_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                              int(control_smem_bytes(kControlMaxSlots, kControlMaxRows)));
}
}  // namespace

void prepare_control_kernel() {
  cuda_check(once_per_device<set_control_kernel_smem>(), "control kernel: reserve shared memory");
}

void launch_claim_prefill_slot(const CacheDims& dims, const CacheMem& mem, const int32_t* block_row,
                               cudaStream_t stream) {
  claim_kernel<<<1, 256, 0, stream>>>(dims, mem, block_row);
  cuda_check_launch("cache slot claim kernel launch");
}

void launch_release_slot(const CacheDims& dims, const CacheMem& mem, int32_t first_block, cudaStream_t stream) {
  release_kernel<<<1, 256, 0, stream>>>(dims, mem, first_block);
  cuda_check_launch("cache slot release kernel launch");
}

void launch_control(const CacheDims& dims, const CacheMem& mem, const StepPlan& plan, const StepArgs& step,
                    int num_sms, cudaStream_t stream) {
  require(step.max_batch <= kControlMaxRows && dims.slots <= kControlMaxSlots, "control kernel: capacity exceeded");
  ControlArgs a;
  a.dims = dims;
  a.mem = mem;
  a.plan = plan;
  a.step = step;
  a.resident_ctas = kSplitCtasPerSm * num_sms;
  const size_t smem = control_smem_bytes(dims.slots, step.max_batch);
  prepare_control_kernel();
  control_kernel<<<1, kControlThreads, smem, stream>>>(a);
  cuda_check_launch("cache control kernel launch");
}

}  // namespace fp4kv::cache::detail
