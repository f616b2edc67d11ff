// MLA decode (attention/mla_decode.h) on the GPU against its CPU twins.
//
// BF16 latent cache against ref::exact_mla on the cache's own values (the BF16-rounded
// latents, positional keys and queries), over rows of 1, 64 (a half page), 65, 128 (a page),
// 129, 300 and 0 tokens in one batch, 16 and 128 heads, one and three splits (a split may
// hold no tile), BF16 and FP32 output. Tolerance: the kernel rounds P to BF16 before P C
// (relative error <= 2^-9 per probability) and normalizes by the sum of the unrounded ones,
// so |u - u_exact| <= 2^-9 max|c|; the FP32 sums add ~1e-6. Bound 2^-8 max|c| (twice that).
// BF16 output adds its own rounding, 2^-9 |u|. The LSE comes from FP32 logits: 1e-3.
//
// FP4 latent caches (NVFP4, MXFP4, mixed mode, every switch that changes the data path)
// against ref::MlaSequence::decode: the pages and slot rows are packed from the reference's
// own cache, so both sides attend to identical stored values and differ only in arithmetic
// (derivation in fp4_bound below).
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "fp4kv/attention/kv_cache_adapter.h"
#include "fp4kv/attention/mla_decode.h"
#include "fp4kv/cache/kv_cache.h"
#include "fp4kv/cache/host_page.h"
#include "fp4kv/core/half.h"
#include "fp4kv/ref/mla.h"
#include "fp4kv/ref/query_operand.h"
#include "fp4kv/testing/cuda_testing.h"

namespace fp4kv::test {
namespace {

using attention::MlaCapacity;
using attention::MlaDecodeAttention;
using attention::MlaGeometry;
using attention::MlaStep;

constexpr int kDc = 512, kDr = 64;

std::vector<float> bf16_randn(size_t n, float scale, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = round_bf16(scale * normal(rng));
  return v;
}

std::vector<__nv_bfloat16> to_bf16(const std::vector<float>& v) {
  std::vector<__nv_bfloat16> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = __float2bfloat16_rn(v[i]);
  return out;
}

// Runs one step (BF16 or FP32 output) and returns the output and LSE.
struct GpuResult {
  std::vector<float> out, lse;
};
GpuResult run_gpu(MlaDecodeAttention& attn, const MlaStep& step, const __nv_bfloat16* q_c, const __nv_bfloat16* q_r,
                  int heads_total, bool bf16_out) {
  GpuResult g;
  testing::DeviceBuffer<float> d_lse(heads_total);
  if (bf16_out) {
    testing::DeviceBuffer<__nv_bfloat16> d_out(size_t(heads_total) * kDc);
    attn.run(step, q_c, q_r, d_out.get(), d_lse.get());
    for (__nv_bfloat16 x : d_out.download()) g.out.push_back(__bfloat162float(x));
  } else {
    testing::DeviceBuffer<float> d_out(size_t(heads_total) * kDc);
    attn.run(step, q_c, q_r, d_out.get(), d_lse.get());
    g.out = d_out.download();
  }
  g.lse = d_lse.download();
  return g;
}

// A row with no tokens: output 0 and LSE -inf for every head.
void expect_empty_row(const std::vector<float>& out, const std::vector<float>& lse, size_t row, int H) {
  for (int h = 0; h < H; ++h) {
    EXPECT_TRUE(std::isinf(lse[row + h]) && lse[row + h] < 0) << "empty row, head " << h;
    for (int x = 0; x < kDc; ++x) ASSERT_EQ(out[(row + h) * kDc + x], 0.0f) << "empty row";
  }
}

struct MlaCase {
  int heads, splits;
  bool bf16_out;
};

void run_case(const MlaCase& mc) {
  const std::vector<int> lens = {1, 64, 65, 128, 129, 300, 0};
  const int batch = int(lens.size()), max_pages = 3, H = mc.heads;
  const MlaGeometry geometry{H, kDc, kDr, 128};
  MlaDecodeAttention attn(geometry, parse_recipe("bf16"), MlaCapacity{batch, max_pages, 4});
  const cache::LatentPageLayout& L = attn.layout();
  std::mt19937 rng(11 + H + mc.splits);

  // Per row: latents, positional keys, queries; the pool holds the row's pages in blocks
  // row * max_pages + p, in reverse order (a block table is not the identity).
  std::vector<std::vector<float>> c(batch), r(batch), qc(batch), qr(batch);
  std::vector<uint8_t> pool(size_t(batch) * max_pages * L.bytes);
  std::vector<int32_t> tables(size_t(batch) * max_pages);
  for (int b = 0; b < batch; ++b) {
    c[b] = bf16_randn(size_t(max_pages) * 128 * kDc, 1.0f, rng);
    r[b] = bf16_randn(size_t(max_pages) * 128 * kDr, 1.0f, rng);
    qc[b] = bf16_randn(size_t(H) * kDc, 0.5f, rng);
    qr[b] = bf16_randn(size_t(H) * kDr, 0.5f, rng);
    for (int p = 0; p < max_pages; ++p) {
      const int block = b * max_pages + (max_pages - 1 - p);
      tables[size_t(b) * max_pages + p] = block;
      const int tokens = std::max(0, std::min(128, lens[b] - 128 * p));
      cache::pack_bf16_latent_page(c[b].data() + size_t(p) * 128 * kDc, r[b].data() + size_t(p) * 128 * kDr, tokens,
                                   L, pool.data() + size_t(block) * L.bytes);
    }
  }
  std::vector<float> q_c_all, q_r_all;
  for (int b = 0; b < batch; ++b) {
    q_c_all.insert(q_c_all.end(), qc[b].begin(), qc[b].end());
    q_r_all.insert(q_r_all.end(), qr[b].begin(), qr[b].end());
  }
  testing::DeviceBuffer<uint8_t> d_pool(pool);
  testing::DeviceBuffer<int32_t> d_tables(tables), d_lens(std::vector<int32_t>(lens.begin(), lens.end()));
  testing::DeviceBuffer<__nv_bfloat16> d_qc(to_bf16(q_c_all)), d_qr(to_bf16(q_r_all));
  MlaStep step{d_pool.get(), L.bytes, d_tables.get(), d_lens.get(), batch, mc.splits};
  const auto [out, lse] = run_gpu(attn, step, d_qc.get(), d_qr.get(), batch * H, mc.bf16_out);

  const ref::MlaShape shape{kDc, kDr, 128};
  for (int b = 0; b < batch; ++b) {
    const size_t row = size_t(b) * H;
    if (lens[b] == 0) {
      expect_empty_row(out, lse, row, H);
      continue;
    }
    const ref::MlaOutput want = ref::exact_mla(qc[b].data(), qr[b].data(), H, c[b].data(), r[b].data(), lens[b], shape);
    double cmax = 0;
    for (int t = 0; t < lens[b]; ++t)
      for (int x = 0; x < kDc; ++x) cmax = std::max(cmax, double(std::fabs(c[b][size_t(t) * kDc + x])));
    double err = 0, lse_err = 0;
    for (int h = 0; h < H; ++h) {
      lse_err = std::max(lse_err, std::fabs(double(lse[row + h]) - double(want.lse[h])));
      for (int x = 0; x < kDc; ++x) {
        const double w = want.out[size_t(h) * kDc + x];
        const double bound = std::ldexp(cmax, -8) + (mc.bf16_out ? std::ldexp(std::fabs(w), -9) : 0.0);
        const double e = std::fabs(double(out[(row + h) * kDc + x]) - w);
        err = std::max(err, e / bound);
      }
    }
    std::printf("heads %3d splits %d %s: %3d tokens: max error %.3f of the bound, LSE error %.2e\n", H, mc.splits,
                mc.bf16_out ? "bf16" : "fp32", lens[b], err, lse_err);
    EXPECT_LE(err, 1.0) << lens[b] << " tokens";
    EXPECT_LE(lse_err, 1e-3) << lens[b] << " tokens";
  }
}

TEST(MlaDecodeGpu, Bf16CacheMatchesExactMla) {
  SKIP_WITHOUT_GPU();
  for (const MlaCase& mc : {MlaCase{16, 1, false}, MlaCase{16, 3, false}, MlaCase{128, 1, true}, MlaCase{128, 3, false}})
    run_case(mc);
}

TEST(MlaDecodeGpu, BadStepsAreClearErrors) {
  SKIP_WITHOUT_GPU();
  MlaDecodeAttention attn(MlaGeometry{16}, parse_recipe("bf16"), MlaCapacity{2, 2, 2});
  testing::DeviceBuffer<uint8_t> pool(size_t(4) * attn.layout().bytes);
  testing::DeviceBuffer<int32_t> tables(4), lens(2);
  testing::DeviceBuffer<__nv_bfloat16> q(size_t(2) * 16 * kDc);
  testing::DeviceBuffer<float> out(size_t(2) * 16 * kDc);
  MlaStep step{pool.get(), attn.layout().bytes, tables.get(), lens.get(), 2, 1};
  auto expect_error = [&](MlaStep s, const char* what) {
    try {
      attn.run(s, q.get(), q.get(), out.get(), nullptr);
      ADD_FAILURE() << "no error for " << what;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  MlaStep s = step;
  s.batch = 3;
  expect_error(s, "batch 3");
  s = step;
  s.splits = 3;
  expect_error(s, "splits 3");
  s = step;
  s.block_stride = 8;
  expect_error(s, "block_stride 8");
  s = step;
  s.seq_lens = nullptr;
  expect_error(s, "null");
}

// ---- FP4 latent caches ----------------------------------------------------------------------

// Latents with the structure the recipe is for (as in tests/ref/test_mla.cpp): a per-channel
// mean, unit noise, 8 outlier channels of mean +-10 and spread 4.
std::vector<float> structured_latents(int n, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> mean(kDc), spread(kDc, 1.0f);
  for (float& m : mean) m = normal(rng);
  for (int i = 0; i < 8; ++i) {
    const int ch = (i * 67 + 5) % kDc;
    mean[ch] = i % 2 ? 10.0f : -10.0f;
    spread[ch] = 4.0f;
  }
  std::vector<float> c(size_t(n) * kDc);
  for (int t = 0; t < n; ++t)
    for (int x = 0; x < kDc; ++x) c[size_t(t) * kDc + x] = mean[x] + spread[x] * normal(rng);
  return c;
}

// Both sides attend to the same stored values v_t (dequantized pages, BF16 rows) with the
// same FP16 rotated query against pages; they differ in
//   - the weights p_t: FP16 rounding of P at different running maxima (GPU per 64-token
//     tile, reference per page: 2^-11 each side), BF16 P on the GPU's BF16 rows (2^-9, the
//     reference keeps FP32), and logit differences ds (base 2): the BF16 query against BF16
//     rows (2^-9 relative per product) and FP32 accumulation orders (< 2^-15 relative per
//     product over 576 terms), so |ds_t| <= gamma 2^-8 sum_i |q'_i v_ti| (+ the same for the
//     positional part);
//   - the output's rounding (BF16 output 2^-9 |u|) and FP32 sums (~1e-6 relative).
// Every weight within a factor (1 + eps), eps = 2^-10 + 2^-9 + (2^ds_max - 1), moves
// u' = sum p v / sum p by at most 2 eps / (1 - eps) max_t ||v_t - u'|| <= 4 eps max_t ||v_t||
// (L2; the rotation back preserves it, mu_c is added exactly on both sides). The LSE moves
// by at most ln(1 + eps) + the FP32 sum noise.
struct Fp4Bound {
  double out_l2 = 0;  // bound on ||u_gpu - u_ref|| of one head
  double lse = 0;     // nats
};
Fp4Bound fp4_bound(const std::vector<float>& q_prime, const float* q_r, const ref::HeadSequence::View& v,
                   const std::vector<float>& r_rows_bf16, const std::vector<float>& r_all, float gamma_log2,
                   double u_norm, bool bf16_out) {
  const DecodeLayout& L = v.view.layout;
  double ds_max = 0, vmax = 0;
  auto visit = [&](const float* row, const float* r) {
    double dot = 0, norm = 0;
    for (int i = 0; i < kDc; ++i) {
      dot += std::fabs(double(q_prime[i]) * row[i]);
      norm += double(row[i]) * row[i];
    }
    for (int i = 0; i < kDr; ++i) dot += std::fabs(double(q_r[i]) * r[i]);
    ds_max = std::max(ds_max, gamma_log2 * std::ldexp(dot, -8));
    vmax = std::max(vmax, std::sqrt(norm));
  };
  std::vector<float> row(kDc);
  for (int pg = 0; pg < L.quant_pages; ++pg) {
    const ref::QuantPage& page = *v.view.pages[pg];
    const int end = pg == L.quant_pages - 1 ? L.last_page_tokens : 128;
    for (int t = 0; t < end; ++t) {
      for (int x = 0; x < kDc; ++x) row[x] = page.k_value(t, x);
      visit(row.data(), r_all.data() + (size_t(pg) * 128 + t) * kDr);
    }
  }
  for (int i = 0; i < L.bf16_tokens(); ++i) visit(v.bf16_k.data() + size_t(i) * kDc, r_rows_bf16.data() + size_t(i) * kDr);
  const double eps = std::ldexp(1.0, -10) + std::ldexp(1.0, -9) + (std::exp2(ds_max) - 1.0);
  Fp4Bound b;
  b.out_l2 = 4 * eps * vmax + 1e-5 * vmax + (bf16_out ? std::ldexp(u_norm, -9) : 0.0);
  b.lse = std::log1p(eps) + 1e-4;
  return b;
}

struct Fp4Case {
  const char* recipe;
  int heads, splits;
  bool bf16_out;
};

void run_fp4_case(const Fp4Case& fc) {
  const Recipe recipe = parse_recipe(fc.recipe);
  const std::vector<int> lens = {1, 16, 17, 64, 127, 128, 129, 144, 200, 256, 257, 400, 0};
  const int batch = int(lens.size()), max_pages = 4, H = fc.heads, slots = batch + 2;
  const MlaGeometry geometry{H, kDc, kDr, 128};
  MlaDecodeAttention attn(geometry, recipe, MlaCapacity{batch, max_pages, 4});
  const cache::LatentPageLayout& L = attn.layout();
  std::mt19937 rng(29 + H + fc.splits);
  const ref::MlaShape shape{kDc, kDr, 128};

  // One latent stream for all rows (a row of n tokens takes the first n), its mean as mu_c.
  const int n_max = max_pages * 128;
  const std::vector<float> c = structured_latents(n_max, rng);
  const std::vector<float> r = bf16_randn(size_t(n_max) * kDr, 1.0f, rng);
  std::vector<float> mu(kDc, 0.0f);
  for (int t = 0; t < n_max; ++t)
    for (int x = 0; x < kDc; ++x) mu[x] += c[size_t(t) * kDc + x] / n_max;

  std::vector<uint8_t> pool(size_t(batch) * max_pages * L.bytes, 0);
  std::vector<int32_t> tables(size_t(batch) * max_pages);
  std::vector<uint16_t> slot_rows(size_t(slots) * cache::kSlotRows * (kDc + kDr), 0);
  std::vector<int32_t> row_slot(batch);
  std::vector<float> q_c_all, q_r_all;
  std::vector<ref::MlaOutput> want(batch);
  std::vector<std::vector<Fp4Bound>> bounds(batch);
  auto put_row = [&](int slot, int slot_row, const float* latent, const float* rope) {
    uint16_t* dst = slot_rows.data() + cache::latent_slot_row_offset(0, slot, slot_row, slots, kDc, kDr);
    for (int x = 0; x < kDc; ++x) dst[x] = float_to_bf16_bits(latent[x]);
    for (int x = 0; x < kDr; ++x) dst[kDc + x] = float_to_bf16_bits(rope[x]);
  };
  for (int b = 0; b < batch; ++b) {
    const int n = lens[b];
    const std::vector<float> qc = bf16_randn(size_t(H) * kDc, 0.5f, rng), qr = bf16_randn(size_t(H) * kDr, 0.5f, rng);
    q_c_all.insert(q_c_all.end(), qc.begin(), qc.end());
    q_r_all.insert(q_r_all.end(), qr.begin(), qr.end());
    row_slot[b] = slots - 1 - b;  // slots are not the row order
    for (int p = 0; p < max_pages; ++p) tables[size_t(b) * max_pages + p] = b * max_pages + (max_pages - 1 - p);
    if (n == 0) continue;
    const ref::MlaSequence seq(c.data(), r.data(), n, shape, recipe, mu.data());
    want[b] = seq.decode(qc.data(), qr.data(), H, n);
    ref::HeadSequence::View v;
    seq.latent().view(n, v);
    const DecodeLayout& dl = v.view.layout;
    const std::vector<float>& rb = seq.rope_keys();
    for (int pg = 0; pg < dl.quant_pages; ++pg) {
      const int block = tables[size_t(b) * max_pages + pg];
      cache::pack_latent_page(*v.view.pages[pg], rb.data() + size_t(pg) * 128 * kDr, std::min(128, n - 128 * pg), L,
                              pool.data() + size_t(block) * L.bytes);
    }
    // Slot rows: sink rows 0.., recent token t in row 16 + t % 128; the reference's gathered
    // rows come sink first, then recent.
    std::vector<float> r_gathered;
    for (int t = 0; t < dl.sink_tokens; ++t) {
      put_row(row_slot[b], t, v.bf16_k.data() + size_t(t) * kDc, rb.data() + size_t(t) * kDr);
      r_gathered.insert(r_gathered.end(), rb.begin() + size_t(t) * kDr, rb.begin() + size_t(t + 1) * kDr);
    }
    for (int t = dl.recent_begin; t < dl.recent_end; ++t) {
      const int i = dl.sink_tokens + t - dl.recent_begin;
      put_row(row_slot[b], kSinkTokens + t % 128, v.bf16_k.data() + size_t(i) * kDc, rb.data() + size_t(t) * kDr);
      r_gathered.insert(r_gathered.end(), rb.begin() + size_t(t) * kDr, rb.begin() + size_t(t + 1) * kDr);
    }
    const float gamma_log2 = float(1.4426950408889634 / std::sqrt(128.0 + kDr));
    for (int h = 0; h < H; ++h) {
      const std::vector<float> qp = ref::transformed_query(qc.data() + size_t(h) * kDc, kDc, recipe);
      double u_norm = 0;
      for (int x = 0; x < kDc; ++x) u_norm += double(want[b].out[size_t(h) * kDc + x]) * want[b].out[size_t(h) * kDc + x];
      bounds[b].push_back(fp4_bound(qp, qr.data() + size_t(h) * kDr, v, r_gathered, rb, gamma_log2, std::sqrt(u_norm),
                                    fc.bf16_out));
    }
  }

  testing::DeviceBuffer<uint8_t> d_pool(pool);
  testing::DeviceBuffer<int32_t> d_tables(tables), d_lens(std::vector<int32_t>(lens.begin(), lens.end())),
      d_slot(row_slot);
  testing::DeviceBuffer<uint16_t> d_slot_rows(slot_rows);
  testing::DeviceBuffer<float> d_mu(mu);
  testing::DeviceBuffer<__nv_bfloat16> d_qc(to_bf16(q_c_all)), d_qr(to_bf16(q_r_all));
  MlaStep step{d_pool.get(), L.bytes, d_tables.get(), d_lens.get(), batch, fc.splits};
  step.slot_rows = d_slot_rows.get();
  step.row_slot = d_slot.get();
  step.mu_c = d_mu.get();
  const auto [out, lse] = run_gpu(attn, step, d_qc.get(), d_qr.get(), batch * H, fc.bf16_out);

  for (int b = 0; b < batch; ++b) {
    const size_t row = size_t(b) * H;
    if (lens[b] == 0) {
      expect_empty_row(out, lse, row, H);
      continue;
    }
    double worst = 0, worst_lse = 0;
    for (int h = 0; h < H; ++h) {
      double e2 = 0;
      for (int x = 0; x < kDc; ++x) {
        const double d = double(out[(row + h) * kDc + x]) - want[b].out[size_t(h) * kDc + x];
        e2 += d * d;
      }
      ASSERT_TRUE(std::isfinite(e2)) << fc.recipe << " " << lens[b] << " tokens, head " << h;
      worst = std::max(worst, std::sqrt(e2) / bounds[b][h].out_l2);
      worst_lse = std::max(worst_lse, std::fabs(double(lse[row + h]) - want[b].lse[h]) / bounds[b][h].lse);
    }
    std::printf("%-16s heads %3d splits %d %s: %3d tokens: output error %.3f, LSE error %.3f of the bound\n", fc.recipe,
                H, fc.splits, fc.bf16_out ? "bf16" : "fp32", lens[b], worst, worst_lse);
    EXPECT_LE(worst, 1.0) << fc.recipe << " " << lens[b] << " tokens";
    EXPECT_LE(worst_lse, 1.0) << fc.recipe << " " << lens[b] << " tokens";
  }
}

TEST(MlaDecodeGpu, Fp4CacheMatchesReference) {
  SKIP_WITHOUT_GPU();
  for (const Fp4Case& fc : {Fp4Case{"nvfp4", 16, 1, false}, Fp4Case{"nvfp4", 16, 3, true}, Fp4Case{"mxfp4", 16, 2, false},
                            Fp4Case{"mxfp4", 128, 1, true}, Fp4Case{"nvfp4", 64, 4, false}})
    run_fp4_case(fc);
}

// The switches that change the kernel's data path: no smoothing (no mu_c, no LSE shift), no
// rotation (the query and output stay in the latent basis), no BF16 sink, and quantize on
// write (partial pages, no recent rows).
TEST(MlaDecodeGpu, Fp4RecipeSwitchesMatchReference) {
  SKIP_WITHOUT_GPU();
  for (const Fp4Case& fc : {Fp4Case{"nvfp4-vanilla", 16, 2, false}, Fp4Case{"mxfp4-vanilla", 16, 1, false},
                            Fp4Case{"nvfp4:no-rotate", 16, 2, false}, Fp4Case{"nvfp4:no-smooth", 16, 1, false},
                            Fp4Case{"mxfp4:no-sink", 16, 3, false}, Fp4Case{"nvfp4:no-recent", 16, 2, false}})
    run_fp4_case(fc);
}

// The whole GPU path: a latent KvCache filled by chunked prefill and decode appends (its
// quantizer and promotions), read by the kernel through mla_step, against the reference over
// the same tokens. Two rows of different lengths decode together.
TEST(MlaDecodeGpu, Fp4LatentCacheDecodeMatchesReference) {
  SKIP_WITHOUT_GPU();
  for (const char* spec : {"nvfp4", "mxfp4", "nvfp4:no-recent"}) {
    const Recipe recipe = parse_recipe(spec);
    constexpr int kHeads = 32, kMaxPages = 4, kSteps = 9;
    const std::vector<int> prompt = {250, 60};
    const int batch = int(prompt.size());
    cache::KvCacheConfig cfg;
    cfg.kv_heads = 1;
    cfg.head_dim = kDc;
    cfg.rope_dim = kDr;
    cfg.num_blocks = batch * kMaxPages;
    cfg.max_slots = 4;
    cfg.max_batch = batch;
    cfg.max_pages = kMaxPages;
    std::mt19937 rng(5);
    const int n_max = kMaxPages * 128;
    std::vector<std::vector<float>> c(batch), r(batch);
    std::vector<float> mu(kDc, 0.0f);
    for (int b = 0; b < batch; ++b) {
      c[b] = structured_latents(n_max, rng);
      r[b] = bf16_randn(size_t(n_max) * kDr, 1.0f, rng);
      for (int t = 0; t < n_max; ++t)
        for (int x = 0; x < kDc; ++x) mu[x] += c[b][size_t(t) * kDc + x] / float(batch * n_max);
    }
    cache::KvCache kv(cfg, recipe, mu.data());
    std::vector<int32_t> tables(size_t(batch) * kMaxPages);
    for (size_t i = 0; i < tables.size(); ++i) tables[i] = int32_t(tables.size() - 1 - i);
    testing::DeviceBuffer<int32_t> d_tables(tables);
    std::vector<int> n(batch, 0);
    for (int b = 0; b < batch; ++b) {
      testing::DeviceBuffer<float> dc(std::vector<float>(c[b].begin(), c[b].begin() + size_t(prompt[b]) * kDc));
      testing::DeviceBuffer<float> dr(std::vector<float>(r[b].begin(), r[b].begin() + size_t(prompt[b]) * kDr));
      kv.prefill(0, d_tables.get() + size_t(b) * kMaxPages, 0, prompt[b], dc.get(), dr.get(), nullptr);
      n[b] = prompt[b];
    }
    MlaDecodeAttention attn(MlaGeometry{kHeads, kDc, kDr, 128}, recipe, MlaCapacity{batch, kMaxPages, 4});
    std::vector<float> qc = bf16_randn(size_t(batch) * kHeads * kDc, 0.5f, rng);
    std::vector<float> qr = bf16_randn(size_t(batch) * kHeads * kDr, 0.5f, rng);
    testing::DeviceBuffer<__nv_bfloat16> d_qc(to_bf16(qc)), d_qr(to_bf16(qr));
    testing::DeviceBuffer<float> d_out(size_t(batch) * kHeads * kDc), d_lse(size_t(batch) * kHeads);
    for (int step = 0; step < kSteps; ++step) {
      std::vector<float> hc, hr;
      std::vector<int32_t> lens;
      for (int b = 0; b < batch; ++b) {
        hc.insert(hc.end(), c[b].begin() + size_t(n[b]) * kDc, c[b].begin() + size_t(n[b] + 1) * kDc);
        hr.insert(hr.end(), r[b].begin() + size_t(n[b]) * kDr, r[b].begin() + size_t(n[b] + 1) * kDr);
        lens.push_back(++n[b]);
      }
      testing::DeviceBuffer<float> dc(hc), dr(hr);
      testing::DeviceBuffer<int32_t> d_lens(lens);
      kv.begin_step(d_tables.get(), d_lens.get(), batch, kMaxPages, nullptr);
      kv.append(0, dc.get(), dr.get(), nullptr);
      attn.run(attention::mla_step(kv, 0, d_tables.get(), d_lens.get(), batch, 2), d_qc.get(), d_qr.get(), d_out.get(),
               d_lse.get());
      kv.end_step(nullptr);
      FP4KV_CUDA_OK(cudaDeviceSynchronize());
    }
    ASSERT_EQ(kv.error_flags(), 0) << spec;
    const std::vector<float> out = d_out.download(), lse = d_lse.download();
    for (int b = 0; b < batch; ++b) {
      const ref::MlaSequence seq(c[b].data(), r[b].data(), n[b], ref::MlaShape{kDc, kDr, 128}, recipe, mu.data());
      const ref::MlaOutput want = seq.decode(qc.data() + size_t(b) * kHeads * kDc, qr.data() + size_t(b) * kHeads * kDr,
                                             kHeads, n[b]);
      ref::HeadSequence::View v;
      seq.latent().view(n[b], v);
      const DecodeLayout& dl = v.view.layout;
      std::vector<float> r_gathered;
      const std::vector<float>& rb = seq.rope_keys();
      for (int t = 0; t < dl.sink_tokens; ++t) r_gathered.insert(r_gathered.end(), rb.begin() + t * kDr, rb.begin() + (t + 1) * kDr);
      for (int t = dl.recent_begin; t < dl.recent_end; ++t)
        r_gathered.insert(r_gathered.end(), rb.begin() + t * kDr, rb.begin() + (t + 1) * kDr);
      double worst = 0, worst_lse = 0;
      for (int h = 0; h < kHeads; ++h) {
        const size_t head = size_t(b) * kHeads + h;
        const std::vector<float> qp = ref::transformed_query(qc.data() + head * kDc, kDc, recipe);
        const Fp4Bound bound = fp4_bound(qp, qr.data() + head * kDr, v, r_gathered, rb,
                                         float(1.4426950408889634 / std::sqrt(128.0 + kDr)), 0.0, false);
        double e2 = 0;
        for (int x = 0; x < kDc; ++x) {
          const double d = double(out[head * kDc + x]) - want.out[size_t(h) * kDc + x];
          e2 += d * d;
        }
        worst = std::max(worst, std::sqrt(e2) / bound.out_l2);
        worst_lse = std::max(worst_lse, std::fabs(double(lse[head]) - want.lse[h]) / bound.lse);
      }
      std::printf("%-16s cache path: %3d tokens: output error %.3f, LSE error %.3f of the bound\n", spec, n[b], worst,
                  worst_lse);
      EXPECT_LE(worst, 1.0) << spec << " row " << b;
      EXPECT_LE(worst_lse, 1.0) << spec << " row " << b;
    }
  }
}

TEST(MlaDecodeGpu, Fp4CacheNeedsItsSlotRows) {
  SKIP_WITHOUT_GPU();
  MlaDecodeAttention attn(MlaGeometry{16}, parse_recipe("nvfp4"), MlaCapacity{1, 1, 1});
  testing::DeviceBuffer<uint8_t> pool(attn.layout().bytes);
  testing::DeviceBuffer<int32_t> tables(1), lens(1);
  testing::DeviceBuffer<__nv_bfloat16> q(size_t(16) * kDc);
  testing::DeviceBuffer<float> out(size_t(16) * kDc);
  MlaStep step{pool.get(), attn.layout().bytes, tables.get(), lens.get(), 1, 1};
  try {
    attn.run(step, q.get(), q.get(), out.get(), nullptr);
    ADD_FAILURE() << "no error without slot rows";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("slot_rows"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace fp4kv::test
