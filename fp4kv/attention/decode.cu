// Host side of the decode attention (decode.h): validation and kernel choice once at
// construction, the workspace, the fixed kernel arguments; run fills the per-step fields
// and enqueues the decode and combine kernels.
//
// The hot path (run) builds no strings: its checks are integer comparisons that call a
// cold function to build the message only when they fail.
#include "fp4kv/attention/decode.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <utility>

#include "fp4kv/cache/cuda_check.h"
#include "fp4kv/core/error.h"
#include "fp4kv/core/transform.h"

namespace fp4kv::attention {

namespace {

using cache::cuda_check;

// Grid limits of the decode kernel: batch is grid.z (at most 65535 on CUDA devices); the
// split capacity sizes grid.x and the combine's loops.
constexpr int kMaxGridBatch = 65535;
constexpr int kMaxSplitCapacity = 4096;
// Bulk page copies and vector loads of q need 16-byte alignment.
constexpr uintptr_t kDeviceAlign = 16;

bool fp4(KvFormat f) { return f == KvFormat::nvfp4 || f == KvFormat::mxfp4; }
bool supported_head_dim(int d) { return d == 64 || d == 128 || d == 256; }
bool supported_group(int G) { return G == 1 || G == 2 || G == 4 || G == 8 || G == 16; }
bool misaligned(const void* p) { return reinterpret_cast<uintptr_t>(p) % kDeviceAlign != 0; }

void check_recipe(const Recipe& r, const std::string& who) {
  require(r.kv != KvFormat::fp32, who + "fp32 is a CPU reference format; the GPU cache stores bf16, fp8, nvfp4 or mxfp4");
  require(r.query != QueryFormat::smooth_fp4,
          who + "the smoothq query variant is a CPU-reference-only comparison (use the dual-residual query)");
  require(r.prob != ProbFormat::fp4_two_level,
          who + "the twolevel P scaling variant is a CPU-reference-only comparison (use underflow-aware P)");
  require(r.query != QueryFormat::fp8 && r.prob != ProbFormat::fp8,
          who + "the fp8qp variant (E4M3 Q and P) is a CPU-reference-only comparison so far (no GPU kernel)");
  if (r.native()) {
    require(fp4(r.kv), who + "native mode (FP4 query and probabilities) needs an nvfp4 or mxfp4 cache, not " +
                           to_string(r.kv));
    require(r.prob == ProbFormat::fp4_max6 || r.prob == ProbFormat::fp4_underflow,
            who + "native mode needs FP4 probabilities");
  } else {
    require(r.prob == ProbFormat::full, who + "FP4 probabilities need an FP4 query (native mode)");
  }
}

void check_geometry(const DecodeGeometry& g, const Recipe& r, const std::string& who) {
  require(supported_head_dim(g.head_dim),
          who + "head_dim " + std::to_string(g.head_dim) + " is not supported (64, 128 or 256)");
  require(g.kv_heads >= 1, who + "kv_heads " + std::to_string(g.kv_heads) + " must be positive");
  require(g.q_heads >= g.kv_heads && g.q_heads % g.kv_heads == 0,
          who + "q_heads " + std::to_string(g.q_heads) + " must be a positive multiple of kv_heads " +
              std::to_string(g.kv_heads));
  const int G = g.q_heads / g.kv_heads;
  require(supported_group(G), who + "GQA group size " + std::to_string(G) + " is not supported (1, 2, 4, 8 or 16)");
  if (r.rotate_keys)
    require(hadamard_supported(g.head_dim),
            who + "head_dim " + std::to_string(g.head_dim) + " is not supported by the Hadamard transform");
}

void check_capacity(const DecodeCapacity& c, const std::string& who) {
  require(c.max_batch >= 1 && c.max_batch <= kMaxGridBatch,
          who + "max_batch " + std::to_string(c.max_batch) + " outside 1.." + std::to_string(kMaxGridBatch));
  require(c.max_pages >= 1, who + "max_pages " + std::to_string(c.max_pages) + " must be positive");
  require(c.max_splits >= 1 && c.max_splits <= kMaxSplitCapacity,
          who + "max_splits " + std::to_string(c.max_splits) + " outside 1.." + std::to_string(kMaxSplitCapacity));
}

std::string who_of(const Recipe& r) { return "decode attention (recipe '" + r.name + "'): "; }

detail::KernelArgs fixed_decode_args(const DecodeGeometry& g, const Recipe& r, const DecodeCapacity& cap,
                                     const cache::PageLayout& layout, float* part_o, float* part_lse) {
  detail::KernelArgs a{};
  a.head_bytes = layout.bytes;
  a.kv_heads = g.kv_heads;
  a.q_heads = g.q_heads;
  a.G = g.q_heads / g.kv_heads;
  a.max_pages = cap.max_pages;
  a.part_o = part_o;
  a.part_lse = part_lse;
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
  a.gamma = log2e_over_sqrt_d(g.head_dim);
  return a;
}

detail::CombineArgs fixed_combine_args(const detail::KernelArgs& a, const Recipe& r) {
  detail::CombineArgs c{};
  c.q_heads = a.q_heads;
  c.G = a.G;
  c.kv_format = int(r.kv);
  c.sink = a.sink;
  c.recent = a.recent;
  c.part_o = a.part_o;
  c.part_lse = a.part_lse;
  return c;
}

}  // namespace

void DecodeAttention::check_supported(const DecodeGeometry& g, const Recipe& r, const DecodeCapacity& c) {
  const std::string who = who_of(r);
  check_recipe(r, who);
  check_geometry(g, r, who);
  check_capacity(c, who);
  const int G = g.q_heads / g.kv_heads;
  require(bool(detail::find_decode_kernel(r.kv, g.head_dim, detail::operand_mode(r), detail::column_tiles(r, G))),
          who + "no decode kernel instance for " + to_string(r.kv) + ", head_dim " + std::to_string(g.head_dim) +
              ", G " + std::to_string(G));
  require(detail::find_combine_kernel(g.head_dim, detail::IoType::f32) != nullptr &&
              detail::find_combine_kernel(g.head_dim, detail::IoType::bf16) != nullptr,
          who + "no combine kernel instance for head_dim " + std::to_string(g.head_dim));
}

DecodeAttention::DecodeAttention(const DecodeGeometry& g, const Recipe& r, const DecodeCapacity& c)
    : geometry_(g), recipe_(r), capacity_(c) {
  check_supported(g, r, c);  // no CUDA call before this line
  const int G = g.q_heads / g.kv_heads;
  layout_ = cache::PageLayout::make(r.kv, g.head_dim);
  kernel_ = detail::find_decode_kernel(r.kv, g.head_dim, detail::operand_mode(r), detail::column_tiles(r, G));
  combine_f32_ = detail::find_combine_kernel(g.head_dim, detail::IoType::f32);
  combine_bf16_ = detail::find_combine_kernel(g.head_dim, detail::IoType::bf16);
  const size_t parts = size_t(c.max_batch) * g.q_heads * (c.max_splits + 1);
  try {
    cuda_check(cudaMalloc(&partial_out_, parts * g.head_dim * sizeof(float)), "decode attention: cudaMalloc(partial out)");
    cuda_check(cudaMalloc(&partial_lse_, parts * sizeof(float)), "decode attention: cudaMalloc(partial lse)");
    cuda_check(kernel_.configure(), "decode attention: set the decode kernel's shared-memory limit");
  } catch (...) {
    release();
    throw;
  }
  ctas_per_sm_ = kernel_.ctas_per_sm(G);
  decode_args_ = fixed_decode_args(g, r, c, layout_, partial_out_, partial_lse_);
  combine_args_ = fixed_combine_args(decode_args_, r);
}

void DecodeAttention::release() noexcept {
  cudaFree(partial_out_);
  cudaFree(partial_lse_);
  partial_out_ = nullptr;
  partial_lse_ = nullptr;
}

DecodeAttention::~DecodeAttention() { release(); }

DecodeAttention::DecodeAttention(DecodeAttention&& o) noexcept
    : geometry_(o.geometry_),
      recipe_(std::move(o.recipe_)),
      capacity_(o.capacity_),
      layout_(o.layout_),
      kernel_(o.kernel_),
      combine_f32_(o.combine_f32_),
      combine_bf16_(o.combine_bf16_),
      ctas_per_sm_(o.ctas_per_sm_),
      partial_out_(std::exchange(o.partial_out_, nullptr)),
      partial_lse_(std::exchange(o.partial_lse_, nullptr)),
      decode_args_(o.decode_args_),
      combine_args_(o.combine_args_) {
  o.decode_args_.part_o = o.decode_args_.part_lse = nullptr;
  o.combine_args_.part_o = o.combine_args_.part_lse = nullptr;
}

DecodeAttention& DecodeAttention::operator=(DecodeAttention&& o) noexcept {
  if (this != &o) {
    release();
    geometry_ = o.geometry_;
    recipe_ = std::move(o.recipe_);
    capacity_ = o.capacity_;
    layout_ = o.layout_;
    kernel_ = o.kernel_;
    combine_f32_ = o.combine_f32_;
    combine_bf16_ = o.combine_bf16_;
    ctas_per_sm_ = o.ctas_per_sm_;
    partial_out_ = std::exchange(o.partial_out_, nullptr);
    partial_lse_ = std::exchange(o.partial_lse_, nullptr);
    decode_args_ = o.decode_args_;
    combine_args_ = o.combine_args_;
    o.decode_args_.part_o = o.decode_args_.part_lse = nullptr;
    o.combine_args_.part_o = o.combine_args_.part_lse = nullptr;
  }
  return *this;
}

namespace {

// The checks of a run, in order; the first that fails names the error.
enum StepProblem : int {
  kStepOk = 0,
  kMovedFrom,
  kBatchOutsideCapacity,
  kSplitsOutsideCapacity,
  kNoSplitArrays,
  kNoSlotArray,
  kNoTables,
  kNoIo,
  kQMisaligned,
  kWrongFormat,
  kBadPool,
  kBadBlockStride,
  kNoSlotBuffer,
};

}  // namespace

// Integer comparisons only: this runs every step.
int DecodeAttention::step_problem(const DecodeStep& s, const DecodeLayerView& v, const void* q, const void* out) const {
  const bool slots_needed = uses_slot_buffer(recipe_);
  if (partial_out_ == nullptr) return kMovedFrom;
  if (s.batch < 1 || s.batch > capacity_.max_batch) return kBatchOutsideCapacity;
  if (s.plan.max_splits < 1 || s.plan.max_splits > capacity_.max_splits) return kSplitsOutsideCapacity;
  if (!s.plan.row_splits || !s.plan.row_pages_per_split) return kNoSplitArrays;
  if (slots_needed && !s.plan.row_slot) return kNoSlotArray;
  if (!s.block_tables || !s.seq_lens) return kNoTables;
  if (!q || !out) return kNoIo;
  if (misaligned(q)) return kQMisaligned;
  if (v.format != recipe_.kv) return kWrongFormat;
  if (!v.pool || misaligned(v.pool)) return kBadPool;
  if (v.block_stride < min_block_stride() || v.block_stride % kDeviceAlign != 0) return kBadBlockStride;
  if (slots_needed && (v.slot_buffer == nullptr || v.slots < 1)) return kNoSlotBuffer;
  return kStepOk;
}

// The message of a failed check (cold: built only after step_problem found one).
void DecodeAttention::throw_step_problem(int problem, const DecodeStep& s, const DecodeLayerView& v) const {
  const std::string who = who_of(recipe_);
  switch (problem) {
    case kMovedFrom: throw Error(who + "run on a moved-from object");
    case kBatchOutsideCapacity:
      throw Error(who + "batch " + std::to_string(s.batch) + " outside the capacity 1.." +
                  std::to_string(capacity_.max_batch));
    case kSplitsOutsideCapacity:
      throw Error(who + "plan.max_splits " + std::to_string(s.plan.max_splits) + " outside the capacity 1.." +
                  std::to_string(capacity_.max_splits));
    case kNoSplitArrays: throw Error(who + "the step plan has no split arrays");
    case kNoSlotArray: throw Error(who + "the step plan has no slot array");
    case kNoTables: throw Error(who + "null block_tables or seq_lens");
    case kNoIo: throw Error(who + "null q or out");
    case kQMisaligned: throw Error(who + "q must be 16-byte aligned (vector loads)");
    case kWrongFormat:
      throw Error(who + "the cache stores " + to_string(v.format) + " pages but the recipe wants " +
                  to_string(recipe_.kv));
    case kBadPool: throw Error(who + "the pool must be non-null and 16-byte aligned (bulk page copies)");
    case kBadBlockStride:
      throw Error(who + "block_stride " + std::to_string(v.block_stride) + " must be a multiple of 16 bytes and at least " +
                  std::to_string(min_block_stride()) + " (kv_heads * layout bytes)");
    default: throw Error(who + "the recipe keeps BF16 sink/recent tokens but the layer view has no slot buffer");
  }
}

void DecodeAttention::run_typed(const DecodeStep& s, const DecodeLayerView& v, const void* q, detail::IoType io,
                                void* out, float* lse, cudaStream_t stream) {
  if (const int problem = step_problem(s, v, q, out); problem != kStepOk) [[unlikely]]
    throw_step_problem(problem, s, v);

  detail::KernelArgs a = decode_args_;
  a.pool = v.pool;
  a.block_stride = v.block_stride;
  a.slot_buffer = v.slot_buffer;
  a.slots = v.slots;
  a.q = q;
  a.q_type = io;
  a.block_tables = s.block_tables;
  a.seq_lens = s.seq_lens;
  a.batch = s.batch;
  a.row_slot = s.plan.row_slot;
  a.row_splits = s.plan.row_splits;
  a.row_pps = s.plan.row_pages_per_split;
  a.error_flags = s.plan.error_flags;
  a.num_rows = s.plan.num_rows;
  a.max_splits = s.plan.max_splits;
  kernel_.launch(a, stream);
  cuda_check(cudaGetLastError(), "decode attention: decode kernel launch");

  detail::CombineArgs c = combine_args_;
  c.batch = s.batch;
  c.seq_lens = s.seq_lens;
  c.row_splits = s.plan.row_splits;
  c.row_pps = s.plan.row_pages_per_split;
  c.error_flags = s.plan.error_flags;
  c.num_rows = s.plan.num_rows;
  c.max_splits = s.plan.max_splits;
  c.q = q;
  c.mu_k = recipe_.smooth_keys ? v.mu_k : nullptr;
  c.out = out;
  c.lse = lse;
  (io == detail::IoType::bf16 ? combine_bf16_ : combine_f32_)(c, stream);
  cuda_check(cudaGetLastError(), "decode attention: combine kernel launch");
}

void DecodeAttention::run(const DecodeStep& step, const DecodeLayerView& layer, const __nv_bfloat16* q,
                          __nv_bfloat16* out, float* lse, cudaStream_t stream) {
  run_typed(step, layer, q, detail::IoType::bf16, out, lse, stream);
}

void DecodeAttention::run(const DecodeStep& step, const DecodeLayerView& layer, const float* q, float* out, float* lse,
                          cudaStream_t stream) {
  run_typed(step, layer, q, detail::IoType::f32, out, lse, stream);
}

}  // namespace fp4kv::attention
