#include "fp4kv/model/qwen3.h"

#include <cblas.h>

#include <algorithm>
#include <bit>
#include <cstdint>
#include <cmath>
#include <filesystem>

#include "fp4kv/core/error.h"
#include "fp4kv/core/parallel.h"
#include "fp4kv/model/mlp.h"
#include "fp4kv/model/moe.h"
#include "fp4kv/model/safetensors.h"

namespace fp4kv::model {

namespace {


// transformers' Qwen3RMSNorm in float32: weight * (x * rsqrt(mean(x^2) + eps)).
void rms_norm(const float* x, const float* weight, int n, float eps, float* out) {
  double ss = 0;
  for (int i = 0; i < n; ++i) ss += double(x[i] * x[i]);
  const float r = 1.0f / std::sqrt(float(ss / n) + eps);
  for (int i = 0; i < n; ++i) out[i] = weight[i] * (x[i] * r);
}

// HF rotate_half RoPE, in place: pairs (i, i + d/2) rotate by angle i of this position.
void rope(float* x, const float* cos_t, const float* sin_t, int half) {
  for (int i = 0; i < half; ++i) {
    const float x1 = x[i], x2 = x[i + half];
    x[i] = x1 * cos_t[i] - x2 * sin_t[i];
    x[i + half] = x2 * cos_t[i] + x1 * sin_t[i];
  }
}

// exp(x) for x <= 0, within 1 ulp of expf (Cephes polynomial); 0 below -87. Softmax is
// a large share of long-context attention, and this form vectorizes: it selects with
// integer masks only, so no float comparison blocks if-conversion under strict IEEE flags.
inline float exp_nonpositive(float x) {
  const uint32_t under = 0u - uint32_t((std::bit_cast<uint32_t>(x) & 0x7fffffffu) > 0x42ae0000u);  // |x| > 87
  const float xc = std::bit_cast<float>((0xc2ae0000u & under) | (std::bit_cast<uint32_t>(x) & ~under));
  const float t = xc * 1.44269504088896341f + 12582912.0f;  // k = round(x / ln 2), via 1.5 * 2^23
  const float k = t - 12582912.0f;
  const float r = (xc - k * 0.693359375f) - k * -2.12194440e-4f;  // x - k ln 2, ln 2 in two parts
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float y = p * (r * r) + r + 1.0f;
  const uint32_t two_k = uint32_t(std::bit_cast<int32_t>(t) - 0x4B400000 + 127) << 23;
  return y * std::bit_cast<float>(two_k & ~under);
}

// A float's order as an int32 (NaN aside): the max over a row then vectorizes too.
inline int32_t order_key(float x) {
  const int32_t b = std::bit_cast<int32_t>(x);
  return b ^ ((b >> 31) & 0x7fffffff);
}
inline float from_order_key(int32_t k) { return std::bit_cast<float>(k ^ ((k >> 31) & 0x7fffffff)); }

// Softmax over row[0, n_valid) in place (sum in double); row[n_valid, n) -> 0.
void softmax_causal_row(float* row, int n_valid, int n) {
  int32_t mk = order_key(row[0]);
  for (int j = 1; j < n_valid; ++j) mk = std::max(mk, order_key(row[j]));
  const float m = from_order_key(mk);
  for (int j = 0; j < n_valid; ++j) row[j] = exp_nonpositive(row[j] - m);
  double lanes[8] = {};  // independent partial sums vectorize; one running sum would not
  int j = 0;
  for (; j + 8 <= n_valid; j += 8) {
    for (int u = 0; u < 8; ++u) lanes[u] += row[j + u];
  }
  double sum = 0;
  for (; j < n_valid; ++j) sum += row[j];
  for (double s : lanes) sum += s;
  const float inv = float(1.0 / sum);
  for (j = 0; j < n_valid; ++j) row[j] *= inv;
  std::fill(row + n_valid, row + n, 0.0f);
}

// Query rows t in [0, Lq) of every head sit at absolute positions pos0 + t and see keys
// 0..pos0 + t of a K/V store laid out [kv_heads][kv_stride][d]. Rows go in blocks, so that
// the score matrix of a block (and the work above the causal diagonal) stays small.
void causal_attention(const float* q, const float* k, const float* v, int heads, int kv_heads, int Lq, int pos0,
                      int64_t kv_stride, int d, float* out) {
  require(heads > 0 && kv_heads > 0 && heads % kv_heads == 0,
          "attention: heads " + std::to_string(heads) + " must be a positive multiple of kv_heads " +
              std::to_string(kv_heads));
  require(Lq >= 0 && pos0 >= 0 && d > 0 && pos0 + Lq <= kv_stride, "attention: bad sizes");
  if (Lq == 0) return;
  const int group = heads / kv_heads;
  const float scale = float(1.0 / std::sqrt(double(d)));
  constexpr int kBlock = 256;
  const int block = std::min(kBlock, Lq);
  std::vector<float> scores(size_t(block) * size_t(pos0 + Lq));
  for (int h = 0; h < heads; ++h) {
    const float* kh = k + size_t(h / group) * size_t(kv_stride) * d;
    const float* vh = v + size_t(h / group) * size_t(kv_stride) * d;
    for (int r0 = 0; r0 < Lq; r0 += block) {
      const int rows = std::min(block, Lq - r0);
      const int nk = pos0 + r0 + rows;  // keys the last row of the block sees
      const size_t qoff = (size_t(h) * Lq + r0) * d;
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, nk, d, scale, q + qoff, d, kh, d, 0.0f,
                  scores.data(), nk);
      parallel_for_chunks(rows, std::max(1, 32768 / nk), [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) softmax_causal_row(scores.data() + i * nk, pos0 + r0 + int(i) + 1, nk);
      });
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, d, nk, 1.0f, scores.data(), nk, vh, d, 0.0f,
                  out + qoff, d);
    }
  }
}

int argmax(const float* x, int n) { return int(std::max_element(x, x + n) - x); }

// Whether layer prefix `p`'s experts are stored fused (transformers >= 5 in memory:
// mlp.experts.gate_up_proj [experts][2 moe_intermediate][hidden], mlp.experts.down_proj) rather
// than per expert as the Hub's checkpoints are.
bool fused_experts(const SafetensorsArchive& archive, const std::string& p) {
  return archive.contains(p + "mlp.experts.gate_up_proj");
}

}  // namespace

void exact_causal_attention(const float* q, const float* k, const float* v, int heads, int kv_heads, int L,
                            int d, float* out) {
  causal_attention(q, k, v, heads, kv_heads, L, 0, L, d, out);
}

Qwen3Model Qwen3Model::load(const std::string& dir) {
  namespace fs = std::filesystem;
  if (!fs::is_directory(dir)) throw Error("model directory " + dir + " does not exist");
  Qwen3Model m;
  m.config_ = Qwen3Config::load_dir(dir);
  const Qwen3Config& c = m.config_;
  const SafetensorsArchive archive = SafetensorsArchive::open_dir(dir);

  // The exact set of tensors this config implies, with shapes.
  const int64_t H = c.hidden_size, I = c.intermediate_size, V = c.vocab_size, d = c.head_dim;
  const int64_t nq = c.num_attention_heads, nkv = c.num_key_value_heads;
  std::map<std::string, std::vector<int64_t>> expected;
  expected["model.embed_tokens.weight"] = {V, H};
  expected["model.norm.weight"] = {H};
  if (!c.tie_word_embeddings) expected["lm_head.weight"] = {V, H};
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    expected[p + "input_layernorm.weight"] = {H};
    expected[p + "post_attention_layernorm.weight"] = {H};
    expected[p + "self_attn.q_proj.weight"] = {nq * d, H};
    expected[p + "self_attn.k_proj.weight"] = {nkv * d, H};
    expected[p + "self_attn.v_proj.weight"] = {nkv * d, H};
    expected[p + "self_attn.o_proj.weight"] = {H, nq * d};
    expected[p + "self_attn.q_norm.weight"] = {d};
    expected[p + "self_attn.k_norm.weight"] = {d};
    if (!c.is_sparse_layer(l)) {
      expected[p + "mlp.gate_proj.weight"] = {I, H};
      expected[p + "mlp.up_proj.weight"] = {I, H};
      expected[p + "mlp.down_proj.weight"] = {H, I};
      continue;
    }
    const int64_t E = c.num_experts, EI = c.moe_intermediate_size;
    expected[p + "mlp.gate.weight"] = {E, H};
    if (fused_experts(archive, p)) {  // transformers >= 5 in memory: one tensor per projection
      expected[p + "mlp.experts.gate_up_proj"] = {E, 2 * EI, H};
      expected[p + "mlp.experts.down_proj"] = {E, H, EI};
    } else {  // the Hub's checkpoints: one tensor per expert and projection
      for (int64_t e = 0; e < E; ++e) {
        const std::string x = p + "mlp.experts." + std::to_string(e) + ".";
        expected[x + "gate_proj.weight"] = {EI, H};
        expected[x + "up_proj.weight"] = {EI, H};
        expected[x + "down_proj.weight"] = {H, EI};
      }
    }
  }

  // Report every mismatch at once: a renamed tensor shows up as one missing and one extra.
  std::vector<std::string> problems;
  for (const auto& [name, shape] : expected) {
    if (!archive.contains(name)) {
      problems.push_back("missing tensor '" + name + "' (expected shape " + shape_string(shape) + ")");
    } else if (archive.info(name).shape != shape) {
      problems.push_back("tensor '" + name + "' has shape " + shape_string(archive.info(name).shape) +
                         " but expected shape " + shape_string(shape));
    }
  }
  for (const std::string& name : archive.names()) {
    if (expected.count(name) == 0) {
      std::string why = std::string("not part of ") + (c.is_moe() ? "Qwen3MoeForCausalLM" : "Qwen3ForCausalLM") +
                        " with this config";
      if (name == "lm_head.weight") why = "tie_word_embeddings is true";
      problems.push_back("unexpected tensor '" + name + "' with shape " + shape_string(archive.info(name).shape) +
                         " (" + why + ")");
    }
  }
  if (!problems.empty()) {
    std::string msg = "checkpoint " + dir + " does not match its config:";
    const size_t shown = std::min<size_t>(problems.size(), 8);
    for (size_t i = 0; i < shown; ++i) msg += "\n  " + problems[i];
    if (problems.size() > shown) msg += "\n  ... and " + std::to_string(problems.size() - shown) + " more";
    throw Error(msg);
  }

  auto read = [&](const std::string& name) {
    std::vector<float> w = archive.read_f32(name);
    for (float x : w) {
      if (!std::isfinite(x)) throw Error("checkpoint " + dir + ": tensor '" + name + "' holds NaN or Inf");
    }
    return w;
  };
  auto stack = [&](const std::vector<std::string>& names) {
    std::vector<float> out;
    for (const std::string& n : names) {
      const std::vector<float> w = read(n);
      out.insert(out.end(), w.begin(), w.end());
    }
    return out;
  };
  m.embed_ = read("model.embed_tokens.weight");
  m.final_norm_ = read("model.norm.weight");
  if (!c.tie_word_embeddings) m.lm_head_ = read("lm_head.weight");
  m.layers_.resize(size_t(c.num_hidden_layers));
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    Layer& L = m.layers_[size_t(l)];
    L.input_norm = read(p + "input_layernorm.weight");
    L.post_norm = read(p + "post_attention_layernorm.weight");
    L.q_norm = read(p + "self_attn.q_norm.weight");
    L.k_norm = read(p + "self_attn.k_norm.weight");
    L.wqkv = stack({p + "self_attn.q_proj.weight", p + "self_attn.k_proj.weight", p + "self_attn.v_proj.weight"});
    L.wo = read(p + "self_attn.o_proj.weight");
    if (!c.is_sparse_layer(l)) {
      L.w_gate_up = stack({p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight"});
      L.w_down = read(p + "mlp.down_proj.weight");
      continue;
    }
    L.router = read(p + "mlp.gate.weight");
    if (fused_experts(archive, p)) {
      L.expert_gate_up = read(p + "mlp.experts.gate_up_proj");
      L.expert_down = read(p + "mlp.experts.down_proj");
    } else {
      std::vector<std::string> gate_up, down;
      for (int e = 0; e < c.num_experts; ++e) {
        const std::string x = p + "mlp.experts." + std::to_string(e) + ".";
        gate_up.push_back(x + "gate_proj.weight");
        gate_up.push_back(x + "up_proj.weight");
        down.push_back(x + "down_proj.weight");
      }
      L.expert_gate_up = stack(gate_up);
      L.expert_down = stack(down);
    }
  }

  m.tp_ = tp_slice(c, 0, 1);
  // transformers (default RoPE): inv_freq = 1 / base^(arange(0, d, 2).float() / d), all float32.
  m.inv_freq_.resize(size_t(d / 2));
  for (int64_t i = 0; i < d / 2; ++i) {
    m.inv_freq_[size_t(i)] = 1.0f / std::pow(float(c.rope_theta), float(2 * i) / float(d));
  }
  return m;
}

int64_t Qwen3Model::parameter_count() const {
  int64_t n = int64_t(embed_.size() + final_norm_.size() + lm_head_.size());
  for (const Layer& L : layers_) {
    n += int64_t(L.input_norm.size() + L.post_norm.size() + L.q_norm.size() + L.k_norm.size() + L.wqkv.size() +
                 L.wo.size() + L.w_gate_up.size() + L.w_down.size() + L.router.size() + L.expert_gate_up.size() +
                 L.expert_down.size());
  }
  return n;
}

Qwen3Model Qwen3Model::shard(Collective& group) const {
  if (group_ != nullptr) throw Error("Qwen3Model::shard: this model is a shard already");
  const Qwen3Config& c = config_;
  Qwen3Model m;
  m.config_ = c;
  m.tp_ = tp_slice(c, group.rank(), group.ranks());
  m.group_ = &group;
  m.inv_freq_ = inv_freq_;
  m.final_norm_ = final_norm_;
  const TpSlice& t = m.tp_;
  const int H = c.hidden_size, d = c.head_dim, nq = c.num_attention_heads, nkv = c.num_key_value_heads;
  m.embed_ = slice_rows(embed_, H, t.first_vocab, t.vocab);
  if (!lm_head_.empty()) m.lm_head_ = slice_rows(lm_head_, H, t.first_vocab, t.vocab);
  m.layers_.resize(layers_.size());
  for (size_t l = 0; l < layers_.size(); ++l) {
    const Layer& W = layers_[l];
    Layer& S = m.layers_[l];
    S.input_norm = W.input_norm;
    S.post_norm = W.post_norm;
    S.q_norm = W.q_norm;
    S.k_norm = W.k_norm;
    // QKV (column-parallel): the rank's query heads, then its KV heads' keys and values.
    S.wqkv = slice_rows(W.wqkv, H, t.first_head * d, t.heads * d);
    for (int part : {nq, nq + nkv}) {
      const std::vector<float> kv = slice_rows(W.wqkv, H, (part + t.first_kv_head) * d, t.kv_heads * d);
      S.wqkv.insert(S.wqkv.end(), kv.begin(), kv.end());
    }
    S.wo = slice_cols(W.wo, nq * d, t.first_head * d, t.heads * d);  // row-parallel
    if (!W.w_gate_up.empty()) {
      const int I = c.intermediate_size;
      S.w_gate_up = slice_rows(W.w_gate_up, H, t.first_inter, t.inter);
      const std::vector<float> up = slice_rows(W.w_gate_up, H, I + t.first_inter, t.inter);
      S.w_gate_up.insert(S.w_gate_up.end(), up.begin(), up.end());
      S.w_down = slice_cols(W.w_down, I, t.first_inter, t.inter);
    }
    if (!W.router.empty()) {
      const int EI = c.moe_intermediate_size;
      S.router = W.router;  // replicated: every rank routes every token
      S.expert_gate_up = slice_rows(W.expert_gate_up, 2 * EI * H, t.first_expert, t.experts);
      S.expert_down = slice_rows(W.expert_down, H * EI, t.first_expert, t.experts);
    }
  }
  return m;
}

AttentionFn Qwen3Model::exact_attention() const {
  const int heads = tp_.heads, kv_heads = tp_.kv_heads, d = config_.head_dim;
  return [heads, kv_heads, d](int, const float* q, const float* k, const float* v, int nq, int n, float* out) {
    causal_attention(q, k, v, heads, kv_heads, nq, n - nq, n, d, out);
  };
}

std::vector<float> Qwen3Model::forward(const std::vector<int>& tokens, const AttentionFn& attend, Capture* capture,
                                       KvState* state) const {
  require(bool(attend), "Qwen3Model::forward: no attention function");
  return run(tokens.data(), int(tokens.size()), nullptr, attend, capture, state, false);
}

std::vector<float> Qwen3Model::forward(const std::vector<int>& tokens, Capture* capture) const {
  return forward(tokens, exact_attention(), capture);
}

std::vector<float> Qwen3Model::last_logits(const KvState* prefix, const std::vector<int>& tokens,
                                           const AttentionFn& attend, KvState* state) const {
  require(bool(attend), "Qwen3Model::last_logits: no attention function");
  require(!tokens.empty(), "Qwen3Model::last_logits: no tokens");
  require(prefix == nullptr || int(prefix->k.size()) == config_.num_hidden_layers,
          "Qwen3Model::last_logits: the prefix state is empty");
  return run(tokens.data(), int(tokens.size()), prefix, attend, nullptr, state, true);
}

std::vector<float> Qwen3Model::extend(const KvState& prefix, const std::vector<int>& tokens, const AttentionFn& attend,
                                      KvState* state) const {
  require(bool(attend), "Qwen3Model::extend: no attention function");
  require(int(prefix.k.size()) == config_.num_hidden_layers, "Qwen3Model::extend: the prefix state is empty");
  return run(tokens.data(), int(tokens.size()), &prefix, attend, nullptr, state, false);
}

std::vector<float> Qwen3Model::run(const int* tokens, int L, const KvState* prefix, const AttentionFn& attend,
                                   Capture* capture, KvState* state, bool last_only) const {
  const Qwen3Config& c = config_;
  require(L > 0, "Qwen3Model: empty token sequence");
  const int pos0 = prefix ? prefix->length : 0, n = pos0 + L;
  for (int t = 0; t < L; ++t) {
    require(tokens[t] >= 0 && tokens[t] < c.vocab_size, "Qwen3Model: token " + std::to_string(tokens[t]) +
                                                            " at position " + std::to_string(pos0 + t) +
                                                            " is outside the vocabulary [0, " +
                                                            std::to_string(c.vocab_size) + ")");
  }
  const int H = c.hidden_size, V = c.vocab_size, d = c.head_dim, half = d / 2;
  const int nq = tp_.heads, nkv = tp_.kv_heads;  // this rank's (all of them without tensor parallelism)
  const int qkv_width = (nq + 2 * nkv) * d;
  const float eps = float(c.rms_norm_eps);
  const size_t Ls = size_t(L);
  const int64_t row_chunk = std::max<int64_t>(1, 16384 / H);  // rows per thread worth spawning for

  // The embedding (vocabulary-parallel: a token outside the rank's rows embeds as zeros, the
  // sum over ranks is its row).
  std::vector<float> h(Ls * H, 0.0f);
  for (int t = 0; t < L; ++t) {
    const int row = tokens[t] - tp_.first_vocab;
    if (row >= 0 && row < tp_.vocab) std::copy_n(embed_.data() + size_t(row) * H, H, h.data() + size_t(t) * H);
  }
  if (group_ != nullptr) group_->all_reduce_sum(h.data(), h.size());
  if (capture != nullptr) capture->hidden_after_embed = h;

  // RoPE tables as transformers builds them: angle = float(position) * inv_freq in float32.
  std::vector<float> cos_t(Ls * half), sin_t(Ls * half);
  for (int t = 0; t < L; ++t) {
    for (int i = 0; i < half; ++i) {
      const float angle = float(pos0 + t) * inv_freq_[size_t(i)];
      cos_t[size_t(t) * half + i] = std::cos(angle);
      sin_t[size_t(t) * half + i] = std::sin(angle);
    }
  }

  std::vector<float> xn(Ls * H), qkv(Ls * qkv_width), tmp(Ls * H);
  std::vector<float> q(Ls * nq * d), k(Ls * nkv * d), v(Ls * nkv * d), att(Ls * nq * d), att_rows(Ls * nq * d);
  // K/V of every layer for `state`; assigned at the end, since state may alias prefix.
  std::vector<std::vector<float>> layer_k(state ? size_t(c.num_hidden_layers) : 0), layer_v(layer_k.size());
  auto norm_rows = [&](const std::vector<float>& weight) {
    parallel_for_chunks(L, row_chunk, [&](int64_t b, int64_t e) {
      for (int64_t t = b; t < e; ++t) rms_norm(h.data() + t * H, weight.data(), H, eps, xn.data() + t * H);
    });
  };
  auto add_to_h = [&] {  // a row-parallel product's partial sums are summed over the ranks first
    if (group_ != nullptr) group_->all_reduce_sum(tmp.data(), tmp.size());
    for (size_t i = 0; i < h.size(); ++i) h[i] += tmp[i];
  };

  for (int l = 0; l < c.num_hidden_layers; ++l) {
    const Layer& W = layers_[size_t(l)];

    // Attention block.
    norm_rows(W.input_norm);
    linear(xn.data(), W.wqkv.data(), L, qkv_width, H, qkv.data());
    parallel_for_chunks(L, row_chunk, [&](int64_t b, int64_t e) {
      for (int64_t t = b; t < e; ++t) {
        const float* row = qkv.data() + t * qkv_width;
        const float* ct = cos_t.data() + t * half;
        const float* st = sin_t.data() + t * half;
        for (int j = 0; j < nq; ++j) {
          float* dst = q.data() + (size_t(j) * L + t) * d;
          rms_norm(row + j * d, W.q_norm.data(), d, eps, dst);
          rope(dst, ct, st, half);
        }
        for (int j = 0; j < nkv; ++j) {
          float* dst = k.data() + (size_t(j) * L + t) * d;
          rms_norm(row + (nq + j) * d, W.k_norm.data(), d, eps, dst);
          rope(dst, ct, st, half);
          std::copy_n(row + (nq + nkv + j) * d, d, v.data() + (size_t(j) * L + t) * d);
        }
      }
    });
    if (capture != nullptr && std::find(capture->layers.begin(), capture->layers.end(), l) != capture->layers.end()) {
      capture->q_rope[l] = q;
      capture->k_rope[l] = k;
      capture->v[l] = v;
    }
    // Keys and values of all n positions: the prefix's, then this chunk's.
    std::vector<float> k_all, v_all;
    if (prefix != nullptr) {
      k_all.resize(size_t(nkv) * n * d);
      v_all.resize(size_t(nkv) * n * d);
      for (int j = 0; j < nkv; ++j) {
        const size_t src = size_t(j) * pos0 * d, dst = size_t(j) * n * d;
        std::copy_n(prefix->k[size_t(l)].data() + src, size_t(pos0) * d, k_all.data() + dst);
        std::copy_n(prefix->v[size_t(l)].data() + src, size_t(pos0) * d, v_all.data() + dst);
        std::copy_n(k.data() + size_t(j) * L * d, Ls * d, k_all.data() + dst + size_t(pos0) * d);
        std::copy_n(v.data() + size_t(j) * L * d, Ls * d, v_all.data() + dst + size_t(pos0) * d);
      }
    }
    const std::vector<float>& ks = prefix ? k_all : k;
    const std::vector<float>& vs = prefix ? v_all : v;
    attend(l, q.data(), ks.data(), vs.data(), L, n, att.data());
    if (state != nullptr) {
      layer_k[size_t(l)] = ks;
      layer_v[size_t(l)] = vs;
    }
    // [heads][L][d] -> [L][heads * d], the layout o_proj expects.
    for (int j = 0; j < nq; ++j) {
      for (int t = 0; t < L; ++t) {
        std::copy_n(att.data() + (size_t(j) * L + t) * d, d, att_rows.data() + (size_t(t) * nq + j) * d);
      }
    }
    linear(att_rows.data(), W.wo.data(), L, H, nq * d, tmp.data());
    add_to_h();

    norm_rows(W.post_norm);
    mlp(W, xn.data(), L, tmp.data());
    add_to_h();
  }

  if (state != nullptr) {
    state->k = std::move(layer_k);
    state->v = std::move(layer_v);
    state->length = n;
  }
  const int first = last_only ? L - 1 : 0, rows = L - first;
  for (int t = first; t < L; ++t) {
    rms_norm(h.data() + size_t(t) * H, final_norm_.data(), H, eps, xn.data() + size_t(t) * H);
  }
  // The LM head: the rank's vocabulary slice of every row, gathered into whole rows.
  const std::vector<float>& head = lm_head_.empty() ? embed_ : lm_head_;
  std::vector<float> logits(size_t(rows) * V);
  if (group_ == nullptr) {
    linear(xn.data() + size_t(first) * H, head.data(), rows, V, H, logits.data());
    return logits;
  }
  const int Vr = tp_.vocab;
  std::vector<float> part(size_t(rows) * Vr), parts(size_t(tp_.ranks) * part.size());
  linear(xn.data() + size_t(first) * H, head.data(), rows, Vr, H, part.data());
  group_->all_gather(part.data(), part.size(), parts.data());
  for (int r = 0; r < tp_.ranks; ++r) {
    for (int t = 0; t < rows; ++t) {
      std::copy_n(parts.data() + (size_t(r) * rows + t) * Vr, Vr, logits.data() + size_t(t) * V + size_t(r) * Vr);
    }
  }
  return logits;
}

void Qwen3Model::mlp(const Layer& W, const float* xn, int L, float* out) const {
  const Qwen3Config& c = config_;
  const int H = c.hidden_size;
  if (!W.router.empty()) {
    MoeWeights moe;
    moe.router = W.router.data();
    moe.gate_up = W.expert_gate_up.data();
    moe.down = W.expert_down.data();
    moe.num_experts = c.num_experts;
    moe.top_k = c.num_experts_per_tok;
    moe.hidden = H;
    moe.intermediate = c.moe_intermediate_size;
    moe.normalize_top_k = c.norm_topk_prob;
    moe_mlp_experts(moe, tp_.first_expert, tp_.experts, xn, L, out);
    return;
  }
  swiglu_mlp(xn, L, H, tp_.inter, W.w_gate_up.data(), W.w_down.data(), out);
}

std::vector<int> Qwen3Model::generate_greedy(const std::vector<int>& prompt, int new_tokens, bool stop_at_eos) const {
  require(!prompt.empty(), "generate_greedy: empty prompt");
  require(new_tokens >= 0, "generate_greedy: negative new_tokens");
  std::vector<int> out;
  if (new_tokens == 0) return out;

  const Qwen3Config& c = config_;
  const AttentionFn exact = exact_attention();
  KvState state;
  std::vector<float> logits = run(prompt.data(), int(prompt.size()), nullptr, exact, nullptr, &state, true);
  for (;;) {
    const int next = argmax(logits.data(), c.vocab_size);
    out.push_back(next);
    if (int(out.size()) == new_tokens || (stop_at_eos && c.is_eos(next))) break;
    logits = run(&next, 1, &state, exact, nullptr, &state, true);
  }
  return out;
}

}  // namespace fp4kv::model
