// The GPU decode step (gpu_model.h): buffers, the per-layer op sequence, graph capture.
#include "fp4kv/engine/gpu_model.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <numeric>
#include <optional>
#include <string>

#include "fp4kv/attention/kv_cache_adapter.h"
#include "fp4kv/cache/cuda_check.h"
#include "fp4kv/core/error.h"
#include "fp4kv/ops/common.h"
#include "fp4kv/ops/embedding.h"
#include "fp4kv/ops/moe.h"
#include "fp4kv/ops/qk_norm_rope.h"
#include "fp4kv/ops/rms_norm.h"

namespace fp4kv::engine {

using cache::cuda_check;

namespace {

// Small cuBLASLt workspace: decode GEMMs have few rows, and one plan per batch size and
// matrix keeps its own.
constexpr size_t kGemmWorkspaceBytes = size_t(4) << 20;

template <typename T>
T* device_array(size_t n, std::vector<void*>& owned, const char* what) {
  void* p = nullptr;
  cuda_check(cudaMalloc(&p, std::max<size_t>(n, 1) * sizeof(T)), std::string("GpuModel: ") + what);
  owned.push_back(p);
  return static_cast<T*>(p);
}

int pages_for(long long tokens) { return int((tokens + cache::kPage - 1) / cache::kPage); }

// The prefill's GEMMs run on row counts rounded up to this multiple, so a handful of plans
// serve every chunk length (the padding rows of their inputs stay zero; their outputs are unused).
constexpr int kPrefillGemmRows = 64;
constexpr int kMaxPrefillChunk = 16384;
int prefill_rows(int tokens) { return (tokens + kPrefillGemmRows - 1) / kPrefillGemmRows * kPrefillGemmRows; }

}  // namespace

struct GpuModel::Activations {
  std::vector<void*> owned;
  int32_t *tokens, *positions, *seq_lens, *block_tables, *sampled, *flags;
  SamplingRow* params;
  __nv_bfloat16 *x, *h, *qkv, *q, *attn, *delta, *gate_up, *act;
  float *k, *v, *logits;
  __nv_bfloat16 *k_bf16 = nullptr, *v_bf16 = nullptr;  // prefill only: the chunk's own K/V for attention
  // Qwen3-MoE layers (null for a dense model): router logits [B][experts], the chosen experts
  // and weights [B][top_k], their SwiGLU outputs [B][top_k][moe_intermediate], the kernels' scratch.
  __nv_bfloat16 *router_logits = nullptr, *moe_act = nullptr;
  int32_t* moe_experts = nullptr;
  float* moe_weights = nullptr;
  ops::MoeWorkspace moe_workspace;
  __nv_bfloat16* rope_cos;
  __nv_bfloat16* rope_sin;
  int rope_positions = 0;

  // Tensor parallelism: the LM head's logits of the rank's vocabulary slice [B][slice vocab],
  // and every rank's gathered [ranks][B][slice vocab] (null on one GPU: the LM head writes logits).
  float *slice_logits = nullptr, *gathered_logits = nullptr;

  // B rows of rank s's shapes; `prefill`: the chunk activations (BF16 K/V copies, logits of
  // no row: the prefill's last row goes through the step activations' LM head; the GEMM
  // inputs h, attn and act zeroed, since the ops write only a chunk's rows and the GEMMs read
  // padded ones).
  Activations(const model::Qwen3Config& c, const model::TpSlice& s, int B, int max_pages, int max_context,
              bool prefill = false) {
    const size_t H = c.hidden_size, d = c.head_dim, I = s.inter;
    const size_t qd = size_t(s.heads) * d, kvd = size_t(s.kv_heads) * d;
    tokens = device_array<int32_t>(B, owned, "tokens");
    positions = device_array<int32_t>(B, owned, "positions");
    seq_lens = device_array<int32_t>(B, owned, "seq_lens");
    block_tables = device_array<int32_t>(size_t(B) * max_pages, owned, "block tables");
    sampled = device_array<int32_t>(B, owned, "sampled tokens");
    flags = device_array<int32_t>(1, owned, "error flags");
    params = device_array<SamplingRow>(B, owned, "sampling params");
    x = device_array<__nv_bfloat16>(B * H, owned, "hidden");
    h = device_array<__nv_bfloat16>(B * H, owned, "normed hidden");
    qkv = device_array<__nv_bfloat16>(B * (qd + 2 * kvd), owned, "qkv");
    q = device_array<__nv_bfloat16>(B * qd, owned, "q");
    attn = device_array<__nv_bfloat16>(B * qd, owned, "attention output");
    delta = device_array<__nv_bfloat16>(B * H, owned, "sublayer output");
    gate_up = device_array<__nv_bfloat16>(B * 2 * I, owned, "gate_up");
    act = device_array<__nv_bfloat16>(B * I, owned, "swiglu");
    k = device_array<float>(B * kvd, owned, "k");
    v = device_array<float>(B * kvd, owned, "v");
    logits = prefill ? nullptr : device_array<float>(size_t(B) * c.vocab_size, owned, "logits");
    if (!prefill && s.ranks > 1) {
      slice_logits = device_array<float>(size_t(B) * s.vocab, owned, "slice logits");
      gathered_logits = device_array<float>(size_t(B) * c.vocab_size, owned, "gathered logits");
    }
    if (prefill) {
      k_bf16 = device_array<__nv_bfloat16>(B * kvd, owned, "prefill k");
      v_bf16 = device_array<__nv_bfloat16>(B * kvd, owned, "prefill v");
      cuda_check(cudaMemset(h, 0, size_t(B) * H * sizeof(__nv_bfloat16)), "GpuModel: prefill rows");
      cuda_check(cudaMemset(attn, 0, B * qd * sizeof(__nv_bfloat16)), "GpuModel: prefill rows");
      cuda_check(cudaMemset(act, 0, B * I * sizeof(__nv_bfloat16)), "GpuModel: prefill rows");
    }
    if (c.has_sparse_layer()) {
      const size_t E = c.num_experts, k = c.num_experts_per_tok;
      router_logits = device_array<__nv_bfloat16>(B * E, owned, "router logits");
      moe_experts = device_array<int32_t>(B * k, owned, "chosen experts");
      moe_weights = device_array<float>(B * k, owned, "expert weights");
      moe_act = device_array<__nv_bfloat16>(B * k * c.moe_intermediate_size, owned, "expert activations");
      void* scratch = device_array<uint8_t>(ops::moe_workspace_bytes(B, int(k), c.hidden_size, s.experts), owned,
                                            "MoE workspace");
      moe_workspace = ops::moe_workspace(scratch, B, int(k), s.experts);
    }
    const ops::RopeTable rope = ops::make_rope_table(c.head_dim, c.rope_theta, max_context);
    rope_positions = rope.positions;
    rope_cos = device_array<__nv_bfloat16>(rope.cos_bits.size(), owned, "rope cos");
    rope_sin = device_array<__nv_bfloat16>(rope.sin_bits.size(), owned, "rope sin");
    cuda_check(cudaMemcpy(rope_cos, rope.cos_bits.data(), rope.cos_bits.size() * 2, cudaMemcpyHostToDevice), "rope");
    cuda_check(cudaMemcpy(rope_sin, rope.sin_bits.data(), rope.sin_bits.size() * 2, cudaMemcpyHostToDevice), "rope");
    cuda_check(cudaMemset(flags, 0, sizeof(int32_t)), "GpuModel: flags");
  }
  ~Activations() {
    for (void* p : owned) cudaFree(p);
  }
};

struct GpuModel::Staging {
  int32_t *tokens = nullptr, *positions = nullptr, *seq_lens = nullptr, *block_tables = nullptr;
  int32_t *sampled = nullptr, *flags = nullptr;  // flags: [0] the ops', [1] the cache's
  static constexpr int kFlagWords = 2;
  SamplingRow* params = nullptr;
  std::vector<void*> owned;

  template <typename T>
  T* pinned(size_t n) {
    void* p = nullptr;
    cuda_check(cudaMallocHost(&p, std::max<size_t>(n, 1) * sizeof(T)), "GpuModel: pinned staging");
    owned.push_back(p);
    return static_cast<T*>(p);
  }
  Staging(int B, int max_pages) {
    tokens = pinned<int32_t>(B);
    positions = pinned<int32_t>(B);
    seq_lens = pinned<int32_t>(B);
    block_tables = pinned<int32_t>(size_t(B) * max_pages);
    sampled = pinned<int32_t>(B);
    flags = pinned<int32_t>(kFlagWords);
    params = pinned<SamplingRow>(B);
  }
  ~Staging() {
    for (void* p : owned) cudaFreeHost(p);
  }
};

// The plans of one batch size, one per StepGemm the model has.
struct GpuModel::Gemms {
  std::array<std::optional<ops::Gemm>, kStepGemmKinds> plans;
  const ops::Gemm& operator[](StepGemmKind kind) const { return *plans[size_t(kind)]; }
};

std::vector<StepGemm> step_gemms(const GpuWeights& weights, int m) {
  const model::Qwen3Config& c = weights.config();
  const model::TpSlice& s = weights.slice();
  using K = StepGemmKind;
  std::vector<StepGemm> g = {
      {K::qkv, "qkv", {m, (s.heads + 2 * s.kv_heads) * c.head_dim, c.hidden_size}, {}},
      {K::o, "o", {m, c.hidden_size, s.heads * c.head_dim}, {}},
      {K::gate_up, "gate_up", {m, 2 * s.inter, c.hidden_size}, {}},
      {K::down, "down", {m, c.hidden_size, s.inter}, {}},
      {K::router, "router", {m, c.num_experts, c.hidden_size}, {}},
      {K::lm_head, "lm_head", {m, s.vocab, c.hidden_size, ops::GemmOutput::f32}, {weights.lm_head()}}};
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    const GpuLayerWeights& L = weights.layer(l);
    g[size_t(K::qkv)].weights.push_back(L.wqkv);
    g[size_t(K::o)].weights.push_back(L.wo);
    if (L.sparse()) {
      g[size_t(K::router)].weights.push_back(L.router);
    } else {
      g[size_t(K::gate_up)].weights.push_back(L.w_gate_up);
      g[size_t(K::down)].weights.push_back(L.w_down);
    }
  }
  std::erase_if(g, [](const StepGemm& x) { return x.weights.empty(); });
  return g;
}

namespace {

// The mu_k rows of rank s's KV heads, from the whole model's [layers][kv_heads][head_dim].
std::vector<float> slice_mu_k(const float* mu_k, const model::Qwen3Config& c, const model::TpSlice& s) {
  std::vector<float> out;
  if (!mu_k) return out;
  const size_t d = c.head_dim;
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    const float* layer = mu_k + size_t(l) * c.num_key_value_heads * d;
    out.insert(out.end(), layer + size_t(s.first_kv_head) * d, layer + size_t(s.first_kv_head + s.kv_heads) * d);
  }
  return out;
}

// Graph capture needs a collective whose operations enqueue without host synchronization.
void require_capturable(const DeviceCollective* collective, bool cuda_graphs) {
  require(!cuda_graphs || !collective || collective->capturable(),
          "GpuModel: this tensor-parallel group synchronizes on the host and cannot be captured: set cuda_graphs off");
}

void check_tensor_parallel(const model::TpSlice& s, const GpuModelOptions& o) {
  const int ranks = o.collective ? o.collective->ranks() : 1, rank = o.collective ? o.collective->rank() : 0;
  require(s.ranks == ranks && s.rank == rank,
          "GpuModel: the weights are rank " + std::to_string(s.rank) + " of " + std::to_string(s.ranks) +
              "'s slice, the collective is rank " + std::to_string(rank) + " of " + std::to_string(ranks));
  require_capturable(o.collective, o.cuda_graphs);
}

GpuModelOptions resolve(const model::Qwen3Config& c, GpuModelOptions o) {
  require(o.max_batch >= 1 && o.max_batch <= 2048,
          "GpuModel: max_batch must be in [1, 2048], got " + std::to_string(o.max_batch));
  if (o.max_context == 0) o.max_context = c.max_position_embeddings > 0 ? c.max_position_embeddings : 32768;
  require(o.max_context >= 1, "GpuModel: max_context must be positive, got " + std::to_string(o.max_context));
  require(c.max_position_embeddings <= 0 || o.max_context <= c.max_position_embeddings,
          "GpuModel: max_context " + std::to_string(o.max_context) + " exceeds the model's max_position_embeddings " +
              std::to_string(c.max_position_embeddings));
  if (o.max_slots == 0) o.max_slots = std::min(o.max_batch, 2048);
  if (o.num_blocks == 0) o.num_blocks = o.max_batch * pages_for(o.max_context);
  require(o.num_blocks >= 1, "GpuModel: num_blocks must be positive, got " + std::to_string(o.num_blocks));
  require(o.prefill_chunk >= 0 && o.prefill_chunk <= kMaxPrefillChunk,
          "GpuModel: prefill_chunk must be in [0, " + std::to_string(kMaxPrefillChunk) + "], got " +
              std::to_string(o.prefill_chunk));
  return o;
}

}  // namespace

StepRows consecutive_rows(int batch, int max_pages, int seq_len, int token) {
  StepRows rows;
  rows.tokens.assign(batch, token);
  rows.seq_lens.assign(batch, seq_len);
  rows.block_tables.resize(size_t(batch) * max_pages);
  std::iota(rows.block_tables.begin(), rows.block_tables.end(), 0);
  return rows;
}

int prefill_chunk_for(const model::Qwen3Config& c, int chunk) {
  return attention::PrefillAttention::supports_head_dim(c.head_dim) ? chunk : 0;
}

long long gpu_kv_budget(double utilization) {
  require(utilization > 0 && utilization <= 1,
          "--gpu-memory-utilization must be in (0, 1], got " + std::to_string(utilization));
  size_t free_bytes = 0, total = 0;
  cuda_check(cudaMemGetInfo(&free_bytes, &total), "GPU memory");
  const double allowed = utilization * double(total) - double(total - free_bytes);
  return std::max(0LL, (long long)allowed - kGpuActivationReserveBytes);
}

GpuModel::GpuModel(const GpuWeights& weights, const Recipe& recipe, const float* mu_k, const GpuModelOptions& options)
    : weights_(weights), slice_(weights.slice()), recipe_(recipe), options_(resolve(weights.config(), options)) {
  const model::Qwen3Config& c = weights.config();
  check_tensor_parallel(slice_, options_);
  cache::KvCacheConfig cc;
  cc.layers = c.num_hidden_layers;
  cc.kv_heads = slice_.kv_heads;
  cc.head_dim = c.head_dim;
  cc.num_blocks = options_.num_blocks;
  cc.max_slots = options_.max_slots;
  cc.max_batch = options_.max_batch;
  cc.max_pages = pages_for(options_.max_context);
  const attention::DecodeGeometry geometry = decode_geometry(c, slice_);
  attention::DecodeAttention::check_supported(geometry, recipe_,
                                              attention::DecodeCapacity{cc.max_batch, cc.max_pages, cc.max_splits});
  cuda_check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "GpuModel: stream");
  cuda_check(cudaEventCreateWithFlags(&uploaded_, cudaEventDisableTiming), "GpuModel: event");
  const std::vector<float> rank_mu_k = slice_mu_k(mu_k, c, slice_);
  cache_ = std::make_unique<cache::KvCache>(cc, recipe_, mu_k ? rank_mu_k.data() : nullptr);
  attention_ = std::make_unique<attention::DecodeAttention>(geometry, recipe_, attention::capacity_of(*cache_));
  sampler_ = std::make_unique<ops::Sampler>(options_.max_batch, c.vocab_size);
  act_ = std::make_unique<Activations>(c, slice_, options_.max_batch, cc.max_pages, options_.max_context);
  if (options_.prefill_chunk > 0) {
    attention::PrefillConfig pc;
    pc.q_heads = slice_.heads;
    pc.max_chunk_tokens = options_.prefill_chunk;
    prefill_attention_ = std::make_unique<attention::PrefillAttention>(*cache_, pc);
    prefill_act_ = std::make_unique<Activations>(c, slice_, prefill_rows(options_.prefill_chunk), cc.max_pages,
                                                 options_.max_context, true);
  }
  staging_ = std::make_unique<Staging>(options_.max_batch, cc.max_pages);
  cuda_check(cudaDeviceSynchronize(), "GpuModel: setup");
}

GpuModel::~GpuModel() {
  if (stream_) cudaStreamSynchronize(stream_);
  for (auto& [batch, exec] : graphs_) cudaGraphExecDestroy(exec);
  if (uploaded_) cudaEventDestroy(uploaded_);
  gemms_.clear();
  prefill_gemms_.clear();
  staging_.reset();
  prefill_act_.reset();
  prefill_attention_.reset();
  act_.reset();
  sampler_.reset();
  attention_.reset();
  cache_.reset();
  if (stream_) cudaStreamDestroy(stream_);
}

// Runs every step: the messages are built only when a check fails.
void GpuModel::check_rows(const StepRows& rows) const {
  const int B = rows.batch(), P = max_pages();
  if (B < 1 || B > options_.max_batch)
    throw Error("GpuModel::step: batch " + std::to_string(B) + " outside [1, " + std::to_string(options_.max_batch) + "]");
  if (int(rows.seq_lens.size()) != B || rows.block_tables.size() != size_t(B) * P)
    throw Error("GpuModel::step: seq_lens must have batch entries and block_tables batch * " + std::to_string(P));
  for (int r = 0; r < B; ++r) {
    const auto row = [r] { return "GpuModel::step: row " + std::to_string(r) + ": "; };
    if (rows.tokens[r] < 0 || rows.tokens[r] >= config().vocab_size)
      throw Error(row() + "token " + std::to_string(rows.tokens[r]) + " outside the vocabulary");
    const int len = rows.seq_lens[r];
    if (len < 1 || len > options_.max_context)
      throw Error(row() + "sequence length " + std::to_string(len) + " outside [1, " +
                  std::to_string(options_.max_context) + "] (max_context)");
    for (int p = 0; p < pages_for(len); ++p) {
      const int32_t b = rows.block_tables[size_t(r) * P + p];
      if (b < 0 || b >= num_blocks())
        throw Error(row() + "block " + std::to_string(b) + " outside the cache's " + std::to_string(num_blocks()) +
                    " blocks");
    }
  }
}

void GpuModel::upload(const StepRows& rows) {
  const int B = rows.batch(), P = max_pages();
  cuda_check(cudaEventSynchronize(uploaded_), "GpuModel: previous upload");
  Staging& s = *staging_;
  std::memcpy(s.tokens, rows.tokens.data(), B * sizeof(int32_t));
  std::memcpy(s.seq_lens, rows.seq_lens.data(), B * sizeof(int32_t));
  for (int r = 0; r < B; ++r) s.positions[r] = rows.seq_lens[r] - 1;
  std::memcpy(s.block_tables, rows.block_tables.data(), size_t(B) * P * sizeof(int32_t));
  auto h2d = [this](void* dst, const void* src, size_t bytes) {
    cuda_check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream_), "GpuModel: upload");
  };
  h2d(act_->tokens, s.tokens, B * sizeof(int32_t));
  h2d(act_->seq_lens, s.seq_lens, B * sizeof(int32_t));
  h2d(act_->positions, s.positions, B * sizeof(int32_t));
  h2d(act_->block_tables, s.block_tables, size_t(B) * P * sizeof(int32_t));
  cuda_check(cudaEventRecord(uploaded_, stream_), "GpuModel: upload event");
}

GpuModel::Gemms& GpuModel::gemms_for(int batch) {
  auto it = gemms_.find(batch);
  if (it != gemms_.end()) return *it->second;
  auto g = std::make_unique<Gemms>();
  for (const StepGemm& s : step_gemms(weights_, batch)) {
    ops::Gemm& plan = g->plans[size_t(s.kind)].emplace(s.shape, kGemmWorkspaceBytes);
    if (options_.gemm_plans == GemmPlans::tuned) {  // on every layer's weights and the step's own buffers (their contents do not matter)
      const TuningOperands io = tuning_operands(s.kind);
      plan.tune(io.x, s.weights, io.y, stream_);
    } else if (options_.gemm_plans == GemmPlans::gemv) {
      plan.use_gemv();
    }
  }
  return *gemms_.emplace(batch, std::move(g)).first->second;
}

// Plans for the prefill's row counts: cuBLASLt's heuristic choice (tuning would time them on
// the step's buffers, sized for max_batch rows); no LM head (only the last row needs it: the
// step's batch-1 plan).
GpuModel::Gemms& GpuModel::prefill_gemms_for(int rows) {
  auto it = prefill_gemms_.find(rows);
  if (it != prefill_gemms_.end()) return *it->second;
  auto g = std::make_unique<Gemms>();
  for (const StepGemm& s : step_gemms(weights_, rows))
    if (s.kind != StepGemmKind::lm_head) g->plans[size_t(s.kind)].emplace(s.shape, kGemmWorkspaceBytes);
  return *prefill_gemms_.emplace(rows, std::move(g)).first->second;
}

// The step's input and output buffers of a GEMM, for timing its candidates.
GpuModel::TuningOperands GpuModel::tuning_operands(StepGemmKind kind) const {
  const Activations& a = *act_;
  switch (kind) {
    case StepGemmKind::qkv: return {a.h, a.qkv};
    case StepGemmKind::o: return {a.attn, a.delta};
    case StepGemmKind::gate_up: return {a.h, a.gate_up};
    case StepGemmKind::down: return {a.act, a.delta};
    case StepGemmKind::router: return {a.h, a.router_logits};
    case StepGemmKind::lm_head: return {a.h, a.slice_logits ? a.slice_logits : a.logits};
  }
  throw Error("GpuModel: unknown GEMM kind");
}

// QK-norm + RoPE of `tokens` rows of `a` (its BF16 K/V copies too, where it has them).
ops::QkNormRopeArgs GpuModel::qk_norm_rope_args(const model::Qwen3Config& c, const model::TpSlice& s,
                                                const GpuLayerWeights& w, const Activations& a, int tokens,
                                                int32_t* flags) {
  ops::QkNormRopeArgs r;
  r.qkv = a.qkv;
  r.positions = a.positions;
  r.q_norm = w.q_norm;
  r.k_norm = w.k_norm;
  r.rope_cos = a.rope_cos;
  r.rope_sin = a.rope_sin;
  r.rope_positions = a.rope_positions;
  r.tokens = tokens;
  r.q_heads = s.heads;
  r.kv_heads = s.kv_heads;
  r.head_dim = c.head_dim;
  r.eps = float(c.rms_norm_eps);
  r.q = a.q;
  r.k = a.k;
  r.v = a.v;
  r.k_bf16 = a.k_bf16;
  r.v_bf16 = a.v_bf16;
  r.error_flags = flags;
  return r;
}

// Layer l's input RMSNorm of `rows` rows of a.x into a.h; from layer 1 on, the previous
// layer's MLP output (a.delta) joins the residual stream first.
void GpuModel::enqueue_input_norm(int l, Activations& a, int rows) {
  const model::Qwen3Config& c = config();
  const GpuLayerWeights& w = weights_.layer(l);
  const float eps = float(c.rms_norm_eps);
  if (l == 0) {
    ops::rms_norm({a.x, w.input_norm, a.h, rows, c.hidden_size, eps}, stream_);
  } else {
    ops::add_rms_norm({a.x, a.delta, w.input_norm, a.h, rows, c.hidden_size, eps}, stream_);
  }
}

// QK-norm + RoPE of the step's B rows and, when the step updates the cache, the append of
// their K/V rows fused into the same kernel (one kernel boundary a layer less).
void GpuModel::enqueue_qk_norm_rope_append(int l, int B) {
  const ops::QkNormRopeArgs args = qk_norm_rope_args(config(), slice_, weights_.layer(l), *act_, B, act_->flags);
  if (!cache_updates_) {
    ops::qk_norm_rope(args, stream_);
    mark(StepPart::other);
    return;
  }
  ops::qk_norm_rope_append(args, cache_->append_target(l), stream_);
  cache_->finish_append(l, stream_);
  mark(StepPart::cache);
}

void GpuModel::enqueue_layer(int l, int B, const Gemms& g) {
  const model::Qwen3Config& c = config();
  const GpuLayerWeights& w = weights_.layer(l);
  const float eps = float(c.rms_norm_eps);
  Activations& a = *act_;
  enqueue_input_norm(l, a, B);
  mark(StepPart::other);
  g[StepGemmKind::qkv].run(a.h, w.wqkv, a.qkv, stream_);
  mark(StepPart::gemm);
  enqueue_qk_norm_rope_append(l, B);
  attention_->run(attention::step_of(*cache_, a.block_tables, a.seq_lens, B), attention::layer_view(*cache_, l), a.q,
                  a.attn, nullptr, stream_);
  mark(StepPart::attention);
  g[StepGemmKind::o].run(a.attn, w.wo, a.delta, stream_);
  mark(StepPart::gemm);
  all_reduce(a.delta, B);
  ops::add_rms_norm({a.x, a.delta, w.post_norm, a.h, B, c.hidden_size, eps}, stream_);
  mark(StepPart::other);
  enqueue_mlp(w, a, B, g);
}

// The MLP of a layer on the normed rows a.h (the GEMMs over g's row count), into a.delta
// (summed over the ranks): dense SwiGLU, or the sparse block of a Qwen3-MoE layer.
void GpuModel::enqueue_mlp(const GpuLayerWeights& w, Activations& a, int B, const Gemms& g) {
  if (w.sparse()) {
    enqueue_moe(w, a, B, g);
  } else {
    g[StepGemmKind::gate_up].run_swiglu(a.h, w.w_gate_up, a.gate_up, a.act, stream_);
    mark(StepPart::gemm);
    g[StepGemmKind::down].run(a.act, w.w_down, a.delta, stream_);
    mark(StepPart::gemm);
  }
  all_reduce(a.delta, B);
}

void GpuModel::all_reduce(__nv_bfloat16* x, int rows) {
  if (!options_.collective) return;
  options_.collective->all_reduce_sum(x, size_t(rows) * config().hidden_size, stream_);
  mark(StepPart::collective);
}

void GpuModel::enqueue_lm_head(const Gemms& g, const __nv_bfloat16* h, int B) {
  Activations& a = *act_;
  if (slice_.ranks == 1) {  // the whole vocabulary here
    g[StepGemmKind::lm_head].run(h, weights_.lm_head(), a.logits, stream_);
    mark(StepPart::gemm);
    return;
  }
  g[StepGemmKind::lm_head].run(h, weights_.lm_head(), a.slice_logits, stream_);
  mark(StepPart::gemm);
  const size_t slice = size_t(slice_.vocab), V = size_t(config().vocab_size);
  options_.collective->all_gather(a.slice_logits, size_t(B) * slice, a.gathered_logits, stream_);
  for (int r = 0; r < slice_.ranks; ++r)  // [ranks][B][slice] -> [B][vocab]
    cuda_check(cudaMemcpy2DAsync(a.logits + r * slice, V * sizeof(float), a.gathered_logits + size_t(r) * B * slice,
                                 slice * sizeof(float), slice * sizeof(float), size_t(B), cudaMemcpyDeviceToDevice,
                                 stream_),
               "GpuModel: gathered logits");
  mark(StepPart::collective);
}

// The sparse block of a Qwen3-MoE layer on the normed rows a.h, into a.delta (ops/moe.h).
void GpuModel::enqueue_moe(const GpuLayerWeights& w, Activations& a, int B, const Gemms& g) {
  const model::Qwen3Config& c = config();
  const int E = c.num_experts, k = c.num_experts_per_tok, H = c.hidden_size, EI = c.moe_intermediate_size;
  g[StepGemmKind::router].run(a.h, w.router, a.router_logits, stream_);
  mark(StepPart::gemm);
  ops::moe_route({a.router_logits, a.moe_experts, a.moe_weights, B, E, k, c.norm_topk_prob, act_->flags}, stream_);
  mark(StepPart::other);
  const int held = slice_.experts, first = slice_.first_expert;
  ops::moe_experts({a.h, w.experts_gate_up, a.moe_experts, a.moe_act, B, k, held, H, EI, first}, a.moe_workspace,
                   stream_);
  ops::moe_combine({a.moe_act, w.experts_down, a.moe_experts, a.moe_weights, a.delta, B, k, held, H, EI, first},
                   a.moe_workspace, stream_);
  mark(StepPart::gemm);
}

void GpuModel::enqueue_step(int B) {
  const model::Qwen3Config& c = config();
  Activations& a = *act_;
  const Gemms& g = gemms_for(B);
  mark(StepPart::other);  // the start
  if (cache_updates_) cache_->begin_step(a.block_tables, a.seq_lens, B, max_pages(), stream_);
  mark(StepPart::cache);
  ops::embedding_gather({a.tokens, B, weights_.embed(), c.vocab_size, c.hidden_size, a.x, a.flags,
                         slice_.first_vocab, slice_.vocab},
                        stream_);
  mark(StepPart::other);
  all_reduce(a.x, B);
  for (int l = 0; l < c.num_hidden_layers; ++l) enqueue_layer(l, B, g);
  if (cache_updates_) cache_->end_step(stream_);
  mark(StepPart::cache);
  ops::add_rms_norm({a.x, a.delta, weights_.final_norm(), a.h, B, c.hidden_size, float(c.rms_norm_eps)}, stream_);
  mark(StepPart::other);
  enqueue_lm_head(g, a.h, B);
}

void GpuModel::mark(StepPart part) {
  if (!marks_) return;
  cudaEvent_t e = nullptr;
  cuda_check(cudaEventCreate(&e), "GpuModel: profiling event");
  cuda_check(cudaEventRecord(e, stream_), "GpuModel: profiling event");
  marks_->emplace_back(e, part);
}

StepProfile GpuModel::profile_step(const StepRows& rows) {
  check_rows(rows);
  upload(rows);
  gemms_for(rows.batch());
  last_batch_ = rows.batch();
  last_replayed_ = false;
  std::vector<std::pair<cudaEvent_t, StepPart>> marks;
  marks_ = &marks;
  try {
    enqueue_step(rows.batch());
  } catch (...) {
    marks_ = nullptr;
    for (auto& m : marks) cudaEventDestroy(m.first);
    throw;
  }
  marks_ = nullptr;
  StepProfile p;
  const cudaError_t e = cudaStreamSynchronize(stream_);
  for (size_t i = 1; i < marks.size() && e == cudaSuccess; ++i) {
    float ms = 0;
    cudaEventElapsedTime(&ms, marks[i - 1].first, marks[i].first);
    p.us[int(marks[i].second)] += 1e3 * ms;
    p.total_us += 1e3 * ms;
  }
  for (auto& m : marks) cudaEventDestroy(m.first);
  cuda_check(e, "GpuModel: profiled step");
  return p;
}

void GpuModel::fill_random_tokens(const StepRows& rows, int first, int count, uint64_t seed, int chunk) {
  require(first >= 0 && count >= 1 && (long long)first + count < options_.max_context,
          "GpuModel::fill_random_tokens: tokens [" + std::to_string(first) + ", " + std::to_string((long long)first + count) +
              ") outside [0, max_context = " + std::to_string(options_.max_context) + ")");
  require(chunk >= 1, "GpuModel::fill_random_tokens: chunk must be positive");
  StepRows probe = rows;
  probe.seq_lens.assign(rows.batch(), first + count);
  probe.tokens.assign(rows.batch(), 0);
  check_rows(probe);
  upload(probe);
  const model::Qwen3Config& c = config();
  const int step = std::min(count, chunk);
  // The rank's KV heads of the whole model's rows: the same cache contents however it is split.
  const size_t row = size_t(slice_.kv_heads) * c.head_dim, full_row = size_t(c.num_key_value_heads) * c.head_dim;
  const size_t row_first = size_t(slice_.first_kv_head) * c.head_dim;
  std::vector<void*> owned;
  float* k = device_array<float>(size_t(step) * row, owned, "fill k");
  float* v = device_array<float>(size_t(step) * row, owned, "fill v");
  // Keys and values of unit standard deviation: what QK-norm'd keys and BF16 values look like
  // to the quantizer (the speed of the path does not depend on the values).
  constexpr float kAmplitude = kUniformAmplitudePerStd;
  try {
    for (int r = 0; r < rows.batch(); ++r) {
      const int32_t* block_row = act_->block_tables + size_t(r) * max_pages();
      for (int t0 = first; t0 < first + count; t0 += step) {
        const int n = std::min(step, first + count - t0);
        for (int l = 0; l < c.num_hidden_layers; ++l) {
          const uint64_t layer_seed = seed * 0x9E3779B97F4A7C15ull + uint64_t(l) * 2;
          const RandomRows rows_of_chunk{size_t(n), row, full_row, size_t(t0) * full_row + row_first};
          fill_random_rows(k, rows_of_chunk, layer_seed, kAmplitude, stream_);
          fill_random_rows(v, rows_of_chunk, layer_seed + 1, kAmplitude, stream_);
          cache_->prefill(l, block_row, t0, n, k, v, stream_);
        }
      }
    }
    synchronize();
  } catch (...) {
    for (void* p : owned) cudaFree(p);
    throw;
  }
  for (void* p : owned) cudaFree(p);
  check_errors();
}

void GpuModel::step(const StepRows& rows) {
  check_rows(rows);
  const int B = rows.batch();
  upload(rows);
  gemms_for(B);  // plans are made outside any capture
  last_batch_ = B;
  last_replayed_ = false;
  if (!options_.cuda_graphs) {
    enqueue_step(B);
    return;
  }
  cuda_check(cudaGraphLaunch(step_graph(B), stream_), "GpuModel: graph launch");
  last_replayed_ = true;
}

// The step graph of batch size B (captured on first use: it records the kernels on the step
// buffers, whatever they hold, so nothing runs).
cudaGraphExec_t GpuModel::step_graph(int B) {
  const int key = B * 2 + (cache_updates_ ? 1 : 0);
  auto it = graphs_.find(key);
  if (it != graphs_.end()) return it->second;
  cudaGraph_t graph = nullptr;
  cuda_check(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeRelaxed), "GpuModel: begin capture");
  try {
    enqueue_step(B);
  } catch (...) {
    cudaStreamEndCapture(stream_, &graph);
    if (graph) cudaGraphDestroy(graph);
    throw;
  }
  cuda_check(cudaStreamEndCapture(stream_, &graph), "GpuModel: end capture");
  cudaGraphExec_t exec = nullptr;
  const cudaError_t e = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);
  cuda_check(e, "GpuModel: instantiate the step graph");
  return graphs_.emplace(key, exec).first->second;
}

void GpuModel::prepare_steps(int max_batch) {
  require(max_batch >= 1 && max_batch <= options_.max_batch,
          "GpuModel::prepare_steps: batch " + std::to_string(max_batch) + " outside [1, max_batch = " +
              std::to_string(options_.max_batch) + "]");
  for (int B = 1; B <= max_batch; ++B) {
    gemms_for(B);
    if (options_.cuda_graphs) step_graph(B);
  }
  synchronize();
}

// One layer of a prefill chunk of `T` tokens at positions start .. start + T - 1 (the GEMMs
// over g's padded row count): as enqueue_layer, with the prefill attention reading the cached
// prefix before the cache takes the chunk's K/V.
void GpuModel::enqueue_prefill_layer(int l, int start, int T, const Gemms& g) {
  const model::Qwen3Config& c = config();
  const GpuLayerWeights& w = weights_.layer(l);
  const float eps = float(c.rms_norm_eps);
  Activations& a = *prefill_act_;
  enqueue_input_norm(l, a, T);
  g[StepGemmKind::qkv].run(a.h, w.wqkv, a.qkv, stream_);
  ops::qk_norm_rope(qk_norm_rope_args(c, slice_, w, a, T, act_->flags), stream_);  // with the BF16 K/V copies
  auto bits = [](const __nv_bfloat16* p) { return reinterpret_cast<const uint16_t*>(p); };
  prefill_attention_->run(l, a.block_tables, start, T, bits(a.q), bits(a.k_bf16), bits(a.v_bf16),
                          reinterpret_cast<uint16_t*>(a.attn), nullptr, stream_);
  cache_->prefill(l, a.k, a.v, stream_);
  g[StepGemmKind::o].run(a.attn, w.wo, a.delta, stream_);
  all_reduce(a.delta, T);
  ops::add_rms_norm({a.x, a.delta, w.post_norm, a.h, T, c.hidden_size, eps}, stream_);
  enqueue_mlp(w, a, T, g);
}

// A chunk whose tokens and positions are in the prefill activations: every layer, then the
// last token's final norm and LM head into the step activations' row 0.
void GpuModel::enqueue_prefill_chunk(int start, int T) {
  const model::Qwen3Config& c = config();
  Activations& a = *prefill_act_;
  const Gemms& g = prefill_gemms_for(prefill_rows(T));
  cache_->begin_prefill(a.block_tables, start, T, stream_);
  ops::embedding_gather({a.tokens, T, weights_.embed(), c.vocab_size, c.hidden_size, a.x, act_->flags,
                         slice_.first_vocab, slice_.vocab},
                        stream_);
  all_reduce(a.x, T);
  for (int l = 0; l < c.num_hidden_layers; ++l) enqueue_prefill_layer(l, start, T, g);
  const size_t last = size_t(T - 1) * c.hidden_size;
  ops::add_rms_norm({a.x + last, a.delta + last, weights_.final_norm(), act_->h, 1, c.hidden_size,
                     float(c.rms_norm_eps)},
                    stream_);
  enqueue_lm_head(gemms_for(1), act_->h, 1);
}

void GpuModel::prefill(const std::vector<int32_t>& tokens, int start, const std::vector<int32_t>& block_row) {
  require(prefill_attention_ != nullptr, "GpuModel::prefill: the model was built without prefill_chunk");
  const long long end = (long long)start + (long long)tokens.size();
  require(!tokens.empty() && start >= 0 && end <= options_.max_context,
          "GpuModel::prefill: tokens [" + std::to_string(start) + ", " + std::to_string(end) + ") outside [0, " +
              std::to_string(options_.max_context) + "] (max_context), or none");
  require(block_row.size() == size_t(max_pages()),
          "GpuModel::prefill: the block row must have max_pages = " + std::to_string(max_pages()) + " entries");
  for (int p = 0; p < pages_for(end); ++p) {
    if (block_row[size_t(p)] < 0 || block_row[size_t(p)] >= num_blocks())
      throw Error("GpuModel::prefill: block " + std::to_string(block_row[size_t(p)]) + " outside the cache's " +
                  std::to_string(num_blocks()) + " blocks");
  }
  for (int32_t t : tokens) {
    if (t < 0 || t >= config().vocab_size)
      throw Error("GpuModel::prefill: token " + std::to_string(t) + " outside the vocabulary");
  }
  gemms_for(1);  // the LM head's plan, made outside any capture
  Activations& a = *prefill_act_;
  auto h2d = [this](void* dst, const void* src, size_t bytes) {
    cuda_check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream_), "GpuModel: prefill upload");
  };
  h2d(a.block_tables, block_row.data(), block_row.size() * sizeof(int32_t));
  const int chunk = options_.prefill_chunk;
  std::vector<int32_t> positions(static_cast<size_t>(chunk));
  for (long long c0 = start; c0 < end; c0 += chunk) {
    const int T = int(std::min<long long>(chunk, end - c0));
    std::iota(positions.begin(), positions.begin() + T, int32_t(c0));
    // Pageable sources: each copy returns once its bytes are staged, so the vectors may change.
    h2d(a.tokens, tokens.data() + (c0 - start), size_t(T) * sizeof(int32_t));
    h2d(a.positions, positions.data(), size_t(T) * sizeof(int32_t));
    enqueue_prefill_chunk(int(c0), T);
  }
  last_batch_ = 1;
  last_replayed_ = false;
}

// Every step that is read back: the ops' and the cache's sticky flags (step_plan.h) in one
// copy and the one synchronization the step has anyway; messages only on failure.
void GpuModel::check_errors() const {
  int32_t* flags = staging_->flags;
  cuda_check(cudaMemcpyAsync(&flags[0], act_->flags, sizeof(int32_t), cudaMemcpyDeviceToHost, stream_),
             "GpuModel: error flags");
  cuda_check(cudaMemcpyAsync(&flags[1], cache_->plan().error_flags, sizeof(int32_t), cudaMemcpyDeviceToHost, stream_),
             "GpuModel: cache error flags");
  synchronize();
  const int32_t op_flags = flags[0], cache_flags = flags[1];
  if (op_flags == 0 && cache_flags == 0) return;
  if (op_flags & ops::kErrorTokenOutOfRange) throw Error("GpuModel: a token id outside the vocabulary reached the GPU");
  if (op_flags & ops::kErrorPositionOutOfRange) throw Error("GpuModel: a position outside the RoPE table reached the GPU");
  if (op_flags & ops::kErrorRouterLogit)
    throw Error("GpuModel: a MoE router logit was NaN or infinite (the hidden state overflowed BF16)");
  if (cache_flags & cache::kErrorSlotsExhausted)
    throw Error("GpuModel: more requests in a step than BF16 slots (max_slots " + std::to_string(options_.max_slots) +
                ")");
  if (cache_flags & cache::kErrorBadSequence) throw Error("GpuModel: a step had a bad sequence length or block id");
  if (cache_flags & cache::kErrorDuplicateRequest) throw Error("GpuModel: a request appeared twice in one step");
  throw Error("GpuModel: error flags " + std::to_string(op_flags) + " (ops), " + std::to_string(cache_flags) + " (cache)");
}

std::vector<float> GpuModel::read_logits() const {
  require(last_batch_ > 0, "GpuModel::read_logits: no step has run");
  std::vector<float> out(size_t(last_batch_) * config().vocab_size);
  cuda_check(cudaMemcpyAsync(out.data(), act_->logits, out.size() * sizeof(float), cudaMemcpyDeviceToHost, stream_),
             "GpuModel: read logits");
  check_errors();
  return out;
}

std::vector<int32_t> GpuModel::sample(const std::vector<SamplingRow>& params) {
  require(last_batch_ > 0, "GpuModel::sample: no step has run");
  if (int(params.size()) != last_batch_)  // every step: the message only on failure
    throw Error("GpuModel::sample: " + std::to_string(params.size()) + " sampling rows for a step of " +
                std::to_string(last_batch_));
  std::copy(params.begin(), params.end(), staging_->params);
  const size_t B = size_t(last_batch_);
  cuda_check(cudaMemcpyAsync(act_->params, staging_->params, B * sizeof(SamplingRow), cudaMemcpyHostToDevice, stream_),
             "GpuModel: sampling params");
  sampler_->run(act_->logits, last_batch_, act_->params, act_->sampled, stream_);
  cuda_check(cudaMemcpyAsync(staging_->sampled, act_->sampled, B * sizeof(int32_t), cudaMemcpyDeviceToHost, stream_),
             "GpuModel: sampled tokens");
  check_errors();
  return std::vector<int32_t>(staging_->sampled, staging_->sampled + B);
}

void GpuModel::release(int32_t first_block) { cache_->release(first_block, stream_); }

void GpuModel::set_cuda_graphs(bool on) {
  require_capturable(options_.collective, on);
  options_.cuda_graphs = on;
}

void GpuModel::synchronize() const { cuda_check(cudaStreamSynchronize(stream_), "GpuModel: step"); }

}  // namespace fp4kv::engine
