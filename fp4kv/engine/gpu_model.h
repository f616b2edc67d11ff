// The Qwen3 decode step on the GPU over the fp4kv paged cache: for a batch of rows (one
// request each), embedding -> per layer (RMSNorm, fused QKV GEMM, QK-norm + RoPE,
// KvCache::append, DecodeAttention::run, O GEMM, residual + RMSNorm, gate/up GEMM, SwiGLU,
// down GEMM) -> final norm -> LM head (FP32 logits) -> the GPU sampler.
//
// Step shape: a step is enqueued on the model's own stream with no host synchronization; with
// `cuda_graphs` it is captured once per batch size (the cache's control kernel treats every
// row as a live request, so a graph is exact for one batch size: no padding rows) and
// replayed. Host inputs go through pinned staging buffers; a step waits only for the
// previous step's uploads before overwriting them. Reading logits or sampled tokens
// synchronizes and checks the step's device error flags (ops and cache), throwing
// fp4kv::Error naming what went wrong.
//
// Prefill, two ways: (1) as decode steps, one token per step per request (the semantics of
// the CPU eval and generator: every query position attends as a decode step over the
// quantized pages and BF16 sink/recent rows its cache holds at that moment); (2) prefill():
// chunks of up to options().prefill_chunk tokens of one request through the same layers with
// M-row GEMMs and the tensor-core prefill attention (each chunk attends to the cached prefix
// and, causally in BF16, to itself: ref/prefill_attention.h), what serving uses.
//
// Tensor parallelism: with weights of rank r's slice (gpu_weights.h) and r's member of a
// DeviceCollective group (options.collective), the model is that rank: its heads' attention
// over a cache of its KV heads, its MLP channels or experts, its vocabulary rows; the O and MLP
// outputs and the embedding are all-reduced (BF16) and the LM head's logits all-gathered, so
// every rank ends a step with the whole [batch][vocab] logits and samples the same tokens.
// Every rank must be given the same calls in the same order (TensorParallelModel does that).
//
// Invariants: one GpuModel per device and recipe (per rank); the weights outlive it; a
// request is its block-table row (block_tables[r][0] names it in the cache, kv_cache.h).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "fp4kv/attention/decode.h"
#include "fp4kv/attention/prefill.h"
#include "fp4kv/cache/kv_cache.h"
#include "fp4kv/core/recipe.h"
#include "fp4kv/core/sampling_rule.h"
#include "fp4kv/engine/device_collective.h"
#include "fp4kv/engine/gpu_weights.h"
#include "fp4kv/engine/step_model.h"
#include "fp4kv/ops/gemm.h"
#include "fp4kv/ops/qk_norm_rope.h"
#include "fp4kv/ops/sampling.h"

namespace fp4kv::engine {

// Where a step's time goes (GpuModel::profile_step): the cuBLASLt GEMMs (QKV, O, gate/up,
// down, LM head), decode attention (decode + combine kernels), the cache's own work (control
// kernel, QK-norm + RoPE with the append fused in, promotion), the tensor-parallel
// collectives (all-reduces, the logits' gather) and everything else (embedding, norms,
// SwiGLU; QK-norm + RoPE alone when the step does not update the cache).
enum class StepPart { gemm, attention, cache, collective, other };
inline constexpr int kStepParts = 5;
inline const char* step_part_name(StepPart p) {
  constexpr const char* kNames[kStepParts] = {"gemm", "attention", "cache", "collective", "other"};
  return kNames[int(p)];
}
struct StepProfile {
  double us[kStepParts] = {};  // eager step, CUDA events between consecutive ops, summed per part
  double total_us = 0;
};

// GPU memory kept free beside the KV cache for activations, cuBLASLt workspaces and graphs.
inline constexpr long long kGpuActivationReserveBytes = 1LL << 30;

// The KV budget that `utilization` of the device's memory leaves after what is in use now
// (the weights, loaded first) and the activation reserve; 0 when nothing is left. Throws
// fp4kv::Error for a utilization outside (0, 1].
long long gpu_kv_budget(double utilization);

// GpuModelOptions::prefill_chunk for a model: `chunk` where the prefill kernel has the model's
// head size, else 0 (its prompts then run as decode steps).
int prefill_chunk_for(const model::Qwen3Config& c, int chunk);

// How the decode step's GEMM plans are chosen per batch size.
enum class GemmPlans {
  // cuBLASLt's heuristic first choice: the same bits on every run of a command.
  heuristic,
  // The fastest of the heuristic's candidates and our GEMV, timed on the model's weights
  // (ops::Gemm::tune): a choice that can differ between runs, and with it the last bits of the
  // logits (so a greedy near-tie). What the benchmarks measure.
  tuned,
  // Our GEMV wherever it applies (batch <= 8), else the heuristic's choice: the GEMV path
  // without timing (tests, A/B runs). A row's sums are then the same at every batch size from
  // 1 to 3 (W staged in shared memory) and from 4 to 8 (W in registers; ops/gemv.h).
  gemv,
};

struct GpuModelOptions {
  int max_batch = 1;         // rows of a step
  int max_context = 0;       // tokens of one request (0: the model's max_position_embeddings)
  int num_blocks = 0;        // cache blocks per layer (0: max_batch requests of max_context)
  int max_slots = 0;         // requests holding BF16 slots (0: max_batch)
  bool cuda_graphs = true;   // capture each batch size's step once and replay it
  GemmPlans gemm_plans = GemmPlans::heuristic;
  // Tokens per chunk of the tensor-core prefill (prefill(); attention/prefill.h), 0: none
  // (prompts then go through step(), one token per step, as the eval's semantics need).
  int prefill_chunk = 0;
  // Tensor parallelism: this rank's member of its group (its ranks and rank must be the
  // weights' slice's); null for one GPU. A group that cannot be captured needs cuda_graphs off.
  DeviceCollective* collective = nullptr;
};

// One step's rows, host side. Row r feeds tokens[r] at position seq_lens[r] - 1 of the
// request whose block table is block_tables[r * max_pages() ...] (seq_lens include it).
struct StepRows {
  std::vector<int32_t> tokens;
  std::vector<int32_t> seq_lens;
  std::vector<int32_t> block_tables;
  int batch() const { return int(tokens.size()); }
};

// The decode-attention geometry of a model's layers (of a tensor-parallel rank's heads).
inline attention::DecodeGeometry decode_geometry(const model::Qwen3Config& c) {
  return {c.num_attention_heads, c.num_key_value_heads, c.head_dim};
}
inline attention::DecodeGeometry decode_geometry(const model::Qwen3Config& c, const model::TpSlice& s) {
  return {s.heads, s.kv_heads, c.head_dim};
}
// Throws fp4kv::Error unless the GPU has a decode kernel for `recipe` on this model's shape
// (DecodeAttention::check_supported; no CUDA call): for checks before anything loads.
inline void check_gpu_recipe(const model::Qwen3Config& c, const Recipe& recipe) {
  attention::DecodeAttention::check_supported(decode_geometry(c), recipe, attention::DecodeCapacity{1, 1, 1});
}

// The weight GEMMs of a decode step (of the weights' slice): each one's shape at `batch` rows
// and the matrices a step multiplies with it (every layer's, in layer order; the LM head's
// one). The dense MLP's GEMMs exist only with a dense layer, the router's only with a sparse
// (MoE) one.
enum class StepGemmKind { qkv, o, gate_up, down, router, lm_head };
inline constexpr int kStepGemmKinds = 6;
struct StepGemm {
  StepGemmKind kind;
  const char* name;
  ops::GemmShape shape;
  std::vector<const __nv_bfloat16*> weights;
};
std::vector<StepGemm> step_gemms(const GpuWeights& weights, int batch);

// Rows of `batch` requests where request r owns blocks [r * max_pages, (r + 1) * max_pages),
// every row feeding `token` with sequence length `seq_len`.
StepRows consecutive_rows(int batch, int max_pages, int seq_len = 1, int token = 0);

class GpuModel final : public StepModel {
 public:
  // mu_k: host [layers][kv_heads][head_dim] (the recipe's key smoothing, the whole model's
  // KV heads) or null. Throws fp4kv::Error for an unsupported recipe/shape
  // (DecodeAttention::check_supported) or bad options, before allocating.
  GpuModel(const GpuWeights& weights, const Recipe& recipe, const float* mu_k, const GpuModelOptions& options);
  ~GpuModel() override;
  GpuModel(const GpuModel&) = delete;
  GpuModel& operator=(const GpuModel&) = delete;

  // Enqueues one step (asynchronous). Throws fp4kv::Error for a bad row (token, length,
  // block id) the host can see. The first step of a batch size makes its GEMM plans (and
  // tunes them with GemmPlans::tuned) and captures its graph.
  void step(const StepRows& rows) override;
  // What the first step of each batch size 1..max_batch would do, done now (GEMM plans, their
  // tuning, the step graphs), so that no later step pays it: a server before it serves, a
  // benchmark before it times. Synchronizes. Throws fp4kv::Error for max_batch outside
  // [1, options().max_batch].
  void prepare_steps(int max_batch) override;
  // Prompt tokens [start, start + tokens.size()) of the request whose block table row is
  // `block_row` (max_pages() entries, covering every page up to the last token) through the
  // tensor-core prefill, in chunks of options().prefill_chunk; the last token's logits become
  // the last step's (batch 1: read_logits, sample). Asynchronous. Throws fp4kv::Error without
  // prefill_chunk or for a bad token, length or block id.
  void prefill(const std::vector<int32_t>& tokens, int start, const std::vector<int32_t>& block_row) override;
  // The last step's logits [batch][vocab] (synchronizes, checks the error flags).
  std::vector<float> read_logits() const override;
  // Draws one token per row of the last step with params[r] (synchronizes, checks flags).
  std::vector<int32_t> sample(const std::vector<SamplingRow>& params) override;
  // Runs the step of `rows` eagerly with a CUDA event after every op and returns the time of
  // each part (synchronizes). For benchmarks: the events add a little time of their own.
  StepProfile profile_step(const StepRows& rows) override;
  // Speed work without a real prompt: writes tokens [first, first + count) of random K and V
  // (uniform, a function of (seed, layer, absolute position): the same cache bytes however
  // the range is cut into chunks) through the cache's real prefill and quantization path,
  // into every layer, for each row of `rows` (its block table; tokens and seq_lens are
  // ignored), in chunks of at most `chunk` tokens. Synchronizes.
  void fill_random_tokens(const StepRows& rows, int first, int count, uint64_t seed, int chunk) override;
  using StepModel::fill_random_tokens;
  // Turns the cache's own work of a step (control kernel, append, promotion) off or on, for
  // measuring what it costs (`fp4kv bench e2e`): with it off, a step replays the plan of the
  // previous step of the same rows and writes nothing to the cache. Never off in serving.
  void set_cache_updates(bool on) override { cache_updates_ = on; }
  // Frees the BF16 slot of the request whose first block is `first_block` (asynchronous).
  void release(int32_t first_block) override;
  // Turns graph capture/replay on or off for later steps (eager steps for comparison).
  void set_cuda_graphs(bool on) override;
  // Waits for the stream.
  void synchronize() const override;
  // Synchronizes and throws fp4kv::Error naming what the last step's device error flags (ops
  // and cache) report; read_logits and sample include it.
  void check_errors() const;

  const model::Qwen3Config& config() const override { return weights_.config(); }
  const GpuModelOptions& options() const override { return options_; }
  int max_pages() const override { return cache_->config().max_pages; }
  int num_blocks() const override { return cache_->config().num_blocks; }
  const cache::KvCache& cache() const { return *cache_; }
  cudaStream_t stream() const override { return stream_; }
  // Whether the last step ran as a replayed graph.
  bool last_step_replayed() const override { return last_replayed_; }

 private:
  struct Activations;  // device buffers of one step, sized for max_batch
  struct Gemms;        // the cuBLASLt plans of one batch size
  struct Staging;      // pinned host buffers of the step inputs

  void check_rows(const StepRows& rows) const;
  void upload(const StepRows& rows);
  void enqueue_step(int batch);
  void enqueue_input_norm(int layer, Activations& a, int rows);
  void enqueue_layer(int layer, int batch, const Gemms& g);
  void enqueue_qk_norm_rope_append(int layer, int batch);
  void enqueue_mlp(const GpuLayerWeights& w, Activations& a, int rows, const Gemms& g);
  void enqueue_moe(const GpuLayerWeights& w, Activations& a, int rows, const Gemms& g);
  void enqueue_prefill_chunk(int start, int tokens);
  // The rows of x summed over the tensor-parallel ranks (nothing on one GPU).
  void all_reduce(__nv_bfloat16* x, int rows);
  // Logits [rows][vocab] of the normed rows `h` into act_->logits (the ranks' slices gathered).
  void enqueue_lm_head(const Gemms& g, const __nv_bfloat16* h, int rows);
  static ops::QkNormRopeArgs qk_norm_rope_args(const model::Qwen3Config& c, const model::TpSlice& s,
                                               const GpuLayerWeights& w, const Activations& a, int tokens,
                                               int32_t* flags);
  void enqueue_prefill_layer(int layer, int start, int tokens, const Gemms& g);
  Gemms& gemms_for(int batch);
  cudaGraphExec_t step_graph(int batch);
  Gemms& prefill_gemms_for(int rows);
  struct TuningOperands {
    const __nv_bfloat16* x;
    void* y;
  };
  TuningOperands tuning_operands(StepGemmKind kind) const;
  void mark(StepPart part);  // records a profiling event when profile_step is running

  // profile_step's events, in order, each with the part of the op it ends.
  std::vector<std::pair<cudaEvent_t, StepPart>>* marks_ = nullptr;

  const GpuWeights& weights_;
  const model::TpSlice& slice_;  // the weights' (the whole model on one GPU)
  Recipe recipe_;
  GpuModelOptions options_;
  cudaStream_t stream_ = nullptr;
  std::unique_ptr<cache::KvCache> cache_;
  std::unique_ptr<attention::DecodeAttention> attention_;
  std::unique_ptr<attention::PrefillAttention> prefill_attention_;  // with prefill_chunk
  std::unique_ptr<Activations> prefill_act_;                        // rows: prefill_chunk rounded up
  std::map<int, std::unique_ptr<Gemms>> prefill_gemms_;             // untuned plans per row count
  std::unique_ptr<ops::Sampler> sampler_;
  std::unique_ptr<Activations> act_;
  std::unique_ptr<Staging> staging_;
  std::map<int, std::unique_ptr<Gemms>> gemms_;
  std::map<int, cudaGraphExec_t> graphs_;  // key: batch * 2 + (cache updates on)
  bool cache_updates_ = true;
  cudaEvent_t uploaded_ = nullptr;  // the last step's host-to-device copies are done
  int last_batch_ = 0;
  bool last_replayed_ = false;
};

}  // namespace fp4kv::engine
