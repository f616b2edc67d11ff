// GPU weights of a Qwen3 model, dense or MoE (gpu_weights.h): the checkpoint loader, the random
// shapes, and the single allocation every tensor lives in.
#include "fp4kv/engine/gpu_weights.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <initializer_list>
#include <utility>

#include "fp4kv/cache/cuda_check.h"
#include "fp4kv/core/error.h"
#include "fp4kv/core/half.h"
#include "fp4kv/model/safetensors.h"
#include "fp4kv/ops/moe.h"

namespace fp4kv::engine {

namespace {

constexpr size_t kTensorAlign = 256;
constexpr float kRandomStd = 0.02f;  // weights' standard deviation (Qwen3's initializer_range)

struct NamedShape {
  const char* name;
  int vocab, hidden, intermediate, layers, heads, kv_heads, head_dim;
  bool tied;
  int max_positions, eos;
  int experts = 0, experts_per_token = 0, expert_intermediate = 0;  // Qwen3-MoE (every layer sparse)
};

// Hugging Face Qwen3 configs (head_dim 128, RoPE theta 1e6, RMSNorm eps 1e-6).
constexpr NamedShape kShapes[] = {
    {"qwen3-0.6b", 151936, 1024, 3072, 28, 16, 8, 128, true, 40960, 151645},
    {"qwen3-1.7b", 151936, 2048, 6144, 28, 16, 8, 128, true, 40960, 151645},
    {"qwen3-4b", 151936, 2560, 9728, 36, 32, 8, 128, true, 40960, 151645},
    {"qwen3-8b", 151936, 4096, 12288, 36, 32, 8, 128, false, 40960, 151645},
    {"qwen3-14b", 151936, 5120, 17408, 40, 40, 8, 128, false, 40960, 151645},
    {"qwen3-32b", 151936, 5120, 25600, 64, 64, 8, 128, false, 40960, 151645},
    {"qwen3-30b-a3b", 151936, 2048, 6144, 48, 32, 4, 128, false, 40960, 151645, 128, 8, 768},
    {"pk8l", 264, 512, 1024, 8, 8, 2, 128, true, 32768, 257},
};

size_t aligned(size_t bytes) { return (bytes + kTensorAlign - 1) / kTensorAlign * kTensorAlign; }

// Uniform in [-a, a) from a counter hash (splitmix64): the same tensor for the same seed on
// every run.
__device__ __forceinline__ float uniform_symmetric(uint64_t seed, size_t i, float amplitude) {
  uint64_t z = seed + i * 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  const float u = float(z >> 40) * (1.0f / 16777216.0f);  // [0, 1)
  return (2.0f * u - 1.0f) * amplitude;
}

// Rows of a random [..][full_cols] tensor (RandomRows): a tensor-parallel rank's slice, or a
// chunk of tokens, holds exactly the whole tensor's values there.
template <class T>
__global__ void fill_random_kernel(T* out, RandomRows p, uint64_t seed, float amplitude) {
  const size_t n = p.rows * p.cols;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    out[i] = T(uniform_symmetric(seed, p.first + (i / p.cols) * p.full_cols + i % p.cols, amplitude));
}

__global__ void fill_value_kernel(__nv_bfloat16* out, size_t n, float value) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    out[i] = __float2bfloat16(value);
}

// The tensors of one layer in allocation order, with their element counts (0: absent).
struct LayerSizes {
  size_t input_norm, post_norm, q_norm, k_norm, wqkv, wo, w_gate_up, w_down, router, experts_gate_up, experts_down;
};
// A tensor-parallel rank's (t): its heads, KV heads, MLP channels and experts; the router whole.
LayerSizes layer_sizes(const model::Qwen3Config& c, const model::TpSlice& t, int layer) {
  const size_t H = c.hidden_size, d = c.head_dim, I = t.inter;
  const size_t qkv_rows = size_t(t.heads + 2 * t.kv_heads) * d;
  LayerSizes s{H, H, d, d, qkv_rows * H, H * t.heads * d, 0, 0, 0, 0, 0};
  if (!c.is_sparse_layer(layer)) {
    s.w_gate_up = 2 * I * H;
    s.w_down = H * I;
    return s;
  }
  const size_t EI = c.moe_intermediate_size;
  s.router = size_t(c.num_experts) * H;
  s.experts_gate_up = size_t(t.experts) * 2 * EI * H;
  s.experts_down = size_t(t.experts) * H * EI;
  return s;
}
size_t layer_bytes(const LayerSizes& s) {
  size_t total = 0;
  for (size_t n : {s.input_norm, s.post_norm, s.q_norm, s.k_norm, s.wqkv, s.wo, s.w_gate_up, s.w_down, s.router,
                   s.experts_gate_up, s.experts_down})
    total += n > 0 ? aligned(2 * n) : 0;
  return total;
}

// The GPU MoE kernels' limits (ops/moe.h), checked when the weights are made.
void check_moe_supported(const model::Qwen3Config& c) {
  if (!c.is_moe()) return;
  require(c.num_experts <= ops::kMoeMaxExperts && c.num_experts_per_tok <= ops::kMoeMaxTopK,
          "GpuWeights: " + std::to_string(c.num_experts) + " experts, " + std::to_string(c.num_experts_per_tok) +
              " per token: the GPU MoE kernels take at most " + std::to_string(ops::kMoeMaxExperts) + " experts and " +
              std::to_string(ops::kMoeMaxTopK) + " per token");
  require(c.hidden_size % ops::kMoeDimMultiple == 0 && c.moe_intermediate_size % ops::kMoeDimMultiple == 0,
          "GpuWeights: hidden_size and moe_intermediate_size must be multiples of " +
              std::to_string(ops::kMoeDimMultiple) + " for the GPU MoE kernels (got " + std::to_string(c.hidden_size) +
              ", " + std::to_string(c.moe_intermediate_size) + ")");
}

// Which part of a checkpoint tensor, seen as [shape[0]][the rest]: rows [first_row, +rows)
// and, of each, columns [first_col, +cols); count 0: all of them.
struct Part {
  int64_t first_row = 0, rows = 0, first_col = 0, cols = 0;
};
Part row_part(int64_t first, int64_t count) { return {first, count, 0, 0}; }
Part col_part(int64_t first, int64_t count) { return {0, 0, first, count}; }

// Copies `part` of a checkpoint tensor (any float dtype, converted to BF16 exactly for a BF16
// source) to `dst` after checking the tensor's shape.
void upload(const model::SafetensorsArchive& archive, const std::string& name, const std::vector<int64_t>& shape,
            __nv_bfloat16* dst, Part part = {}) {
  require(archive.contains(name), "checkpoint: missing tensor '" + name + "'");
  const model::TensorInfo& info = archive.info(name);
  require(info.shape == shape, "checkpoint: tensor '" + name + "' has shape " + model::shape_string(info.shape) +
                                   ", the config needs " + model::shape_string(shape));
  const std::vector<float> values = archive.read_f32(name);
  const int64_t R = shape.empty() ? 1 : shape[0], C = int64_t(values.size()) / std::max<int64_t>(R, 1);
  const int64_t rows = part.rows == 0 ? R : part.rows, cols = part.cols == 0 ? C : part.cols;
  std::vector<uint16_t> bits(size_t(rows * cols));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c)
      bits[size_t(r * cols + c)] = float_to_bf16_bits(values[size_t((part.first_row + r) * C + part.first_col + c)]);
  cache::cuda_check(cudaMemcpy(dst, bits.data(), bits.size() * 2, cudaMemcpyHostToDevice), "load weight " + name);
}

// A sparse layer's router and the rank's experts (layer prefix `p`), from the Hub's per-expert
// tensors or transformers 5's fused ones (model/qwen3.cpp reads the same two forms).
void upload_experts(const model::SafetensorsArchive& archive, const model::Qwen3Config& c, const model::TpSlice& t,
                    const std::string& p, const GpuLayerWeights& L) {
  const int64_t E = c.num_experts, EI = c.moe_intermediate_size, H = c.hidden_size;
  auto dst = [](const __nv_bfloat16* q) { return const_cast<__nv_bfloat16*>(q); };
  upload(archive, p + "mlp.gate.weight", {E, H}, dst(L.router));
  if (archive.contains(p + "mlp.experts.gate_up_proj")) {
    upload(archive, p + "mlp.experts.gate_up_proj", {E, 2 * EI, H}, dst(L.experts_gate_up),
           row_part(t.first_expert, t.experts));
    upload(archive, p + "mlp.experts.down_proj", {E, H, EI}, dst(L.experts_down), row_part(t.first_expert, t.experts));
    return;
  }
  for (int64_t e = 0; e < t.experts; ++e) {
    const std::string x = p + "mlp.experts." + std::to_string(t.first_expert + e) + ".";
    __nv_bfloat16* gate = dst(L.experts_gate_up) + e * 2 * EI * H;
    upload(archive, x + "gate_proj.weight", {EI, H}, gate);
    upload(archive, x + "up_proj.weight", {EI, H}, gate + EI * H);
    upload(archive, x + "down_proj.weight", {H, EI}, dst(L.experts_down) + e * H * EI);
  }
}

}  // namespace

void fill_random_rows(float* out, const RandomRows& rows, uint64_t seed, float amplitude, cudaStream_t stream) {
  require(rows.cols > 0 && rows.full_cols >= rows.cols, "fill_random_rows: bad shape");
  fill_random_kernel<<<1024, 256, 0, stream>>>(out, rows, seed, amplitude);
  cache::cuda_check_launch("fill_random_rows");
}

std::vector<std::string> known_shape_names() {
  std::vector<std::string> names;
  for (const NamedShape& s : kShapes) names.push_back(s.name);
  return names;
}

model::Qwen3Config known_shape(const std::string& name) {
  for (const NamedShape& s : kShapes) {
    if (name != s.name) continue;
    model::Qwen3Config c;
    c.vocab_size = s.vocab;
    c.hidden_size = s.hidden;
    c.intermediate_size = s.intermediate;
    c.num_hidden_layers = s.layers;
    c.num_attention_heads = s.heads;
    c.num_key_value_heads = s.kv_heads;
    c.head_dim = s.head_dim;
    c.rms_norm_eps = 1e-6;
    c.rope_theta = 1e6;
    c.tie_word_embeddings = s.tied;
    c.max_position_embeddings = s.max_positions;
    c.eos_token_ids = {s.eos};
    c.num_experts = s.experts;
    c.num_experts_per_tok = s.experts_per_token;
    c.moe_intermediate_size = s.expert_intermediate;
    c.norm_topk_prob = s.experts > 0;  // Qwen3-30B-A3B's config
    return c;
  }
  std::string list;
  for (const std::string& n : known_shape_names()) list += (list.empty() ? "" : ", ") + n;
  throw Error("unknown model shape '" + name + "' (known: " + list + ")");
}

namespace {
// Random weights are for speed work: no position limit (contexts past the checkpoint's trained
// length, up to the 1M-token runs of `fp4kv bench e2e`).
model::Qwen3Config speed_only(model::Qwen3Config c) {
  c.max_position_embeddings = 0;
  return c;
}
}  // namespace

model::Qwen3Config config_of_spec(const std::string& spec) {
  std::string shape;
  if (is_random_model_spec(spec, &shape)) return speed_only(known_shape(shape));
  return model::Qwen3Config::load_dir(spec);
}

bool is_random_model_spec(const std::string& spec, std::string* shape) {
  const std::string suffix = ":random";
  if (spec.size() <= suffix.size() || spec.compare(spec.size() - suffix.size(), suffix.size(), suffix) != 0)
    return false;
  *shape = spec.substr(0, spec.size() - suffix.size());
  return true;
}

size_t GpuWeights::bytes_for(const model::Qwen3Config& config, int rank, int ranks) {
  const model::TpSlice slice = model::tp_slice(config, rank, ranks);
  const size_t V = slice.vocab, H = config.hidden_size;
  const size_t tables = config.tie_word_embeddings ? 1 : 2;
  size_t bytes = tables * aligned(2 * V * H) + aligned(2 * H);
  for (int l = 0; l < config.num_hidden_layers; ++l) bytes += layer_bytes(layer_sizes(config, slice, l));
  return bytes;
}

GpuWeights::GpuWeights(const model::Qwen3Config& config, int rank, int ranks)
    : config_(config), slice_(model::tp_slice(config, rank, ranks)) {
  check_moe_supported(config);
  const size_t V = slice_.vocab, H = config.hidden_size;
  bytes_ = bytes_for(config, rank, ranks);
  cache::cuda_check(cudaMalloc(&memory_, bytes_), "GpuWeights: " + std::to_string(bytes_) + " bytes");
  uint8_t* p = static_cast<uint8_t*>(memory_);
  auto take = [&p](size_t elements) -> const __nv_bfloat16* {
    if (elements == 0) return nullptr;
    auto* t = reinterpret_cast<__nv_bfloat16*>(p);
    p += aligned(2 * elements);
    return t;
  };
  embed_ = take(V * H);
  lm_head_ = config.tie_word_embeddings ? embed_ : take(V * H);
  final_norm_ = take(H);
  for (int l = 0; l < config.num_hidden_layers; ++l) {
    const LayerSizes ls = layer_sizes(config, slice_, l);
    GpuLayerWeights w;
    w.input_norm = take(ls.input_norm);
    w.post_norm = take(ls.post_norm);
    w.q_norm = take(ls.q_norm);
    w.k_norm = take(ls.k_norm);
    w.wqkv = take(ls.wqkv);
    w.wo = take(ls.wo);
    w.w_gate_up = take(ls.w_gate_up);
    w.w_down = take(ls.w_down);
    w.router = take(ls.router);
    w.experts_gate_up = take(ls.experts_gate_up);
    w.experts_down = take(ls.experts_down);
    layers_.push_back(w);
  }
}

size_t GpuWeights::step_read_bytes_for(const model::Qwen3Config& config, int rank, int ranks, int batch) {
  const model::TpSlice slice = model::tp_slice(config, rank, ranks);
  size_t total = bytes_for(config, rank, ranks);
  const size_t expert_bytes = size_t(3) * config.moe_intermediate_size * config.hidden_size * 2;
  const size_t held = size_t(slice.experts);
  const size_t read = std::min<size_t>(held, size_t(batch) * config.num_experts_per_tok);
  for (int l = 0; l < config.num_hidden_layers; ++l) {
    if (config.is_sparse_layer(l)) total -= (held - read) * expert_bytes;
  }
  return total;
}

size_t GpuWeights::step_read_bytes(int batch) const {
  return step_read_bytes_for(config_, slice_.rank, slice_.ranks, batch);
}

GpuWeights GpuWeights::load(const std::string& dir, int rank, int ranks) {
  const model::Qwen3Config c = model::Qwen3Config::load_dir(dir);
  const model::SafetensorsArchive archive = model::SafetensorsArchive::open_dir(dir);
  GpuWeights w(c, rank, ranks);
  const model::TpSlice& t = w.slice_;
  const int64_t V = c.vocab_size, H = c.hidden_size, d = c.head_dim, I = c.intermediate_size;
  const int64_t hq = c.num_attention_heads, hkv = c.num_key_value_heads, tq = t.heads, tkv = t.kv_heads;
  auto dst = [](const __nv_bfloat16* p) { return const_cast<__nv_bfloat16*>(p); };
  upload(archive, "model.embed_tokens.weight", {V, H}, dst(w.embed_), row_part(t.first_vocab, t.vocab));
  if (!c.tie_word_embeddings)
    upload(archive, "lm_head.weight", {V, H}, dst(w.lm_head_), row_part(t.first_vocab, t.vocab));
  upload(archive, "model.norm.weight", {H}, dst(w.final_norm_));
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    const GpuLayerWeights& L = w.layers_[size_t(l)];
    upload(archive, p + "input_layernorm.weight", {H}, dst(L.input_norm));
    upload(archive, p + "post_attention_layernorm.weight", {H}, dst(L.post_norm));
    upload(archive, p + "self_attn.q_norm.weight", {d}, dst(L.q_norm));
    upload(archive, p + "self_attn.k_norm.weight", {d}, dst(L.k_norm));
    upload(archive, p + "self_attn.q_proj.weight", {hq * d, H}, dst(L.wqkv), row_part(t.first_head * d, tq * d));
    upload(archive, p + "self_attn.k_proj.weight", {hkv * d, H}, dst(L.wqkv) + tq * d * H,
           row_part(t.first_kv_head * d, tkv * d));
    upload(archive, p + "self_attn.v_proj.weight", {hkv * d, H}, dst(L.wqkv) + (tq + tkv) * d * H,
           row_part(t.first_kv_head * d, tkv * d));
    upload(archive, p + "self_attn.o_proj.weight", {H, hq * d}, dst(L.wo), col_part(t.first_head * d, tq * d));
    if (L.sparse()) {
      upload_experts(archive, c, t, p, L);
      continue;
    }
    upload(archive, p + "mlp.gate_proj.weight", {I, H}, dst(L.w_gate_up), row_part(t.first_inter, t.inter));
    upload(archive, p + "mlp.up_proj.weight", {I, H}, dst(L.w_gate_up) + int64_t(t.inter) * H,
           row_part(t.first_inter, t.inter));
    upload(archive, p + "mlp.down_proj.weight", {H, I}, dst(L.w_down), col_part(t.first_inter, t.inter));
  }
  return w;
}

GpuWeights GpuWeights::random(const model::Qwen3Config& shape, uint64_t seed, int rank, int ranks) {
  const model::Qwen3Config config = speed_only(shape);
  GpuWeights w(config, rank, ranks);
  const model::TpSlice& t = w.slice_;
  const float amplitude = kRandomStd * kUniformAmplitudePerStd;
  // Each whole tensor has its own stream of values; a rank's slice takes its pieces of it.
  uint64_t stream_id = 0;
  auto fill = [&](const __nv_bfloat16* out, std::initializer_list<RandomRows> pieces) {
    const uint64_t tensor_seed = seed * 0x100000001B3ull + (++stream_id << 40);
    auto* p = const_cast<__nv_bfloat16*>(out);
    for (const RandomRows& piece : pieces) {
      fill_random_kernel<<<1024, 256>>>(p, piece, tensor_seed, amplitude);
      cache::cuda_check_launch("GpuWeights::random");
      p += piece.rows * piece.cols;
    }
  };
  // Rows [row0, row0 + count) of a [..][cols] tensor; columns [col0, col0 + count) of [rows][full_cols].
  auto rows = [](size_t row0, size_t count, size_t cols) { return RandomRows{count, cols, cols, row0 * cols}; };
  auto cols = [](size_t rows, size_t col0, size_t count, size_t full_cols) {
    return RandomRows{rows, count, full_cols, col0};
  };
  auto ones = [&](const __nv_bfloat16* out, size_t n) {
    fill_value_kernel<<<64, 256>>>(const_cast<__nv_bfloat16*>(out), n, 1.0f);
    cache::cuda_check_launch("GpuWeights::random");
  };
  const size_t H = config.hidden_size, d = config.head_dim, I = config.intermediate_size;
  const size_t hq = config.num_attention_heads, hkv = config.num_key_value_heads;
  const size_t tq = t.heads, tkv = t.kv_heads, EI = config.moe_intermediate_size;
  fill(w.embed_, {rows(t.first_vocab, t.vocab, H)});
  if (!config.tie_word_embeddings) fill(w.lm_head_, {rows(t.first_vocab, t.vocab, H)});
  ones(w.final_norm_, H);
  for (int l = 0; l < config.num_hidden_layers; ++l) {
    const GpuLayerWeights& L = w.layers_[size_t(l)];
    ones(L.input_norm, H);
    ones(L.post_norm, H);
    ones(L.q_norm, d);
    ones(L.k_norm, d);
    fill(L.wqkv, {rows(t.first_head * d, tq * d, H), rows((hq + t.first_kv_head) * d, tkv * d, H),
                  rows((hq + hkv + t.first_kv_head) * d, tkv * d, H)});
    fill(L.wo, {cols(H, t.first_head * d, tq * d, hq * d)});
    if (L.sparse()) {
      fill(L.router, {rows(0, config.num_experts, H)});
      fill(L.experts_gate_up, {rows(t.first_expert, t.experts, 2 * EI * H)});
      fill(L.experts_down, {rows(t.first_expert, t.experts, H * EI)});
    } else {
      fill(L.w_gate_up, {rows(t.first_inter, t.inter, H), rows(I + t.first_inter, t.inter, H)});
      fill(L.w_down, {cols(H, t.first_inter, t.inter, I)});
    }
  }
  cache::cuda_check(cudaDeviceSynchronize(), "GpuWeights::random");
  return w;
}

GpuWeights GpuWeights::from_spec(const std::string& spec, uint64_t seed, int rank, int ranks) {
  std::string shape;
  if (is_random_model_spec(spec, &shape)) return random(known_shape(shape), seed, rank, ranks);
  return load(spec, rank, ranks);
}

void GpuWeights::release() noexcept {
  if (memory_) cudaFree(memory_);
  memory_ = nullptr;
}

GpuWeights::~GpuWeights() { release(); }

GpuWeights::GpuWeights(GpuWeights&& o) noexcept
    : config_(std::move(o.config_)), slice_(o.slice_), memory_(std::exchange(o.memory_, nullptr)), bytes_(o.bytes_),
      embed_(o.embed_), final_norm_(o.final_norm_), lm_head_(o.lm_head_),
      layers_(std::move(o.layers_)) {}

GpuWeights& GpuWeights::operator=(GpuWeights&& o) noexcept {
  if (this != &o) {
    release();
    config_ = std::move(o.config_);
    slice_ = o.slice_;
    memory_ = std::exchange(o.memory_, nullptr);
    bytes_ = o.bytes_;
    embed_ = o.embed_;
    final_norm_ = o.final_norm_;
    lm_head_ = o.lm_head_;
    layers_ = std::move(o.layers_);
  }
  return *this;
}

}  // namespace fp4kv::engine
