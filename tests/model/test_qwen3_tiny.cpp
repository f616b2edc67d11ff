// Qwen3Model on tiny random checkpoints written at test time: loader errors, and the
// forward pass against a naive double-precision transcription of the HF model.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "fixtures.h"
#include "fp4kv/model/qwen3.h"

namespace fp4kv::model {
namespace {

using namespace fp4kv::model::testing;
using nlohmann::json;

const RawTensor& find(const std::vector<RawTensor>& ts, const std::string& name) {
  for (const RawTensor& t : ts) {
    if (t.name == name) return t;
  }
  throw std::runtime_error("fixture has no " + name);
}

std::vector<double> values(const std::vector<RawTensor>& ts, const std::string& name) {
  const RawTensor& t = find(ts, name);
  std::vector<float> f(t.bytes.size() / 4);
  std::memcpy(f.data(), t.bytes.data(), t.bytes.size());
  return {f.begin(), f.end()};
}

double rel_error(const std::vector<float>& a, const std::vector<double>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < b.size(); ++i) {
    num += (a[i] - b[i]) * (a[i] - b[i]);
    den += b[i] * b[i];
  }
  return std::sqrt(num / den);
}

// Causal GQA attention in double: q [heads][L][d], k/v [kv_heads][L][d].
std::vector<double> naive_attention(const std::vector<double>& q, const std::vector<double>& k,
                                    const std::vector<double>& v, int heads, int kv_heads, int L, int d) {
  std::vector<double> out(size_t(heads) * L * d, 0.0);
  for (int h = 0; h < heads; ++h) {
    const int g = h / (heads / kv_heads);
    for (int t = 0; t < L; ++t) {
      std::vector<double> s(size_t(t) + 1);
      double m = -1e300, sum = 0;
      for (int j = 0; j <= t; ++j) {
        double dot = 0;
        for (int i = 0; i < d; ++i) dot += q[(size_t(h) * L + t) * d + i] * k[(size_t(g) * L + j) * d + i];
        s[size_t(j)] = dot / std::sqrt(double(d));
        m = std::max(m, s[size_t(j)]);
      }
      for (double& x : s) sum += (x = std::exp(x - m));
      for (int j = 0; j <= t; ++j) {
        for (int i = 0; i < d; ++i) {
          out[(size_t(h) * L + t) * d + i] += s[size_t(j)] / sum * v[(size_t(g) * L + j) * d + i];
        }
      }
    }
  }
  return out;
}

// y[M][N] = x[M][K] w[N][K]^T in double.
std::vector<double> matmul(const std::vector<double>& x, const std::vector<double>& w, int M, int N, int K) {
  std::vector<double> y(size_t(M) * N, 0.0);
  for (int m = 0; m < M; ++m)
    for (int n = 0; n < N; ++n)
      for (int k = 0; k < K; ++k) y[size_t(m) * N + n] += x[size_t(m) * K + k] * w[size_t(n) * K + k];
  return y;
}

// down(silu(gate(x)) * up(x)) of x [L][H] with the weights named prefix + gate_proj.weight ...
std::vector<double> naive_swiglu(const std::vector<RawTensor>& ts, const std::string& prefix,
                                 const std::vector<double>& x, int L, int H, int I) {
  const auto g = matmul(x, values(ts, prefix + "gate_proj.weight"), L, I, H);
  const auto u = matmul(x, values(ts, prefix + "up_proj.weight"), L, I, H);
  std::vector<double> a(g.size());
  for (size_t i = 0; i < a.size(); ++i) a[i] = g[i] / (1.0 + std::exp(-g[i])) * u[i];
  return matmul(a, values(ts, prefix + "down_proj.weight"), L, H, I);
}

// transformers' Qwen3MoeSparseMoeBlock in double, token by token: softmax over the router
// logits, the top k (no ties in random data), renormalized when norm_topk_prob, and the sum
// of the chosen experts' SwiGLU outputs times their weights.
std::vector<double> naive_moe(const json& c, const std::vector<RawTensor>& ts, const std::string& p,
                              const std::vector<double>& x, int L) {
  const int H = c["hidden_size"], E = c["num_experts"], k = c["num_experts_per_tok"], EI = c["moe_intermediate_size"];
  const auto logits = matmul(x, values(ts, p + "mlp.gate.weight"), L, E, H);
  std::vector<double> out(size_t(L) * H, 0.0);
  for (int t = 0; t < L; ++t) {
    std::vector<double> prob(logits.begin() + size_t(t) * E, logits.begin() + size_t(t + 1) * E);
    const double m = *std::max_element(prob.begin(), prob.end());
    double sum = 0;
    for (double& v : prob) sum += (v = std::exp(v - m));
    for (double& v : prob) v /= sum;
    std::vector<int> order(static_cast<size_t>(E));
    for (int e = 0; e < E; ++e) order[size_t(e)] = e;
    std::sort(order.begin(), order.end(), [&](int a, int b) { return prob[size_t(a)] > prob[size_t(b)]; });
    double kept = 0;
    for (int j = 0; j < k; ++j) kept += prob[size_t(order[size_t(j)])];
    const std::vector<double> row(x.begin() + size_t(t) * H, x.begin() + size_t(t + 1) * H);
    for (int j = 0; j < k; ++j) {
      const int e = order[size_t(j)];
      const double w = c.value("norm_topk_prob", false) ? prob[size_t(e)] / kept : prob[size_t(e)];
      const auto y = naive_swiglu(ts, p + "mlp.experts." + std::to_string(e) + ".", row, 1, H, EI);
      for (int i = 0; i < H; ++i) out[size_t(t) * H + i] += w * y[size_t(i)];
    }
  }
  return out;
}

// The HF Qwen3ForCausalLM (or Qwen3MoeForCausalLM) forward, written out plainly in double.
std::vector<double> naive_forward(const json& c, const std::vector<RawTensor>& ts, const std::vector<int>& tokens) {
  const int H = c["hidden_size"], I = c["intermediate_size"], V = c["vocab_size"], d = c["head_dim"];
  const int nq = c["num_attention_heads"], nkv = c["num_key_value_heads"], layers = c["num_hidden_layers"];
  const double eps = c["rms_norm_eps"], theta = c["rope_parameters"]["rope_theta"];
  const int L = int(tokens.size());
  auto norm = [&](std::vector<double> x, const std::vector<double>& w, int n) {
    for (size_t r = 0; r < x.size() / size_t(n); ++r) {
      double ss = 0;
      for (int i = 0; i < n; ++i) ss += x[r * n + i] * x[r * n + i];
      const double s = 1.0 / std::sqrt(ss / n + eps);
      for (int i = 0; i < n; ++i) x[r * n + i] *= s * w[size_t(i)];
    }
    return x;
  };
  const std::vector<double> embed = values(ts, "model.embed_tokens.weight");
  std::vector<double> h(size_t(L) * H);
  for (int t = 0; t < L; ++t)
    for (int i = 0; i < H; ++i) h[size_t(t) * H + i] = embed[size_t(tokens[size_t(t)]) * H + i];
  for (int l = 0; l < layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    const std::vector<double> x = norm(h, values(ts, p + "input_layernorm.weight"), H);
    const auto qp = matmul(x, values(ts, p + "self_attn.q_proj.weight"), L, nq * d, H);
    const auto kp = matmul(x, values(ts, p + "self_attn.k_proj.weight"), L, nkv * d, H);
    const auto vp = matmul(x, values(ts, p + "self_attn.v_proj.weight"), L, nkv * d, H);
    // To [heads][L][d] with per-head RMSNorm and rotate-half RoPE.
    auto heads_of = [&](const std::vector<double>& proj, int n, const std::vector<double>* w, bool rotate) {
      std::vector<double> out(size_t(n) * L * d);
      for (int j = 0; j < n; ++j) {
        for (int t = 0; t < L; ++t) {
          std::vector<double> row(proj.begin() + (size_t(t) * n + j) * d, proj.begin() + (size_t(t) * n + j + 1) * d);
          if (w != nullptr) row = norm(row, *w, d);
          if (rotate) {
            std::vector<double> r = row;
            for (int i = 0; i < d / 2; ++i) {
              const double a = t * std::pow(theta, -2.0 * i / d);
              r[size_t(i)] = row[size_t(i)] * std::cos(a) - row[size_t(i + d / 2)] * std::sin(a);
              r[size_t(i + d / 2)] = row[size_t(i + d / 2)] * std::cos(a) + row[size_t(i)] * std::sin(a);
            }
            row = r;
          }
          std::copy(row.begin(), row.end(), out.begin() + (size_t(j) * L + t) * d);
        }
      }
      return out;
    };
    const auto qn = values(ts, p + "self_attn.q_norm.weight"), kn = values(ts, p + "self_attn.k_norm.weight");
    const auto att = naive_attention(heads_of(qp, nq, &qn, true), heads_of(kp, nkv, &kn, true),
                                     heads_of(vp, nkv, nullptr, false), nq, nkv, L, d);
    std::vector<double> rows(size_t(L) * nq * d);
    for (int j = 0; j < nq; ++j)
      for (int t = 0; t < L; ++t)
        for (int i = 0; i < d; ++i) rows[(size_t(t) * nq + j) * d + i] = att[(size_t(j) * L + t) * d + i];
    const auto o = matmul(rows, values(ts, p + "self_attn.o_proj.weight"), L, H, nq * d);
    for (size_t i = 0; i < h.size(); ++i) h[i] += o[i];
    const std::vector<double> x2 = norm(h, values(ts, p + "post_attention_layernorm.weight"), H);
    const auto down = is_sparse_layer(c, l) ? naive_moe(c, ts, p, x2, L) : naive_swiglu(ts, p + "mlp.", x2, L, H, I);
    for (size_t i = 0; i < h.size(); ++i) h[i] += down[i];
  }
  const auto hn = norm(h, values(ts, "model.norm.weight"), H);
  const bool tied = c["tie_word_embeddings"];
  return matmul(hn, tied ? embed : values(ts, "lm_head.weight"), L, V, H);
}

TEST(Qwen3Tiny, ExactAttentionMatchesNaiveAcrossBlocks) {
  const int heads = 4, kv_heads = 2, L = 600, d = 16;  // L spans several 256-row blocks
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 1.5f);
  std::vector<float> q(size_t(heads) * L * d), k(size_t(kv_heads) * L * d), v(k.size());
  for (auto* x : {&q, &k, &v})
    for (float& e : *x) e = normal(rng);
  std::vector<float> out(q.size());
  exact_causal_attention(q.data(), k.data(), v.data(), heads, kv_heads, L, d, out.data());
  const auto ref = naive_attention({q.begin(), q.end()}, {k.begin(), k.end()}, {v.begin(), v.end()}, heads,
                                   kv_heads, L, d);
  const double err = rel_error(out, ref);
  std::printf("exact_causal_attention vs double: rel error %.3g\n", err);
  EXPECT_LT(err, 1e-6);
}

TEST(Qwen3Tiny, ForwardMatchesNaiveDouble) {
  TempDir dir;
  const json c = small_config();
  const auto tensors = qwen3_tensors(c, 3);
  write_checkpoint(dir.str(), c, tensors);
  const Qwen3Model m = Qwen3Model::load(dir.str());
  EXPECT_EQ(m.parameter_count(), 40 * 32 * 2 + 32 + 2 * (2 * 32 + 2 * 8 + 32 * 32 * 2 + 16 * 32 * 2 + 3 * 48 * 32));

  std::vector<int> tokens;
  for (int t = 0; t < 29; ++t) tokens.push_back((t * 7 + 3) % 40);
  int calls = 0;
  const AttentionFn counting = [&](int layer, const float* q, const float* k, const float* v, int nq, int n,
                                   float* out) {
    EXPECT_EQ(layer, calls++);
    EXPECT_EQ(nq, n);
    exact_causal_attention(q, k, v, 4, 2, n, 8, out);
  };
  const std::vector<float> logits = m.forward(tokens, counting);
  EXPECT_EQ(calls, 2);
  ASSERT_EQ(logits.size(), tokens.size() * 40);
  const double err = rel_error(logits, naive_forward(c, tensors, tokens));
  std::printf("tiny model logits vs double: rel error %.3g\n", err);
  EXPECT_LT(err, 1e-5);

  expect_error([&] { m.forward({1, 2, 40}); }, {"token 40", "position 2", "vocabulary"});
  expect_error([&] { m.forward({}); }, {"empty"});
}

// Qwen3-MoE: a sparse layer and a dense one (mlp_only_layers) against the double
// transcription; the Hub's per-expert tensors and transformers 5's fused ones load alike.
TEST(Qwen3Tiny, MoeForwardMatchesNaiveDouble) {
  const json c = tiny_moe_config();
  const auto tensors = qwen3_tensors(c, 11);
  std::vector<int> tokens;
  for (int t = 0; t < 23; ++t) tokens.push_back((t * 3 + 1) % 10);
  const auto ref = naive_forward(c, tensors, tokens);
  std::vector<float> hub_logits;
  for (const bool fused : {false, true}) {
    TempDir dir;
    write_checkpoint(dir.str(), c, fused ? fuse_experts(c, tensors) : tensors);
    const Qwen3Model m = Qwen3Model::load(dir.str());
    EXPECT_TRUE(m.config().is_moe());
    EXPECT_TRUE(m.config().is_sparse_layer(0));
    EXPECT_FALSE(m.config().is_sparse_layer(1));
    // Attention, norms, embeddings (untied) and layer 1's dense MLP, plus layer 0's router and experts.
    EXPECT_EQ(m.parameter_count(), 2 * 10 * 8 + 8 + 2 * (2 * 8 + 2 * 4 + 8 * 8 + 2 * 4 * 8 + 8 * 8) +
                                       8 * 8 + 8 * 3 * 12 * 8 + 3 * 16 * 8);
    const std::vector<float> logits = m.forward(tokens);
    const double err = rel_error(logits, ref);
    std::printf("tiny MoE logits (%s) vs double: rel error %.3g\n", fused ? "fused tensors" : "per-expert tensors", err);
    EXPECT_LT(err, 1e-5);
    if (fused) {
      EXPECT_EQ(logits, hub_logits);
    } else {
      hub_logits = logits;
    }
  }
}

TEST(Qwen3Tiny, MoeCheckpointMissingAnExpertIsRefused) {
  TempDir dir;
  const json c = tiny_moe_config();
  std::vector<RawTensor> tensors;
  for (RawTensor& t : qwen3_tensors(c, 2)) {
    if (t.name != "model.layers.0.mlp.experts.5.up_proj.weight") tensors.push_back(std::move(t));
  }
  write_checkpoint(dir.str(), c, tensors);
  expect_error([&] { Qwen3Model::load(dir.str()); }, {"missing tensor 'model.layers.0.mlp.experts.5.up_proj.weight'"});
}

TEST(Qwen3Tiny, ExtendingAPrefixEqualsOneForward) {
  TempDir dir;
  const json c = small_config();
  write_checkpoint(dir.str(), c, qwen3_tensors(c, 5));
  const Qwen3Model m = Qwen3Model::load(dir.str());
  std::vector<int> tokens;
  for (int t = 0; t < 37; ++t) tokens.push_back((t * 5 + 1) % 40);
  const std::vector<float> full = m.forward(tokens);
  KvState state;
  const std::vector<int> head(tokens.begin(), tokens.begin() + 20), mid(tokens.begin() + 20, tokens.begin() + 30),
      tail(tokens.begin() + 30, tokens.end());
  std::vector<float> got = m.forward(head, m.exact_attention(), nullptr, &state);
  EXPECT_EQ(state.length, 20);
  const std::vector<float> b = m.extend(state, mid, m.exact_attention(), &state);  // state aliases prefix
  EXPECT_EQ(state.length, 30);
  const std::vector<float> e = m.extend(state, tail, m.exact_attention());
  got.insert(got.end(), b.begin(), b.end());
  got.insert(got.end(), e.begin(), e.end());
  ASSERT_EQ(got.size(), full.size());
  EXPECT_LT(rel_error(got, std::vector<double>(full.begin(), full.end())), 1e-6);
}

TEST(Qwen3Tiny, GreedyMatchesFullForward) {
  TempDir dir;
  const json c = small_config();
  write_checkpoint(dir.str(), c, qwen3_tensors(c, 5));
  const Qwen3Model m = Qwen3Model::load(dir.str());
  const std::vector<int> prompt = {1, 5, 9, 2, 33, 17};
  const std::vector<int> gen = m.generate_greedy(prompt, 12, /*stop_at_eos=*/false);
  ASSERT_EQ(gen.size(), 12u);
  std::vector<int> seq = prompt;
  seq.insert(seq.end(), gen.begin(), gen.end() - 1);
  const std::vector<float> logits = m.forward(seq);
  for (size_t i = 0; i < gen.size(); ++i) {
    const float* row = logits.data() + (prompt.size() - 1 + i) * 40;
    EXPECT_EQ(gen[i], int(std::max_element(row, row + 40) - row)) << "step " << i;
  }
}

class Qwen3LoadErrors : public ::testing::Test {
 protected:
  TempDir dir;
  json config = tiny_config();
  std::vector<RawTensor> tensors = qwen3_tensors(config);
  void write() { write_checkpoint(dir.str(), config, tensors); }
  void load_expect(const std::vector<std::string>& parts) {
    expect_error([&] { Qwen3Model::load(dir.str()); }, parts);
  }
};

TEST_F(Qwen3LoadErrors, ValidFixtureLoads) {
  write();
  const Qwen3Model m = Qwen3Model::load(dir.str());
  EXPECT_EQ(m.config().hidden_size, 8);
  EXPECT_EQ(m.forward({1, 2, 3}).size(), 30u);
}

TEST_F(Qwen3LoadErrors, MissingDirectory) {
  expect_error([] { Qwen3Model::load("/nonexistent/fp4kv_model_dir"); },
               {"/nonexistent/fp4kv_model_dir", "does not exist"});
  EXPECT_THROW(Qwen3Model::load("/nonexistent/fp4kv_model_dir"), Error);
}

TEST_F(Qwen3LoadErrors, MissingConfig) {
  write_safetensors(dir / "model.safetensors", tensors);
  load_expect({"no config.json"});
}

TEST_F(Qwen3LoadErrors, LlamaArchitecture) {
  // The real pk8l config with another architecture (model_type still says qwen3: the
  // architectures list decides).
  std::ifstream in(pk8l_dir() + "/config.json");
  json pk = json::parse(in);
  pk["architectures"] = {"LlamaForCausalLM"};
  write_text(dir / "config.json", pk.dump());
  load_expect({"unsupported architecture LlamaForCausalLM (fp4kv supports Qwen3ForCausalLM and Qwen3MoeForCausalLM)"});
}

TEST_F(Qwen3LoadErrors, YarnRope) {
  config["rope_parameters"] = {{"rope_type", "yarn"}, {"rope_theta", 1e6}, {"factor", 4.0},
                               {"original_max_position_embeddings", 32768}};
  write();
  load_expect({"unsupported RoPE type 'yarn'"});
}

TEST_F(Qwen3LoadErrors, MissingTensor) {
  std::erase_if(tensors, [](const RawTensor& t) { return t.name == "model.layers.0.self_attn.k_norm.weight"; });
  write();
  load_expect({"missing tensor 'model.layers.0.self_attn.k_norm.weight'", "expected shape [4]"});
}

TEST_F(Qwen3LoadErrors, MisshapenTensor) {
  for (RawTensor& t : tensors) {
    if (t.name == "model.layers.0.self_attn.k_proj.weight") {  // [4, 8] expected; write [8, 8]
      t.shape = {8, 8};
      t.bytes.resize(8 * 8 * 4);
    }
  }
  write();
  load_expect({"'model.layers.0.self_attn.k_proj.weight' has shape [8, 8]", "expected shape [4, 8]"});
}

TEST_F(Qwen3LoadErrors, ExtraTensor) {
  tensors.push_back(f32_tensor("model.layers.1.mlp.up_proj.weight", {16, 8}, std::vector<float>(128, 0.0f)));
  write();
  load_expect({"unexpected tensor 'model.layers.1.mlp.up_proj.weight'"});
}

TEST_F(Qwen3LoadErrors, LmHeadWithTiedEmbeddings) {
  tensors.push_back(f32_tensor("lm_head.weight", {10, 8}, std::vector<float>(80, 0.0f)));
  write();
  load_expect({"unexpected tensor 'lm_head.weight'", "tie_word_embeddings"});
}

TEST_F(Qwen3LoadErrors, UntiedNeedsLmHead) {
  config["tie_word_embeddings"] = false;
  write();
  load_expect({"missing tensor 'lm_head.weight'", "[10, 8]"});
}

TEST_F(Qwen3LoadErrors, TruncatedSafetensors) {
  write();
  const std::string path = dir / "model.safetensors";
  fs::resize_file(path, fs::file_size(path) - 100);
  load_expect({"model.safetensors", "truncated"});
}

TEST_F(Qwen3LoadErrors, HeaderLengthBeyondFileSize) {
  write();
  const std::string path = dir / "model.safetensors";
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  const uint64_t huge = uint64_t(1) << 40;
  f.write(reinterpret_cast<const char*>(&huge), 8);
  f.close();
  load_expect({"model.safetensors", "header length 1099511627776 exceeds the file size"});
}

TEST_F(Qwen3LoadErrors, DirectoriesWhereFilesBelong) {
  write();
  fs::remove(dir / "model.safetensors");
  fs::create_directories(dir / "model.safetensors");
  load_expect({"model.safetensors", "is a directory"});

  fs::remove(dir / "config.json");
  fs::create_directories(dir / "config.json");
  load_expect({"config.json", "is a directory"});

  TempDir sharded;
  write_text(sharded / "config.json", config.dump());
  fs::create_directories(sharded / "model.safetensors.index.json");
  expect_error([&] { Qwen3Model::load(sharded.str()); }, {"model.safetensors.index.json", "is a directory"});

  // A file given as the model directory.
  write_text(sharded / "plain.txt", "x");
  expect_error([&] { Qwen3Config::load_dir(sharded / "plain.txt"); }, {"plain.txt", "is not a directory"});
}

TEST_F(Qwen3LoadErrors, NonFiniteWeight) {
  for (RawTensor& t : tensors) {
    if (t.name == "model.norm.weight") {
      const float nan = std::nanf("");
      std::memcpy(t.bytes.data(), &nan, 4);
    }
  }
  write();
  load_expect({"'model.norm.weight'", "NaN"});
}

}  // namespace
}  // namespace fp4kv::model
