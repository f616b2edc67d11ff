// Helpers of the GPU cache tests (device buffers and the CUDA check come from
// fp4kv/testing/cuda_testing.h): random data with outliers, and the CPU
// model of what the cache must hold (core/transform.h + BF16 rounding + ref::quantize_page
// + host_page.h pack_page).
#pragma once

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "fp4kv/cache/host_page.h"
#include "fp4kv/cache/kv_cache.h"
#include "fp4kv/core/half.h"
#include "fp4kv/core/minifloat.h"
#include "fp4kv/core/transform.h"
#include "fp4kv/ref/quant_page.h"
#include "fp4kv/testing/cuda_testing.h"

namespace fp4kv::cache::test {

using fp4kv::testing::DeviceBuffer;

// Normal data with outliers: a few large channels (as real keys have), rare huge
// elements, some all-zero and some tiny blocks (E4M3 subnormal scales).
inline std::vector<float> random_tokens(int n, int heads, int d, unsigned seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, scale);
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  std::vector<float> x(size_t(n) * heads * d);
  for (int t = 0; t < n; ++t)
    for (int h = 0; h < heads; ++h)
      for (int c = 0; c < d; ++c) {
        float v = nd(rng);
        if (c % 37 == 5) v *= 20.0f;                // outlier channels
        if (u(rng) < 0.002f) v *= 300.0f;           // rare huge elements
        if ((t / 16 + c / 32 + h) % 11 == 3) v *= 1e-6f;  // tiny blocks
        if ((t + 3 * c / 16) % 29 == 0) v = 0.0f;   // zeros
        x[(size_t(t) * heads + h) * d + c] = v;
      }
  return x;
}

// The cached rows of head h of tokens [0, n) as the cache stores them: K transformed per
// the recipe, non-finite -> 0, rounded to BF16. in: [n][heads][d]; out: [n][d].
inline std::vector<float> cached_rows(const std::vector<float>& in, int n, int heads, int h, int d, const Recipe& r,
                                      const float* mu, bool is_key, long* nonfinite = nullptr) {
  std::vector<float> out(size_t(n) * d), t(d);
  for (int i = 0; i < n; ++i) {
    const float* row = &in[(size_t(i) * heads + h) * d];
    if (is_key) transform_key(row, mu, d, r.smooth_keys, r.rotate_keys, t.data());
    else std::copy(row, row + d, t.begin());
    for (int c = 0; c < d; ++c) {
      float v = t[c];
      if (!is_finite(v)) {
        if (nonfinite) ++*nonfinite;
        v = 0.0f;
      }
      out[size_t(i) * d + c] = round_bf16(v);
    }
  }
  return out;
}

// Expected bytes of page p (n_present tokens) of one head from its cached rows.
inline std::vector<uint8_t> expected_page(const std::vector<float>& kc, const std::vector<float>& vc, int page,
                                          int n_present, int d, const Recipe& r, const PageLayout& l) {
  std::vector<uint8_t> bytes(l.bytes);
  if (r.kv == KvFormat::bf16) {
    pack_bf16_page(&kc[size_t(page) * kPage * d], &vc[size_t(page) * kPage * d], n_present, l, bytes.data());
  } else {
    const ref::QuantPage q =
        ref::quantize_page(&kc[size_t(page) * kPage * d], &vc[size_t(page) * kPage * d], n_present, d, r);
    pack_page(q, l, bytes.data());
  }
  return bytes;
}

// Pages a sequence of n tokens holds in the pool after its last step: full pages with the
// BF16 recent page, every page (the last one partial) without it (quantize on write) and for BF16.
inline int stored_pages(int n, const Recipe& r) {
  const bool all = r.kv == KvFormat::bf16 || !r.bf16_recent;
  return all ? (n + kPage - 1) / kPage : n / kPage;
}

// Compares everything the cache must hold for one request of n tokens (pages through its
// block table, slot rows) with the CPU model. k, v: the request's tokens [>= n][heads][d].
inline void expect_request_matches(const KvCache& cache, int layer, const std::vector<int32_t>& blocks, int slot,
                                   const std::vector<float>& k, const std::vector<float>& v, int n,
                                   const float* mu_layer /* [heads][d] or null */, const std::string& what) {
  const Recipe& r = cache.recipe();
  const int heads = cache.config().kv_heads, d = cache.config().head_dim;
  const PageLayout& l = cache.layout();
  for (int h = 0; h < heads; ++h) {
    const float* mu = mu_layer ? mu_layer + size_t(h) * d : nullptr;
    const auto kc = cached_rows(k, n, heads, h, d, r, mu, true);
    const auto vc = cached_rows(v, n, heads, h, d, r, mu, false);
    const int pages = stored_pages(n, r);
    for (int p = 0; p < pages; ++p) {
      const int present = std::min(kPage, n - p * kPage);
      const auto want = expected_page(kc, vc, p, present, d, r, l);
      const auto got = cache.read_page(layer, blocks[p], h);
      if (r.kv == KvFormat::bf16 && present < kPage) {
        // Only the present rows are defined in a BF16 page.
        std::vector<float> gk(size_t(kPage) * d), gv(size_t(kPage) * d), wk(gk.size()), wv(gv.size());
        unpack_bf16_page(got.data(), l, gk.data(), gv.data());
        unpack_bf16_page(want.data(), l, wk.data(), wv.data());
        gk.resize(size_t(present) * d), gv.resize(size_t(present) * d), wk.resize(gk.size()), wv.resize(gv.size());
        ASSERT_EQ(gk, wk) << what << ": BF16 page " << p << " head " << h << " K";
        ASSERT_EQ(gv, wv) << what << ": BF16 page " << p << " head " << h << " V";
        continue;
      }
      if (got != want) {
        size_t i = 0;
        while (got[i] == want[i]) ++i;
        FAIL() << what << ": page " << p << " (" << present << " tokens) head " << h << " layer " << layer
               << " differs first at byte " << i << " of " << got.size() << " (k_scales " << l.k_scales << ", v_codes "
               << l.v_codes << ", v_scales " << l.v_scales << ", page_scales " << l.page_scales << "): got "
               << int(got[i]) << " want " << int(want[i]);
      }
    }
    if (r.kv == KvFormat::bf16) continue;
    const SlotRows s = cache.read_slot(layer, slot, h);
    if (r.bf16_sink)
      for (int t = 0; t < std::min(n, kSinkTokens); ++t)
        for (int c = 0; c < d; ++c) {
          ASSERT_EQ(s.k[size_t(t) * d + c], kc[size_t(t) * d + c]) << what << ": sink K token " << t << " head " << h;
          ASSERT_EQ(s.v[size_t(t) * d + c], vc[size_t(t) * d + c]) << what << ": sink V token " << t << " head " << h;
        }
    for (int t = std::max(0, n - kPage); t < n; ++t)
      for (int c = 0; c < d; ++c) {
        const size_t row = size_t(kSinkTokens + t % kPage) * d + c;
        ASSERT_EQ(s.k[row], kc[size_t(t) * d + c]) << what << ": recent K token " << t << " head " << h;
        ASSERT_EQ(s.v[row], vc[size_t(t) * d + c]) << what << ": recent V token " << t << " head " << h;
      }
  }
}

}  // namespace fp4kv::cache::test
