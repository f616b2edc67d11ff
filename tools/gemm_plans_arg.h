// `--gemm-plans` of generate and serve: how the GPU decode step picks each batch size's GEMM
// plans (engine::GemmPlans in engine/gpu_model.h). The CPU engine has no GEMM plans and
// ignores the option; a value that is none of the three is refused on every machine.
#pragma once

#include <string>

#include "fp4kv/core/error.h"
#ifdef FP4KV_HAVE_CUDA
#include "fp4kv/engine/gpu_model.h"
#endif

namespace fp4kv::cli {

inline void check_gemm_plans(const std::string& s) {
  require(s == "gemv" || s == "heuristic" || s == "tuned", "--gemm-plans: '" + s + "' is none of gemv, heuristic, tuned");
}

#ifdef FP4KV_HAVE_CUDA
inline engine::GemmPlans gemm_plans_of(const std::string& s) {
  check_gemm_plans(s);
  return s == "tuned" ? engine::GemmPlans::tuned : s == "heuristic" ? engine::GemmPlans::heuristic : engine::GemmPlans::gemv;
}
#endif

}  // namespace fp4kv::cli
