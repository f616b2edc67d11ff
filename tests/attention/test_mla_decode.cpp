// MLA decode over the BF16 latent cache (attention/mla_decode.h) against ref::exact_mla on the
// cache's own values (the BF16-rounded latents, positional keys and queries), over rows of
// 1, 64 (a half page), 65, 128 (a page), 129, 300 and 0 tokens in one batch, 16 and 128
// heads, one and three splits (a split may hold no tile), BF16 and FP32 output.
//
// Tolerance: the kernel rounds P to BF16 before P C (relative error <= 2^-9 per
// probability) and normalizes by the sum of the unrounded ones, so |u - u_exact| <= 2^-9
// max|c|; the FP32 sums add ~1e-6. Bound 2^-8 max|c| (twice that). BF16 output adds its own
// rounding, 2^-9 |u|. The LSE comes from FP32 logits: 1e-3.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "fp4kv/attention/mla_decode.h"
#include "fp4kv/cache/host_page.h"
#include "fp4kv/core/half.h"
#include "fp4kv/ref/mla.h"
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

struct MlaCase {
  int heads, splits;
  bool bf16_out;
};

void run_case(const MlaCase& mc) {
  const std::vector<int> lens = {1, 64, 65, 128, 129, 300, 0};
  const int batch = int(lens.size()), max_pages = 3, H = mc.heads;
  const MlaGeometry geometry{H, kDc, kDr, 128};
  MlaDecodeAttention attn(geometry, KvFormat::bf16, MlaCapacity{batch, max_pages, 4});
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
  testing::DeviceBuffer<float> d_lse(size_t(batch) * H);
  MlaStep step;
  step.pool = d_pool.get();
  step.block_stride = L.bytes;
  step.block_tables = d_tables.get();
  step.seq_lens = d_lens.get();
  step.batch = batch;
  step.splits = mc.splits;
  std::vector<float> out;
  if (mc.bf16_out) {
    testing::DeviceBuffer<__nv_bfloat16> d_out(size_t(batch) * H * kDc);
    attn.run(step, d_qc.get(), d_qr.get(), d_out.get(), d_lse.get());
    for (__nv_bfloat16 x : d_out.download()) out.push_back(__bfloat162float(x));
  } else {
    testing::DeviceBuffer<float> d_out(size_t(batch) * H * kDc);
    attn.run(step, d_qc.get(), d_qr.get(), d_out.get(), d_lse.get());
    out = d_out.download();
  }
  const std::vector<float> lse = d_lse.download();

  const ref::MlaShape shape{kDc, kDr, 128};
  for (int b = 0; b < batch; ++b) {
    const size_t row = size_t(b) * H;
    if (lens[b] == 0) {
      for (int h = 0; h < H; ++h) {
        EXPECT_TRUE(std::isinf(lse[row + h]) && lse[row + h] < 0) << "empty row, head " << h;
        for (int x = 0; x < kDc; ++x) ASSERT_EQ(out[(row + h) * kDc + x], 0.0f) << "empty row";
      }
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
  MlaDecodeAttention attn(MlaGeometry{16}, KvFormat::bf16, MlaCapacity{2, 2, 2});
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

}  // namespace
}  // namespace fp4kv::test
