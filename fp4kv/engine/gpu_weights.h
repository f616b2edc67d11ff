// A Qwen3 model's weights on the GPU (dense, or Qwen3-MoE), in the checkpoint's BF16, laid
// out for the engine's fused GEMMs: per layer the q, k and v projections stacked into one
// [(q_heads + 2 kv_heads) head_dim][hidden] matrix and gate/up into one [2 intermediate][hidden]
// matrix (the row orders ops/qk_norm_rope.h and ops/swiglu.h read); a sparse MoE layer has
// instead its router and every expert's gate/up and down stacked as ops/moe.h reads them.
// Tied embeddings share one table for the embedding gather and the LM head.
//
// Two sources: a Hugging Face checkpoint directory (config.json + safetensors, every tensor
// name and shape checked), or random weights of a named shape built on the GPU
// (`qwen3-4b:random`): speed work only, their text is noise.
//
// Tensor parallelism: rank r of N holds its slice (model/tensor_parallel.h): the rows of its
// heads, KV heads and MLP channels in wqkv and w_gate_up (in the same stacked order), their
// columns of wo and w_down, its experts whole (the router whole), its vocabulary rows of the
// embedding and LM head; norms whole. Random weights of a slice are the whole model's values
// there. config() stays the whole model's; slice() says what this object holds.
//
// Invariants: one device allocation owns every tensor (each 256-byte aligned); the object is
// move-only and frees it on destruction.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "fp4kv/model/qwen3_config.h"
#include "fp4kv/model/tensor_parallel.h"

namespace fp4kv::engine {

// The Qwen3 shapes `NAME:random` accepts: qwen3-0.6b, -1.7b, -4b, -8b, -14b, -32b, the MoE
// qwen3-30b-a3b, and pk8l (the embedded model's shape).
std::vector<std::string> known_shape_names();
// Throws fp4kv::Error listing the known names for an unknown one.
model::Qwen3Config known_shape(const std::string& name);
// "NAME:random" -> true and *shape = NAME; anything else -> false.
bool is_random_model_spec(const std::string& spec, std::string* shape);
// The config of `spec` (a checkpoint directory or NAME:random) without loading any weight; a
// random shape's as GpuWeights::random makes it (no position limit). Throws fp4kv::Error as
// Qwen3Config::load_dir or known_shape do.
model::Qwen3Config config_of_spec(const std::string& spec);

// A uniform distribution on [-a, a) has standard deviation a / sqrt(3).
inline constexpr float kUniformAmplitudePerStd = 1.7320508f;  // sqrt(3)

// Rows of a random matrix [..][full_cols]: out[r][c] = uniform in [-amplitude, amplitude), a
// hash of (seed, first + r * full_cols + c), on the device (random cache contents for speed
// work): an element has the same value however a tensor is cut into calls or ranks.
struct RandomRows {
  size_t rows = 1, cols = 0, full_cols = 0, first = 0;
};
void fill_random_rows(float* out, const RandomRows& rows, uint64_t seed, float amplitude, cudaStream_t stream);

// Shapes of a slice (whole model: the config's counts): q_heads, kv_heads, intermediate and
// held experts are the slice's, `experts` in the router the whole model's.
struct GpuLayerWeights {
  const __nv_bfloat16* input_norm = nullptr;  // [hidden]
  const __nv_bfloat16* post_norm = nullptr;   // [hidden]
  const __nv_bfloat16* q_norm = nullptr;      // [head_dim]
  const __nv_bfloat16* k_norm = nullptr;      // [head_dim]
  const __nv_bfloat16* wqkv = nullptr;        // [(q_heads + 2 kv_heads) head_dim][hidden]
  const __nv_bfloat16* wo = nullptr;          // [hidden][q_heads head_dim]
  const __nv_bfloat16* w_gate_up = nullptr;   // dense MLP: [2 intermediate][hidden]
  const __nv_bfloat16* w_down = nullptr;      // dense MLP: [hidden][intermediate]
  // A sparse (MoE) layer's block instead of the dense MLP; null in a dense layer.
  const __nv_bfloat16* router = nullptr;           // [experts][hidden]
  const __nv_bfloat16* experts_gate_up = nullptr;  // [held experts][2 moe_intermediate][hidden]
  const __nv_bfloat16* experts_down = nullptr;     // [held experts][hidden][moe_intermediate]
  bool sparse() const { return router != nullptr; }
};

class GpuWeights {
 public:
  // Loads <dir>/config.json and its safetensors (rank `rank` of `ranks`' slice) onto the
  // current device. Throws fp4kv::Error naming a missing tensor or a wrong shape, a model that
  // does not split over `ranks`, or the failed CUDA call.
  static GpuWeights load(const std::string& dir, int rank = 0, int ranks = 1);
  // Random weights of `config`'s shape (uniform, std 0.02; norms 1), drawn on the device
  // from `seed`. Their config has no position limit (max_position_embeddings 0): speed work
  // runs them at any context.
  static GpuWeights random(const model::Qwen3Config& config, uint64_t seed, int rank = 0, int ranks = 1);
  // `spec` is a checkpoint directory or NAME:random.
  static GpuWeights from_spec(const std::string& spec, uint64_t seed = 1, int rank = 0, int ranks = 1);

  ~GpuWeights();
  GpuWeights(GpuWeights&& other) noexcept;
  GpuWeights& operator=(GpuWeights&& other) noexcept;
  GpuWeights(const GpuWeights&) = delete;
  GpuWeights& operator=(const GpuWeights&) = delete;

  const model::Qwen3Config& config() const { return config_; }
  const model::TpSlice& slice() const { return slice_; }
  const GpuLayerWeights& layer(int l) const { return layers_[size_t(l)]; }
  const __nv_bfloat16* embed() const { return embed_; }        // [slice vocab][hidden]
  const __nv_bfloat16* final_norm() const { return final_norm_; }  // [hidden]
  const __nv_bfloat16* lm_head() const { return lm_head_; }    // [slice vocab][hidden] (embed() when tied)
  size_t bytes() const { return bytes_; }
  // bytes() of rank `rank` of `ranks`' slice of `config`, before loading anything.
  static size_t bytes_for(const model::Qwen3Config& config, int rank = 0, int ranks = 1);
  // The least a decode step of `batch` rows reads: every tensor but the experts, and per
  // sparse layer min(experts, batch x top_k) experts (all of bytes() for a dense model).
  size_t step_read_bytes(int batch) const;
  static size_t step_read_bytes_for(const model::Qwen3Config& config, int rank, int ranks, int batch);

 private:
  GpuWeights(const model::Qwen3Config& config, int rank, int ranks);  // allocates and assigns every tensor
  void release() noexcept;

  model::Qwen3Config config_;
  model::TpSlice slice_;
  void* memory_ = nullptr;
  size_t bytes_ = 0;
  const __nv_bfloat16* embed_ = nullptr;
  const __nv_bfloat16* final_norm_ = nullptr;
  const __nv_bfloat16* lm_head_ = nullptr;
  std::vector<GpuLayerWeights> layers_;
};

}  // namespace fp4kv::engine
