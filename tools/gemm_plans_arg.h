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

// The option's help, the same for every command that takes it.
inline constexpr const char* kGemmPlansHelp =
    "the GPU decode step's GEMMs: heuristic (cuBLASLt's first choice: the same bits every run), tuned (the "
    "fastest candidate, timed at start: what `bench e2e` measures; the last bits may differ between runs), gemv "
    "(ours up to 8 rows: the fastest at one row, 2x slower at 8)";

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
