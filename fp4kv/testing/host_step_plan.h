// A StepPlan filled on the host, for tests and benchmarks: what the control kernel
// (fp4kv/cache/control.cu) computes on the device, with the same planner
// (fp4kv/cache/split_plan.h), without a KvCache. Owns the device arrays the plan points to.
//
// Invariants: plan().max_splits is the capacity given at construction; after fill, rows
// [0, batch) hold the filled split plan and *num_rows == batch; error_flags starts at 0
// (a test may raise it to check that a step is skipped).
#pragma once

#include <cuda_runtime.h>

#include <vector>

#include "fp4kv/cache/split_plan.h"
#include "fp4kv/cache/step_plan.h"
#include "fp4kv/core/recipe.h"

namespace fp4kv::testing {

class HostStepPlan {
 public:
  HostStepPlan(int max_batch, int max_splits);
  ~HostStepPlan();
  HostStepPlan(const HostStepPlan&) = delete;
  HostStepPlan& operator=(const HostStepPlan&) = delete;

  // pages_per_split > 0 forces a split size (capped so no row needs more than max_splits);
  // 0 chooses with cache::plan_row_split under cache::step_split_policy for a GPU holding
  // `resident_ctas` decode CTAs (0: the control kernel's kSplitCtasPerSm per SM of a
  // kDefaultSmCount-SM device), balancing split CTAs over `balance_sms` SMs where the kernel
  // is issue-bound (cache::issue_bound_sms; 0: the one-wave rule).
  // slots[b] is the BF16 slot of row b (identity when empty). Synchronous upload.
  void fill(const std::vector<int>& seq_lens, const Recipe& recipe, int kv_heads, int pages_per_split = 0,
            const std::vector<int>& slots = {}, int resident_ctas = 0, int balance_sms = 0);

  const cache::StepPlan& plan() const { return plan_; }
  const std::vector<int>& splits() const { return splits_; }
  const std::vector<int>& pages_per_split() const { return pps_; }
  // Split bounds of row b in pages (the ref::SplitBounds the kernel follows).
  std::vector<int> bounds(int b) const;

 private:
  cache::StepPlan plan_;
  int max_batch_;
  std::vector<int> splits_, pps_, pages_;
};

}  // namespace fp4kv::testing
