// Host side of the decode attention: checks, dispatch to the kernel instantiations,
// workspace and host-filled split plans.
#include "fp4kv/attention/decode.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>

#include "fp4kv/attention/kernel_registry.h"
#include "fp4kv/core/error.h"
#include "fp4kv/core/transform.h"

namespace fp4kv::attention {

namespace {

void cuda_check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw Error(std::string("decode attention: ") + what + ": " + cudaGetErrorString(e));
}

bool fp4(KvFormat f) { return f == KvFormat::nvfp4 || f == KvFormat::mxfp4; }

}  // namespace

void check_supported(const DecodeParams& p, const Recipe& r) {
  const std::string who = "decode attention (recipe '" + r.name + "'): ";
  require(r.kv != KvFormat::fp32, who + "fp32 is a CPU reference format; the GPU cache stores bf16, fp8, nvfp4 or mxfp4");
  require(r.query != QueryFormat::smooth_fp4,
          who + "the smoothq query variant is a CPU-reference-only comparison (use the dual-residual query)");
  require(r.prob != ProbFormat::fp4_two_level,
          who + "the twolevel P scaling variant is a CPU-reference-only comparison (use underflow-aware P)");
  require(p.layout.format == r.kv, who + "the cache stores " + to_string(p.layout.format) + " pages but the recipe wants " +
                                       to_string(r.kv));
  require(p.head_dim == 64 || p.head_dim == 128 || p.head_dim == 256,
          who + "head_dim " + std::to_string(p.head_dim) + " is not supported (64, 128 or 256)");
  require(p.layout.head_dim == p.head_dim, who + "the page layout is for head_dim " + std::to_string(p.layout.head_dim) +
                                               ", the params say " + std::to_string(p.head_dim));
  const cache::PageLayout expect = cache::PageLayout::make(r.kv, p.head_dim);
  require(p.layout.bytes == expect.bytes && p.layout.v_codes == expect.v_codes && p.layout.page_scales == expect.page_scales,
          who + "the page layout does not match cache/layout.h for this format and head_dim");
  require(p.kv_heads >= 1 && p.q_heads >= p.kv_heads && p.q_heads % p.kv_heads == 0,
          who + "q_heads must be a positive multiple of kv_heads");
  const int G = p.q_heads / p.kv_heads;
  require(G == 1 || G == 2 || G == 4 || G == 8 || G == 16,
          who + "GQA group size " + std::to_string(G) + " is not supported (1, 2, 4, 8 or 16)");
  require(p.block_stride >= (long long)p.layout.bytes * p.kv_heads && p.block_stride % 16 == 0,
          who + "block_stride must be a multiple of 16 bytes and at least kv_heads * layout.bytes");
  require(reinterpret_cast<uintptr_t>(p.pool) % 16 == 0, who + "the pool must be 16-byte aligned (bulk page copies)");
  if (r.native()) {
    require(fp4(r.kv), who + "native mode (FP4 query and probabilities) needs an nvfp4 or mxfp4 cache");
    require(r.prob == ProbFormat::fp4_max6 || r.prob == ProbFormat::fp4_underflow,
            who + "native mode needs FP4 probabilities");
  } else {
    require(r.prob == ProbFormat::full, who + "FP4 probabilities need an FP4 query (native mode)");
  }
  if (uses_slot_buffer(r))
    require(p.slot_buffer != nullptr && p.slots >= 1, who + "the recipe keeps BF16 sink/recent tokens but no slot buffer is given");
  if (r.rotate_keys) require(hadamard_supported(p.head_dim), who + "head_dim not supported by the Hadamard transform");
}

DecodeWorkspace::DecodeWorkspace(int max_batch, int q_heads, int head_dim, int max_splits)
    : max_batch_(max_batch), q_heads_(q_heads), head_dim_(head_dim), max_splits_(max_splits) {
  require(max_batch >= 1 && q_heads >= 1 && head_dim >= 1 && max_splits >= 1, "DecodeWorkspace: sizes must be positive");
  const size_t parts = size_t(max_batch) * q_heads * (max_splits + 1);
  cuda_check(cudaMalloc(&partial_out_, parts * head_dim * sizeof(float)), "cudaMalloc(partial out)");
  cuda_check(cudaMalloc(&partial_lse_, parts * sizeof(float)), "cudaMalloc(partial lse)");
}

DecodeWorkspace::~DecodeWorkspace() {
  cudaFree(partial_out_);
  cudaFree(partial_lse_);
}

namespace {

using detail::KernelArgs;

detail::DecodeKernel pick(const Recipe& r, int head_dim, int G) {
  return detail::find_decode_kernel(r.kv, head_dim, detail::operand_mode(r), detail::column_tiles(r, G));
}

}  // namespace

int decode_ctas_per_sm(const DecodeParams& p, const Recipe& r) {
  check_supported(p, r);
  const int G = p.q_heads / p.kv_heads;
  const detail::DecodeKernel k = pick(r, p.head_dim, G);
  if (!k || k.configure() != cudaSuccess) return 0;
  return k.ctas_per_sm(G);
}

int split_target_ctas(const DecodeParams& p, const Recipe& r, int batch, int sms) {
  const int resident = std::max(1, decode_ctas_per_sm(p, r)) * sms;
  const int rows = batch * p.kv_heads;
  // Whole splits per (row, head), so no split CTA is left for a second wave. The BF16
  // sink/recent CTAs (one per row and head) are short: give them slots of their own only
  // when that costs at most one split in eight.
  const int extra = uses_slot_buffer(r) ? rows : 0;
  int s = resident / rows;
  if (s >= 8 && s * rows + extra > resident) s = (resident - extra) / rows;
  return std::max(1, s) * rows;
}

void decode_attention(const DecodeParams& p, const Recipe& r, const float* q, const int32_t* block_tables,
                      const int32_t* seq_lens, int batch, int max_pages, const cache::StepPlan& plan,
                      DecodeWorkspace& ws, float* out, float* lse, cudaStream_t stream) {
  check_supported(p, r);
  require(batch >= 1 && batch <= ws.max_batch(), "decode attention: batch " + std::to_string(batch) +
                                                     " outside the workspace capacity " + std::to_string(ws.max_batch()));
  require(batch <= 65535, "decode attention: batch above 65535");
  require(plan.max_splits >= 1 && plan.max_splits <= ws.max_splits() && plan.max_splits <= 4096,
          "decode attention: plan.max_splits exceeds the workspace capacity (or 4096)");
  require(ws.q_heads() == p.q_heads && ws.head_dim() == p.head_dim, "decode attention: workspace geometry differs");
  require(plan.row_splits && plan.row_pages_per_split, "decode attention: the step plan has no split arrays");
  require(!uses_slot_buffer(r) || plan.row_slot, "decode attention: the step plan has no slot array");
  require(q && block_tables && seq_lens && out && max_pages >= 1, "decode attention: null input or output");
  require(reinterpret_cast<uintptr_t>(q) % 16 == 0, "decode attention: q must be 16-byte aligned (vector loads)");

  const int G = p.q_heads / p.kv_heads;

  KernelArgs a{};
  a.pool = p.pool;
  a.block_stride = p.block_stride;
  a.head_bytes = p.layout.bytes;
  a.kv_heads = p.kv_heads;
  a.q_heads = p.q_heads;
  a.G = G;
  a.slot_buffer = p.slot_buffer;
  a.slots = p.slots;
  a.q = q;
  a.q_type = detail::IoType::f32;
  a.block_tables = block_tables;
  a.seq_lens = seq_lens;
  a.batch = batch;
  a.max_pages = max_pages;
  a.row_slot = plan.row_slot;
  a.row_splits = plan.row_splits;
  a.row_pps = plan.row_pages_per_split;
  a.error_flags = plan.error_flags;
  a.num_rows = plan.num_rows;
  a.max_splits = plan.max_splits;
  a.part_o = ws.partial_out();
  a.part_lse = ws.partial_lse();
  if (r.kv == KvFormat::bf16) {
    a.qmode = detail::kQBf16;
    a.pmode = detail::kPBf16;
  } else {
    a.qmode = r.query == QueryFormat::full ? detail::kQHalf : r.query == QueryFormat::fp4 ? detail::kQFp4 : detail::kQDual;
    if (r.prob == ProbFormat::full) a.pmode = detail::kPHalf;
    else if (r.kv == KvFormat::mxfp4) a.pmode = detail::kPMx;
    else a.pmode = r.prob == ProbFormat::fp4_underflow ? detail::kPNvUnderflow : detail::kPNvMax6;
  }
  a.rotate = r.rotate_keys ? 1 : 0;
  // The BF16 format keeps every token in its pool pages: no slot rows at all.
  a.sink = (r.kv != KvFormat::bf16 && r.bf16_sink) ? 1 : 0;
  a.recent = (r.kv != KvFormat::bf16 && r.bf16_recent) ? 1 : 0;
  a.log2c = r.prob == ProbFormat::fp4_underflow ? std::log2(r.c) : 0.0f;
  a.tau = r.tau;
  a.gamma = log2e_over_sqrt_d(p.head_dim);

  const detail::DecodeKernel k = pick(r, p.head_dim, G);
  require(bool(k), "decode attention: no kernel variant for this combination");
  cuda_check(k.configure(), "decode kernel shared memory");
  k.launch(a, stream);
  cuda_check(cudaGetLastError(), "decode kernel launch");

  detail::CombineArgs c{};
  c.batch = batch;
  c.q_heads = p.q_heads;
  c.G = G;
  c.kv_format = int(r.kv);
  c.sink = a.sink;
  c.recent = a.recent;
  c.seq_lens = seq_lens;
  c.row_splits = plan.row_splits;
  c.row_pps = plan.row_pages_per_split;
  c.error_flags = plan.error_flags;
  c.num_rows = plan.num_rows;
  c.max_splits = plan.max_splits;
  c.part_o = ws.partial_out();
  c.part_lse = ws.partial_lse();
  c.q = q;
  c.q_type = detail::IoType::f32;
  c.mu_k = r.smooth_keys ? p.mu_k : nullptr;
  c.out = out;
  c.out_type = detail::IoType::f32;
  c.lse = lse;
  detail::find_combine_kernel(p.head_dim)(c, stream);
  cuda_check(cudaGetLastError(), "combine kernel launch");
}

// ---- planning ------------------------------------------------------------------------------

int choose_pages_per_split(int pages, int batch, int kv_heads, int max_splits, int target_ctas, int min_pages) {
  if (pages <= 0) return 1;
  const int rows = std::max(1, batch * kv_heads);
  int want = std::max(1, (target_ctas + rows - 1) / rows);
  want = std::min({want, max_splits, pages});
  int pps = std::max((pages + want - 1) / want, std::min(min_pages, pages));
  // never more splits than capacity
  while ((pages + pps - 1) / pps > max_splits) ++pps;
  return pps;
}

HostStepPlan::HostStepPlan(int max_batch, int max_splits) : max_batch_(max_batch) {
  require(max_batch >= 1 && max_splits >= 1, "HostStepPlan: sizes must be positive");
  plan_.max_splits = max_splits;
  cuda_check(cudaMalloc(&plan_.row_slot, max_batch * sizeof(int32_t)), "cudaMalloc(plan)");
  cuda_check(cudaMalloc(&plan_.row_splits, max_batch * sizeof(int32_t)), "cudaMalloc(plan)");
  cuda_check(cudaMalloc(&plan_.row_pages_per_split, max_batch * sizeof(int32_t)), "cudaMalloc(plan)");
  cuda_check(cudaMalloc(&plan_.row_promote_block, max_batch * sizeof(int32_t)), "cudaMalloc(plan)");
  cuda_check(cudaMalloc(&plan_.row_pages, max_batch * sizeof(int32_t)), "cudaMalloc(plan)");
  cuda_check(cudaMalloc(&plan_.num_rows, sizeof(int32_t)), "cudaMalloc(plan)");
  cuda_check(cudaMalloc(&plan_.error_flags, sizeof(int32_t)), "cudaMalloc(plan)");
  cuda_check(cudaMemset(plan_.error_flags, 0, sizeof(int32_t)), "cudaMemset(plan)");
  cuda_check(cudaMemset(plan_.row_promote_block, 0xff, max_batch * sizeof(int32_t)), "cudaMemset(plan)");
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
                        const std::vector<int>& slots, int target_ctas) {
  const int batch = int(seq_lens.size());
  require(batch >= 1 && batch <= max_batch_, "HostStepPlan::fill: batch outside capacity");
  require(slots.empty() || int(slots.size()) == batch, "HostStepPlan::fill: one slot per row");
  if (target_ctas <= 0) target_ctas = 2 * 132;
  splits_.assign(batch, 0);
  pps_.assign(batch, 1);
  pages_.assign(batch, 0);
  std::vector<int32_t> slot(batch);
  for (int b = 0; b < batch; ++b) {
    const int pages = attended_pages(seq_lens[b], r);
    pages_[b] = pages;
    int pps = pages_per_split > 0 ? pages_per_split
                                  : choose_pages_per_split(pages, batch, kv_heads, plan_.max_splits, target_ctas,
                                                           cache::min_split_pages(r));
    if (pages > 0)
      while ((pages + pps - 1) / pps > plan_.max_splits) ++pps;
    pps_[b] = std::max(1, pps);
    splits_[b] = pages > 0 ? (pages + pps_[b] - 1) / pps_[b] : 0;
    slot[b] = slots.empty() ? b : slots[b];
  }
  cuda_check(cudaMemcpy(plan_.row_slot, slot.data(), batch * sizeof(int32_t), cudaMemcpyHostToDevice), "plan upload");
  cuda_check(cudaMemcpy(plan_.row_splits, splits_.data(), batch * sizeof(int32_t), cudaMemcpyHostToDevice), "plan upload");
  cuda_check(cudaMemcpy(plan_.row_pages_per_split, pps_.data(), batch * sizeof(int32_t), cudaMemcpyHostToDevice),
             "plan upload");
  cuda_check(cudaMemcpy(plan_.row_pages, pages_.data(), batch * sizeof(int32_t), cudaMemcpyHostToDevice), "plan upload");
  cuda_check(cudaMemcpy(plan_.num_rows, &batch, sizeof(int32_t), cudaMemcpyHostToDevice), "plan upload");
}

std::vector<int> HostStepPlan::bounds(int b) const {
  std::vector<int> out{0};
  for (int s = 0; s < splits_[b]; ++s) out.push_back(std::min((s + 1) * pps_[b], pages_[b]));
  if (out.size() == 1) out.push_back(0);
  return out;
}

}  // namespace fp4kv::attention
