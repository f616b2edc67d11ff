// Uses each installed fp4kv layer once and checks the result against what the API
// documents (not against numbers copied from a run). Prints "fp4kv consumer: OK" and
// returns 0, or names each failed check and returns 1.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "fp4kv/cache/host_page.h"
#include "fp4kv/cache/layout.h"
#include "fp4kv/core/block_quant.h"
#include "fp4kv/core/error.h"
#include "fp4kv/core/minifloat.h"
#include "fp4kv/core/recipe.h"
#include "fp4kv/core/tensor_quant.h"
#include "fp4kv/eval/kl.h"
#include "fp4kv/model/qwen3_config.h"
#include "fp4kv/ref/attention.h"
#include "fp4kv/ref/quant_page.h"

#ifdef FP4KV_CONSUMER_ATTENTION
bool consumer_decode_checks();
int consumer_attended_pages();
#endif

namespace {

int failures = 0;

void check(bool ok, const std::string& what) {
  if (!ok) {
    std::printf("FAIL: %s\n", what.c_str());
    ++failures;
  }
}

std::vector<float> randn(size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(n);
  for (float& v : x) v = normal(rng);
  return x;
}

void recipes() {
  const fp4kv::Recipe r = fp4kv::parse_recipe("nvfp4-native:no-dualq");
  check(r.kv == fp4kv::KvFormat::nvfp4 && r.fp4() && r.native(), "nvfp4-native is native NVFP4");
  check(r.query != fp4kv::QueryFormat::dual_fp4, "no-dualq turns the dual-residual query off");
  check(r.block() == 16, "NVFP4 block is 16");
  check(fp4kv::parse_recipe("mxfp4").block() == 32, "MXFP4 block is 32");
  check(fp4kv::parse_recipe_list("bf16,fp8").size() == 2, "recipe list of two");
  bool threw = false;
  try {
    fp4kv::parse_recipe("nvfp9");
  } catch (const fp4kv::Error& e) {
    threw = std::string(e.what()).find("nvfp9") != std::string::npos;
  }
  check(threw, "an unknown recipe throws fp4kv::Error naming it");
}

void quantization() {
  // Header-only E2M1 codec: every non-negative grid value survives a round trip.
  for (float v : {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f})
    check(fp4kv::e2m1_value(fp4kv::e2m1_encode(v)) == v, "E2M1 round trip of " + std::to_string(v));

  // Library: quantize 64 values to NVFP4 and back. Each value lands within half an E2M1
  // step of its block's scale: at most amax/6 * (1 + E4M3 rounding), bounded by amax/4.
  const std::vector<float> x = randn(64, 7);
  const fp4kv::QuantizedTensor t = fp4kv::quantize_tensor(x.data(), x.size(), fp4kv::KvFormat::nvfp4, false);
  check(t.codes.size() == 32 && t.scales.size() == 4, "64 NVFP4 values: 32 code bytes, 4 block scales");
  const std::vector<float> y = fp4kv::dequantize_tensor(t);
  check(y.size() == x.size(), "dequantized size");
  for (size_t b = 0; b < 4 && y.size() == x.size(); ++b) {
    float amax = 0.0f, err = 0.0f;
    for (size_t i = 16 * b; i < 16 * b + 16; ++i) {
      amax = std::fmax(amax, std::fabs(x[i]));
      err = std::fmax(err, std::fabs(x[i] - y[i]));
    }
    check(err <= amax / 4, "NVFP4 round-trip error of block " + std::to_string(b));
  }
  const fp4kv::QuantizedTensor u = fp4kv::QuantizedTensor::parse(t.serialize(), t.format, t.size);
  check(u.codes == t.codes && u.scales == t.scales && u.g == t.g, "serialize/parse round trip");
}

void reference_and_cache() {
  // fp32 recipe = no rounding: the quantized-attention oracle equals exact attention.
  const int G = 2, n = 300, d = 64;
  const std::vector<float> q = randn(G * d, 1), k = randn(n * d, 2), v = randn(n * d, 3);
  const fp4kv::ref::AttentionOutput e = fp4kv::ref::exact_attention(q.data(), G, k.data(), v.data(), n, d);
  const fp4kv::ref::AttentionOutput f =
      fp4kv::ref::decode_attention(q.data(), G, k.data(), v.data(), n, d, fp4kv::parse_recipe("fp32"));
  check(e.out.size() == size_t(G * d) && f.out.size() == e.out.size(), "attention output sizes");
  for (size_t i = 0; i < e.out.size() && i < f.out.size(); ++i)
    check(std::fabs(e.out[i] - f.out[i]) <= 1e-4f, "fp32 attention matches exact at " + std::to_string(i));

  // A quantized page packs into the cache byte layout and unpacks to the same codes.
  const fp4kv::Recipe r = fp4kv::parse_recipe("nvfp4-vanilla");
  const fp4kv::ref::QuantPage p = fp4kv::ref::quantize_page(k.data(), v.data(), fp4kv::kPageTokens, d, r);
  const fp4kv::cache::PageLayout layout = fp4kv::cache::PageLayout::make(r.kv, d);
  std::vector<uint8_t> bytes(layout.bytes);
  fp4kv::cache::pack_page(p, layout, bytes.data());
  const fp4kv::ref::QuantPage back = fp4kv::cache::unpack_page(bytes.data(), layout);
  check(back.k_codes == p.k_codes && back.v_codes == p.v_codes && back.k_scales == p.k_scales &&
            back.v_scales == p.v_scales && back.k_g == p.k_g && back.v_g == p.v_g,
        "cache page pack/unpack round trip");
}

void model_and_eval() {
  const fp4kv::model::Qwen3Config c = fp4kv::model::Qwen3Config::parse(R"({
    "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": 10,
    "hidden_size": 8, "intermediate_size": 16, "num_hidden_layers": 1,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 4, "rms_norm_eps": 1e-6,
    "tie_word_embeddings": true, "attention_bias": false, "use_sliding_window": false,
    "bos_token_id": 8, "eos_token_id": 9,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}})");
  check(c.group_size() == 2 && c.head_dim == 4 && c.is_eos(9), "Qwen3 config parsed");
  // Differences 1, 2, 3: mean 2, sd 1, t = 2 * sqrt(3).
  const double t = fp4kv::eval::paired_t({1, 2, 3}, {0, 0, 0});
  check(std::fabs(t - 2 * std::sqrt(3.0)) < 1e-9, "paired t of 1, 2, 3");
}

}  // namespace

int main() {
  try {
    recipes();
    quantization();
    reference_and_cache();
    model_and_eval();
#ifdef FP4KV_CONSUMER_ATTENTION
    check(consumer_decode_checks(), "attention: DecodeAttention accepts Qwen3-4B's shape and refuses head_dim 96");
    check(consumer_attended_pages() == 3, "attention: 300 BF16 tokens attend 3 pages");
    std::printf("fp4kv consumer: attention linked\n");
#endif
  } catch (const std::exception& e) {
    std::printf("FAIL: exception: %s\n", e.what());
    ++failures;
  }
  if (failures) {
    std::printf("fp4kv consumer: %d checks FAILED\n", failures);
    return 1;
  }
  std::printf("fp4kv consumer: OK\n");
  return 0;
}
