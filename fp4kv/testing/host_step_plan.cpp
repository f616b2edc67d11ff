// HostStepPlan (host_step_plan.h): the control kernel's split plan computed on the host
// with the shared planner, uploaded synchronously.
#include "fp4kv/testing/host_step_plan.h"

#include <algorithm>
#include <cstdint>
#include <string>

#include "fp4kv/cache/cuda_check.h"
#include "fp4kv/core/error.h"

namespace fp4kv::testing {

using cache::cuda_check;

HostStepPlan::HostStepPlan(int max_batch, int max_splits) : max_batch_(max_batch) {
  require(max_batch >= 1 && max_splits >= 1, "HostStepPlan: max_batch " + std::to_string(max_batch) +
                                                 " and max_splits " + std::to_string(max_splits) + " must be positive");
  plan_.max_splits = max_splits;
  const size_t rows = size_t(max_batch) * sizeof(int32_t);
  cuda_check(cudaMalloc(&plan_.row_slot, rows), "HostStepPlan: cudaMalloc");
  cuda_check(cudaMalloc(&plan_.row_splits, rows), "HostStepPlan: cudaMalloc");
  cuda_check(cudaMalloc(&plan_.row_pages_per_split, rows), "HostStepPlan: cudaMalloc");
  cuda_check(cudaMalloc(&plan_.row_promote_block, rows), "HostStepPlan: cudaMalloc");
  cuda_check(cudaMalloc(&plan_.row_pages, rows), "HostStepPlan: cudaMalloc");
  cuda_check(cudaMalloc(&plan_.num_rows, sizeof(int32_t)), "HostStepPlan: cudaMalloc");
  cuda_check(cudaMalloc(&plan_.error_flags, sizeof(int32_t)), "HostStepPlan: cudaMalloc");
  cuda_check(cudaMemset(plan_.error_flags, 0, sizeof(int32_t)), "HostStepPlan: cudaMemset");
  cuda_check(cudaMemset(plan_.row_promote_block, 0xff, rows), "HostStepPlan: cudaMemset");  // -1: no promotion
}

HostStepPlan::~HostStepPlan() {
  cudaFree(plan_.row_slot);
  cudaFree(plan_.row_splits);
  cudaFree(plan_.row_pages_per_split);
  cudaFree(plan_.row_promote_block);
  cudaFree(plan_.row_pages);
  cudaFree(plan_.num_rows);
  cudaFree(plan_.error_flags);
}

void HostStepPlan::fill(const std::vector<int>& seq_lens, const Recipe& r, int kv_heads, int pages_per_split,
                        const std::vector<int>& slots, int resident_ctas, int balance_sms) {
  const int batch = int(seq_lens.size());
  require(batch >= 1 && batch <= max_batch_, "HostStepPlan::fill: batch " + std::to_string(batch) +
                                                 " outside the capacity 1.." + std::to_string(max_batch_));
  require(slots.empty() || int(slots.size()) == batch, "HostStepPlan::fill: " + std::to_string(slots.size()) +
                                                           " slots for " + std::to_string(batch) + " rows");
  pages_.assign(batch, 0);
  int rows_with_pages = 0;
  for (int b = 0; b < batch; ++b) {
    pages_[b] = cache::attended_pages(seq_lens[b], r);
    rows_with_pages += pages_[b] > 0;
  }
  const int head_rows = rows_with_pages * kv_heads;
  cache::SplitPolicy policy = cache::step_split_policy(
      resident_ctas > 0 ? resident_ctas : cache::kSplitCtasPerSm * cache::kDefaultSmCount, head_rows,
      cache::slot_row_ctas(r, head_rows), plan_.max_splits, cache::split_floor(r), cache::max_one_wave_pages(r),
      balance_sms);
  policy.forced_pages_per_split = pages_per_split;
  splits_.assign(batch, 0);
  pps_.assign(batch, 0);
  std::vector<int32_t> slot(batch);
  for (int b = 0; b < batch; ++b) {
    const cache::RowSplit s = cache::plan_row_split(pages_[b], policy);
    splits_[b] = s.splits;
    pps_[b] = s.pages_per_split;
    slot[b] = slots.empty() ? b : slots[b];
  }
  const size_t bytes = size_t(batch) * sizeof(int32_t);
  cuda_check(cudaMemcpy(plan_.row_slot, slot.data(), bytes, cudaMemcpyHostToDevice), "HostStepPlan: upload");
  cuda_check(cudaMemcpy(plan_.row_splits, splits_.data(), bytes, cudaMemcpyHostToDevice), "HostStepPlan: upload");
  cuda_check(cudaMemcpy(plan_.row_pages_per_split, pps_.data(), bytes, cudaMemcpyHostToDevice), "HostStepPlan: upload");
  cuda_check(cudaMemcpy(plan_.row_pages, pages_.data(), bytes, cudaMemcpyHostToDevice), "HostStepPlan: upload");
  cuda_check(cudaMemcpy(plan_.num_rows, &batch, sizeof(int32_t), cudaMemcpyHostToDevice), "HostStepPlan: upload");
}

std::vector<int> HostStepPlan::bounds(int b) const {
  std::vector<int> out{0};
  for (int s = 0; s < splits_[b]; ++s) out.push_back(std::min((s + 1) * pps_[b], pages_[b]));
  if (out.size() == 1) out.push_back(0);
  return out;
}

}  // namespace fp4kv::testing
