// GPU chunked-prefill attention (attention/prefill.h) against the CPU reference
// (ref/prefill_attention.h) on the real GPU cache: the prefix [0, start) is prefilled into a
// KvCache, the chunk [start, start + T) attends to it and to itself. Shapes: one token, one
// page, page + 1, odd and mixed lengths, several prefix windows, every GPU format, both
// head sizes. Skips without a CUDA device.
//
// The oracle is the reference with the recipe's mixed-mode reads (FP16 transformed query,
// FP16 probabilities) of the same cache contents: the kernel reads the prefix's stored
// values exactly (code x block scale in BF16, page scales in FP32) with a BF16 transformed
// query and BF16 probabilities, and the chunk's own keys exactly like the reference (BF16
// q, k, v). Tolerance, relative to the row's largest output magnitude: the query's BF16
// rounding moves a prefix logit by ~2^-9 |q_i k_i| summed in quadrature (~1e-3 of a logit
// for these inputs), the probabilities' BF16 rounding moves each weight by <= 2^-9, the
// BF16 output adds 2^-9; 1e-2 bounds their sum with margin while a wrong mask, page, scale
// or merge moves outputs by O(0.1). LSE: absolute 1e-2 for the same reasons.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "fp4kv/attention/prefill.h"
#include "fp4kv/cache/kv_cache.h"
#include "fp4kv/core/error.h"
#include "fp4kv/core/half.h"
#include "fp4kv/ref/prefill_attention.h"
#include "fp4kv/testing/cuda_testing.h"

namespace fp4kv::test {
namespace {

using fp4kv::testing::DeviceBuffer;

constexpr double kOutTol = 1e-2;
constexpr double kLseTol = 1e-2;

struct PrefillCase {
  std::string recipe;
  int d = 128;
  int start = 0, T = 1;
  int window = 16384;
  int kv_heads = 2, G = 4;
  int cta_rows = 64;
  bool wgmma = false;  // PrefillMma::warpgroup
};

std::string case_name(const ::testing::TestParamInfo<PrefillCase>& info) {
  const PrefillCase& c = info.param;
  std::string name = c.recipe + "_d" + std::to_string(c.d) + "_s" + std::to_string(c.start) + "_T" +
                     std::to_string(c.T) + (c.window < 16384 ? "_w" + std::to_string(c.window) : "") +
                     (c.cta_rows != 64 ? "_rows" + std::to_string(c.cta_rows) : "") + (c.wgmma ? "_wgmma" : "");
  for (char& ch : name)
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  return name;
}

// Keys with a per-channel bias (what smoothing removes), values and queries of unit-ish scale.
std::vector<float> keys(size_t n, int d, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> bias(static_cast<size_t>(d));
  for (auto& b : bias) b = 1.5f * nd(rng);
  std::vector<float> x(n * size_t(d));
  for (size_t i = 0; i < x.size(); ++i) x[i] = bias[i % size_t(d)] + nd(rng);
  return x;
}
std::vector<float> normal(size_t n, unsigned seed, float scale) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, scale);
  std::vector<float> x(n);
  for (auto& v : x) v = nd(rng);
  return x;
}
std::vector<uint16_t> bf16(const std::vector<float>& x) {
  std::vector<uint16_t> b(x.size());
  for (size_t i = 0; i < x.size(); ++i) b[i] = float_to_bf16_bits(x[i]);
  return b;
}

class Prefill : public ::testing::TestWithParam<PrefillCase> {};

TEST_P(Prefill, MatchesTheReference) {
  SKIP_WITHOUT_GPU();
  const PrefillCase& c = GetParam();
  const Recipe recipe = parse_recipe(c.recipe);
  const int H = c.kv_heads, Hq = H * c.G, d = c.d, n = c.start + c.T;
  cache::KvCacheConfig cfg;
  cfg.layers = 1;
  cfg.kv_heads = H;
  cfg.head_dim = d;
  cfg.max_pages = (n + kPageTokens - 1) / kPageTokens;
  cfg.num_blocks = cfg.max_pages + 3;
  cfg.max_slots = 2;
  cfg.max_batch = 1;
  const std::vector<float> mu = normal(size_t(H) * d, 5, 1.0f);
  cache::KvCache cache(cfg, recipe, mu.data());

  // The request's blocks, not in order, and its K/V [n][H][d] and chunk queries [T][Hq][d].
  std::vector<int32_t> row(size_t(cfg.max_pages));
  for (int p = 0; p < cfg.max_pages; ++p) row[size_t(p)] = cfg.num_blocks - 1 - p;
  const std::vector<float> k = keys(size_t(n) * H, d, 11), v = normal(size_t(n) * H * d, 12, 1.0f);
  std::vector<float> q = normal(size_t(c.T) * Hq * d, 13, 0.3f);
  for (float& x : q) x = round_bf16(x);  // the kernel's input; the reference gets the same values
  DeviceBuffer<int32_t> drow(row);
  if (c.start > 0) {
    DeviceBuffer<float> pk(std::vector<float>(k.begin(), k.begin() + size_t(c.start) * H * d));
    DeviceBuffer<float> pv(std::vector<float>(v.begin(), v.begin() + size_t(c.start) * H * d));
    cache.prefill(0, drow.get(), 0, c.start, pk.get(), pv.get(), nullptr);
  }
  cache.begin_prefill(drow.get(), c.start, c.T, nullptr);
  attention::PrefillConfig pc;
  pc.q_heads = Hq;
  pc.max_chunk_tokens = c.T;
  pc.prefix_window = c.window;
  pc.cta_rows = c.cta_rows;
  pc.mma = c.wgmma ? attention::PrefillMma::warpgroup : attention::PrefillMma::sync;
  attention::PrefillAttention attn(cache, pc);
  DeviceBuffer<uint16_t> dq(bf16(q));
  DeviceBuffer<uint16_t> dk(bf16(std::vector<float>(k.begin() + size_t(c.start) * H * d, k.end())));
  DeviceBuffer<uint16_t> dv(bf16(std::vector<float>(v.begin() + size_t(c.start) * H * d, v.end())));
  DeviceBuffer<uint16_t> dout(size_t(c.T) * Hq * d);
  DeviceBuffer<float> dlse(size_t(c.T) * Hq);
  attn.run(0, drow.get(), c.start, c.T, dq.get(), dk.get(), dv.get(), dout.get(), dlse.get(), nullptr);
  const std::vector<uint16_t> out = dout.download();
  const std::vector<float> lse = dlse.download();
  ASSERT_EQ(cache.error_flags(), 0);

  // The oracle: the same cache contents read in mixed mode.
  Recipe oracle = recipe;
  oracle.query = QueryFormat::full;
  oracle.prob = ProbFormat::full;
  double worst = 0, worst_lse = 0;
  for (int g = 0; g < H; ++g) {
    std::vector<float> kg(size_t(n) * d), vg(size_t(n) * d), qg(size_t(c.T) * c.G * d);
    for (int t = 0; t < n; ++t)
      for (int x = 0; x < d; ++x) {
        kg[size_t(t) * d + x] = k[(size_t(t) * H + g) * d + x];
        vg[size_t(t) * d + x] = v[(size_t(t) * H + g) * d + x];
      }
    for (int t = 0; t < c.T; ++t)
      for (int j = 0; j < c.G; ++j)
        for (int x = 0; x < d; ++x) qg[(size_t(t) * c.G + j) * d + x] = q[(size_t(t) * Hq + g * c.G + j) * d + x];
    const ref::HeadSequence seq(kg.data(), vg.data(), n, d, oracle, mu.data() + size_t(g) * d);
    const ref::PrefillChunkOutput ref = ref::prefill_chunk_attention(qg.data(), c.T, c.G, seq, kg.data(), vg.data(),
                                                                     c.start);
    for (int t = 0; t < c.T; ++t)
      for (int j = 0; j < c.G; ++j) {
        const size_t kr = size_t(t) * Hq + g * c.G + j, rr = size_t(t) * c.G + j;
        double err = 0, scale = 0;
        for (int x = 0; x < d; ++x) {
          const double o = bf16_bits_to_float(out[kr * d + x]), r = ref.out[rr * d + x];
          err = std::max(err, std::fabs(o - r));
          scale = std::max(scale, std::fabs(r));
        }
        const double rel = err / std::max(scale, 1e-30);
        const double dl = std::fabs(double(lse[kr]) - ref.lse[rr]);
        worst = std::max(worst, rel);
        worst_lse = std::max(worst_lse, dl);
        ASSERT_LE(rel, kOutTol) << "token " << t << " head " << g * c.G + j;
        ASSERT_LE(dl, kLseTol) << "token " << t << " head " << g * c.G + j;
      }
  }
  std::printf("  %-16s d=%3d start=%4d T=%3d window=%5d rows=%3d: max_rel %.2e max_lse %.2e\n", c.recipe.c_str(), d,
              c.start, c.T, c.window, c.cta_rows, worst, worst_lse);
}

std::vector<PrefillCase> cases() {
  std::vector<PrefillCase> v;
  const int shapes[][2] = {{0, 1}, {0, 77}, {0, 200}, {1, 1}, {127, 1}, {128, 1}, {128, 64}, {129, 77}, {300, 200},
                           {700, 3}};
  for (const char* r : {"bf16", "fp8", "nvfp4", "nvfp4-native", "mxfp4", "mxfp4-native"})
    for (const auto& s : shapes) v.push_back(PrefillCase{r, 128, s[0], s[1]});
  for (const char* r : {"bf16", "nvfp4", "mxfp4"}) v.push_back(PrefillCase{r, 64, 300, 130});
  v.push_back(PrefillCase{"nvfp4", 128, 700, 65, 256});  // three prefix windows
  v.push_back(PrefillCase{"nvfp4", 128, 700, 65, 128});  // six
  v.push_back(PrefillCase{"nvfp4:no-recent", 128, 200, 50});
  v.push_back(PrefillCase{"nvfp4:no-recent", 128, 256, 1});
  v.push_back(PrefillCase{"nvfp4", 128, 40, 30, 16384, 1, 8});  // one KV head, group of 8
  // The 128-row CTAs (two m-tiles per warp): every format after a prefix, from scratch with a
  // partial last CTA, several windows, head_dim 64.
  for (const char* r : {"bf16", "fp8", "nvfp4", "mxfp4-native"}) v.push_back(PrefillCase{r, 128, 300, 200, 16384, 2, 4, 128});
  v.push_back(PrefillCase{"nvfp4", 128, 0, 130, 16384, 2, 4, 128});
  v.push_back(PrefillCase{"nvfp4", 128, 700, 65, 256, 2, 4, 128});
  v.push_back(PrefillCase{"mxfp4", 64, 129, 77, 16384, 2, 4, 128});
  // Warpgroup MMA (head_dim 128; head_dim 64 falls back to mma.sync): every format from scratch
  // and after a prefix, one and several CTAs, several windows, a group of 8.
  const int wgmma_shapes[][2] = {{0, 1}, {0, 77}, {0, 300}, {1, 1}, {129, 77}, {300, 200}, {700, 3}};
  for (const char* r : {"bf16", "fp8", "nvfp4", "nvfp4-native", "mxfp4", "mxfp4-native"})
    for (const auto& s : wgmma_shapes) v.push_back(PrefillCase{r, 128, s[0], s[1], 16384, 2, 4, 64, true});
  v.push_back(PrefillCase{"nvfp4", 128, 700, 65, 256, 2, 4, 64, true});
  v.push_back(PrefillCase{"bf16", 128, 0, 1100, 16384, 2, 4, 64, true});  // 18 key tiles: each buffer refilled 5 times
  v.push_back(PrefillCase{"nvfp4", 128, 40, 30, 16384, 1, 8, 64, true});
  v.push_back(PrefillCase{"mxfp4", 64, 129, 77, 16384, 2, 4, 64, true});
  return v;
}

INSTANTIATE_TEST_SUITE_P(Shapes, Prefill, ::testing::ValuesIn(cases()), case_name);

TEST(PrefillErrors, BadGeometryAndRunArguments) {
  SKIP_WITHOUT_GPU();
  cache::KvCacheConfig cfg;
  cfg.layers = 1;
  cfg.kv_heads = 2;
  cfg.head_dim = 128;
  cfg.max_pages = 2;
  cfg.num_blocks = 4;
  cfg.max_slots = 1;
  cfg.max_batch = 1;
  cache::KvCache cache(cfg, parse_recipe("nvfp4"));
  auto message_of = [&](const attention::PrefillConfig& pc) -> std::string {
    try {
      attention::PrefillAttention a(cache, pc);
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  attention::PrefillConfig pc;
  pc.q_heads = 3;
  EXPECT_NE(message_of(pc).find("q_heads 3"), std::string::npos);
  pc.q_heads = 8;
  pc.prefix_window = 100;
  EXPECT_NE(message_of(pc).find("prefix_window 100"), std::string::npos);
  pc.prefix_window = 256;
  pc.cta_rows = 96;
  EXPECT_NE(message_of(pc).find("cta_rows 96"), std::string::npos);
  pc.cta_rows = 64;
  pc.prefix_window = 256;
  pc.max_chunk_tokens = 64;
  attention::PrefillAttention a(cache, pc);
  DeviceBuffer<uint16_t> buf(size_t(64) * 8 * 128);
  DeviceBuffer<int32_t> row(std::vector<int32_t>{0, 1});
  EXPECT_THROW(a.run(0, row.get(), 0, 65, buf.get(), buf.get(), buf.get(), buf.get(), nullptr, nullptr), Error);
  EXPECT_THROW(a.run(1, row.get(), 0, 1, buf.get(), buf.get(), buf.get(), buf.get(), nullptr, nullptr), Error);
  EXPECT_THROW(a.run(0, row.get(), 250, 10, buf.get(), buf.get(), buf.get(), buf.get(), nullptr, nullptr), Error);
}

}  // namespace
}  // namespace fp4kv::test
