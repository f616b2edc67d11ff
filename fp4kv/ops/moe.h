// Qwen3-MoE's sparse MLP block on the GPU for the decode step's rows, in three kernels, at
// transformers' rounding points on a BF16 model (model/moe.h is the float32 form; the CPU
// twins are ops/reference.h's ref_moe_*):
//   moe_route    router logits (BF16: the router is a BF16 Linear, its output rounded) ->
//                per row the top_k experts in ascending expert order and their weights:
//                p = softmax over every expert in float32 (exp of core/hd_math.h, the sum in
//                double in a fixed order: per lane the experts lane, lane + 32, ... then a
//                butterfly over the lanes), top-k by p with ties to the lower index, divided
//                by their float sum (in decreasing-p order) when normalize_top_k, then rounded
//                to BF16 (transformers casts the weights to the hidden dtype).
//   moe_experts  per row and chosen expert e: act = bf16(bf16(silu(g)) * u) with
//                g = bf16(x W_gate[e]^T), u = bf16(x W_up[e]^T) -> act [rows][top_k][I].
//   moe_combine  out[row] = the chosen experts' bf16(bf16(act W_down[e]^T) * w) added in
//                ascending expert order, each partial sum rounded to BF16 (transformers'
//                index_add_ into a BF16 tensor, expert by expert).
// The two weight products are warp-per-output dot products (16-byte loads, FP32 FMA per lane
// in k order, a butterfly over the lanes), so their sums differ from the twin's double ones
// within the any-order FP32 bound; moe_route is bit-identical to its twin.
//
// Expert parallelism (tensor parallelism's MoE split): moe_experts and moe_combine may hold
// only experts [first_expert, first_expert + num_experts) of the router's; a pair that chose
// another expert is skipped (its act is not written, and out sums only the held experts'
// terms, in the same order: the ranks' all-reduce adds the rest).
//
// Layouts: gate_up [experts][2 I][H] (per expert the gate rows, then the up rows), down
// [experts][H][I]; x [rows][H]; experts int32 and weights float [rows][top_k].
// Invariants: H and I are multiples of kMoeDimMultiple, pointers 16-byte aligned; num_experts <= 256,
// top_k <= 16; a non-finite router logit sets kErrorRouterLogit and gives that row expert 0..k-1
// with zero weights (no out-of-range expert index is ever written). No host synchronization.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace fp4kv::ops {

inline constexpr int kMoeMaxExperts = 256;  // 8 per lane of the routing warp
inline constexpr int kMoeMaxTopK = 16;
inline constexpr int kMoeDimMultiple = 8;  // hidden and intermediate: whole 16-byte loads of BF16

struct MoeRouteArgs {
  const __nv_bfloat16* logits = nullptr;  // [rows][num_experts]
  int32_t* experts = nullptr;             // [rows][top_k], ascending
  float* weights = nullptr;               // [rows][top_k], BF16 values
  int rows = 0;
  int num_experts = 0;
  int top_k = 0;
  bool normalize_top_k = false;
  int32_t* error_flags = nullptr;         // ops/common.h
};

struct MoeExpertsArgs {
  const __nv_bfloat16* x = nullptr;        // [rows][hidden]
  const __nv_bfloat16* gate_up = nullptr;  // [num_experts][2 intermediate][hidden]
  const int32_t* experts = nullptr;        // [rows][top_k], from moe_route
  __nv_bfloat16* act = nullptr;            // [rows][top_k][intermediate]
  int rows = 0;
  int top_k = 0;
  int num_experts = 0;
  int hidden = 0;
  int intermediate = 0;
  int first_expert = 0;  // the router's id of gate_up's expert 0
};

struct MoeCombineArgs {
  const __nv_bfloat16* act = nullptr;   // [rows][top_k][intermediate]
  const __nv_bfloat16* down = nullptr;  // [num_experts][hidden][intermediate]
  const int32_t* experts = nullptr;     // [rows][top_k], ascending (moe_route)
  const float* weights = nullptr;       // [rows][top_k]
  __nv_bfloat16* out = nullptr;         // [rows][hidden]
  int rows = 0;
  int top_k = 0;
  int num_experts = 0;
  int hidden = 0;
  int intermediate = 0;
  int first_expert = 0;  // the router's id of down's expert 0
};

// Scratch of moe_experts and moe_combine, carved from one device allocation of
// moe_workspace_bytes(): the grouping of the (row, slot) pairs by expert, which moe_experts
// writes and moe_combine reuses (so call them in that order on the same rows and experts),
// and the experts' down outputs y [rows][top_k][hidden] that moe_combine folds.
struct MoeWorkspace {
  int32_t* used = nullptr;    // [1 + num_experts]: the count of used experts, then them ascending
  int32_t* begin = nullptr;   // [num_experts + 1]: each used expert's range in `pairs`
  int32_t* cursor = nullptr;  // [num_experts]: fill positions while grouping
  int32_t* pairs = nullptr;   // [max_rows top_k]: pair ids (row top_k + slot) grouped by expert
  __nv_bfloat16* y = nullptr;  // [max_rows][top_k][hidden]
};
size_t moe_workspace_bytes(int max_rows, int top_k, int hidden, int num_experts);
MoeWorkspace moe_workspace(void* base, int max_rows, int top_k, int num_experts);

// Each throws fp4kv::Error naming the bad argument before launching.
void moe_route(const MoeRouteArgs& args, cudaStream_t stream);
void moe_experts(const MoeExpertsArgs& args, const MoeWorkspace& workspace, cudaStream_t stream);
void moe_combine(const MoeCombineArgs& args, const MoeWorkspace& workspace, cudaStream_t stream);

}  // namespace fp4kv::ops
