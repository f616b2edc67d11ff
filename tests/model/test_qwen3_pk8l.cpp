// Qwen3Model on the real pk8l checkpoint: agreement with Hugging Face transformers'
// activations, greedy-generation consistency, and speed/quality of a 4096-token window.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <sstream>

#include "fixtures.h"
#include "fp4kv/model/byte_tokenizer.h"
#include "fp4kv/model/qwen3.h"
#include "fp4kv/model/safetensors.h"

namespace fp4kv::model {
namespace {

using namespace fp4kv::model::testing;

const Qwen3Model& pk8l() {
  static const Qwen3Model model = Qwen3Model::load(pk8l_dir());
  return model;
}

std::string eval_text() {
  std::ifstream in(source_dir() + "/data/eval.txt", std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

double rel_error(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double num = 0, den = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    num += double(a[i] - b[i]) * double(a[i] - b[i]);
    den += double(b[i]) * double(b[i]);
  }
  return std::sqrt(num / den);
}

TEST(Qwen3Pk8l, MatchesTransformersReference) {
  const Qwen3Model& m = pk8l();
  const SafetensorsFile ref = SafetensorsFile::open(pk8l_dir() + "/reference_activations.safetensors");
  const std::vector<int32_t> ids32 = ref.read_i32("input_ids");
  const std::vector<int> ids(ids32.begin(), ids32.end());
  ASSERT_EQ(ids.size(), 256u);
  EXPECT_EQ(ids, encode_bytes(eval_text().substr(0, 255)));  // [BOS] + first 255 bytes

  Capture cap;
  cap.layers = {0, 7};
  const std::vector<float> logits = m.forward(ids, &cap);

  struct Item {
    std::string name;
    const std::vector<float>* got;
  };
  const std::vector<Item> items = {
      {"hidden_after_embed", &cap.hidden_after_embed},
      {"layer0.q_rope", &cap.q_rope[0]},
      {"layer0.k_rope", &cap.k_rope[0]},
      {"layer0.v", &cap.v[0]},
      {"layer7.q_rope", &cap.q_rope[7]},
      {"layer7.k_rope", &cap.k_rope[7]},
      {"layer7.v", &cap.v[7]},
      {"logits", &logits},
  };
  for (const Item& it : items) {
    const double err = rel_error(*it.got, ref.read_f32(it.name));
    std::printf("  %-20s rel error %.3g\n", it.name.c_str(), err);
    EXPECT_LT(err, 1e-4) << it.name;
  }
  EXPECT_EQ(cap.q_rope.size(), 2u);  // only the requested layers

  const std::vector<float> want = ref.read_f32("logits");
  const int V = m.config().vocab_size;
  int mismatches = 0;
  for (size_t t = 0; t < ids.size(); ++t) {
    const float* a = logits.data() + t * V;
    const float* b = want.data() + t * V;
    if (std::max_element(a, a + V) - a != std::max_element(b, b + V) - b) ++mismatches;
  }
  EXPECT_EQ(mismatches, 0) << "positions whose argmax differs from transformers";
}

TEST(Qwen3Pk8l, GreedyMatchesFullForward) {
  const Qwen3Model& m = pk8l();
  const std::vector<int> prompt = encode_bytes("def main(args):\n    ");
  const int n = 24;
  const std::vector<int> gen = m.generate_greedy(prompt, n, /*stop_at_eos=*/false);
  ASSERT_EQ(gen.size(), size_t(n));
  std::printf("  greedy continuation: \"%s\"\n", decode_bytes(gen).c_str());

  std::vector<int> seq = prompt;
  seq.insert(seq.end(), gen.begin(), gen.end() - 1);
  const std::vector<float> logits = m.forward(seq);
  const int V = m.config().vocab_size;
  for (int i = 0; i < n; ++i) {
    const float* row = logits.data() + (prompt.size() - 1 + size_t(i)) * V;
    const int best = int(std::max_element(row, row + V) - row);
    // Only a near-tie may legitimately flip between the two summation orders.
    if (gen[size_t(i)] != best) {
      EXPECT_LT(std::fabs(row[best] - row[gen[size_t(i)]]), 1e-4f) << "step " << i;
    }
  }
}

TEST(Qwen3Pk8l, GreedyStopsAtEos) {
  const Qwen3Model& m = pk8l();
  const std::vector<int> gen = m.generate_greedy(encode_bytes("x = 1\n"), 40, /*stop_at_eos=*/true);
  ASSERT_FALSE(gen.empty());
  for (size_t i = 0; i + 1 < gen.size(); ++i) EXPECT_FALSE(m.config().is_eos(gen[i]));
  EXPECT_TRUE(gen.size() == 40u || m.config().is_eos(gen.back()));
}

TEST(Qwen3Pk8l, Window4096PredictsWell) {
  const Qwen3Model& m = pk8l();
  const std::string text = eval_text();
  ASSERT_GE(text.size(), 8192u);
  const std::vector<int> ids = encode_bytes(std::string_view(text).substr(1000, 4095));
  ASSERT_EQ(ids.size(), 4096u);

  const auto t0 = std::chrono::steady_clock::now();
  const std::vector<float> logits = m.forward(ids);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  // Bits per byte of the bytes after BOS (README: about 1.01 on held-out 4096 windows).
  const int V = m.config().vocab_size;
  double nats = 0;
  for (size_t t = 0; t + 1 < ids.size(); ++t) {
    const float* row = logits.data() + t * V;
    const float mx = *std::max_element(row, row + V);
    double z = 0;
    for (int j = 0; j < V; ++j) z += std::exp(double(row[j] - mx));
    nats += std::log(z) + mx - row[ids[t + 1]];
  }
  const double bpb = nats / (ids.size() - 1) / std::log(2.0);
  std::printf("  4096-token forward: %.2f s, %.3f bits/byte\n", seconds, bpb);
  EXPECT_GT(bpb, 0.5);
  EXPECT_LT(bpb, 1.6);
  // Speed is reported, not asserted: timing lives in benchmarks, not tests.
}

TEST(ByteTokenizer, RoundTrip) {
  const std::string s = "a\xff\n";
  EXPECT_EQ(encode_bytes(s), (std::vector<int>{kByteBos, 'a', 255, '\n'}));
  EXPECT_EQ(encode_bytes(s, false), (std::vector<int>{'a', 255, '\n'}));
  EXPECT_EQ(decode_bytes({kByteBos, 'h', 'i', kByteEos, 300, -1}), "hi");
  EXPECT_EQ(decode_bytes(encode_bytes(s)), s);
}

}  // namespace
}  // namespace fp4kv::model
