// What a kernel of a higher layer needs to write a decode step's new K/V rows into the cache
// itself (cache/append_row.cuh): the cache's shape, memory and step plan, and the step's
// block tables and lengths. Plain data, from KvCache::append_target(layer); the layout and
// the row rules stay the cache's (callers hand over values, never addresses).
#pragma once

#include "fp4kv/cache/kernels.h"
#include "fp4kv/cache/step_plan.h"

namespace fp4kv::cache {

struct AppendTarget {
  detail::CacheDims dims;
  detail::CacheMem mem;
  StepPlan plan;
  detail::StepArgs step;  // layer, block tables, lengths; k and v: the rows (the cache's row kernel only)
};

}  // namespace fp4kv::cache
