// Test harness of the decode kernels: builds a paged cache of one layer on the host from
// the CPU reference's own pages (ref::HeadSequence + cache::pack_page), uploads it, runs
// DecodeAttention, and runs the CPU reference with the kernel's split plan on identical
// cache contents. Device buffers, the CUDA check and the host-filled plan come from
// fp4kv/testing.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "fp4kv/attention/decode.h"
#include "fp4kv/cache/host_page.h"
#include "fp4kv/cache/layout.h"
#include "fp4kv/core/half.h"
#include "fp4kv/core/parallel.h"
#include "fp4kv/core/transform.h"
#include "fp4kv/ref/attention.h"
#include "fp4kv/testing/cuda_testing.h"
#include "fp4kv/testing/host_step_plan.h"
#include "synthetic.h"

namespace fp4kv::test {

using fp4kv::testing::DeviceBuffer;
using fp4kv::testing::HostStepPlan;

struct Case {
  std::string recipe = "nvfp4";
  int d = 128;
  int G = 4;
  int kv_heads = 2;
  std::vector<int> lens = {1000};
  int pages_per_split = 0;  // 0: the host planner's choice
  int max_splits = 16;
  int target_ctas = 0;
  unsigned seed = 1;
  float logit_std = 2.0f;
  bool with_mu = true;
  bool run_reference = true;  // the same-recipe CPU reference
  bool run_exact = false;     // exact attention on the cache's stored (BF16/dequantized) keys
  // Round the queries to the kernel's 16-bit operand type first (BF16 for the bf16
  // baseline, FP16 otherwise), so the comparison with exact attention measures what the
  // kernel adds (P rounding, summation order) and not the query's own rounding, which
  // moves every logit by ~2^-9 |q||k| (the keys carry a large common bias here).
  bool round_q = false;
};

struct Metrics {
  double max_rel = 0;        // max over (row, head) of max_c |o - ref| / max_c |ref|
  double max_lse = 0;        // max |lse - ref lse|
  double max_rel_exact = 0;  // the same against exact attention
  double max_lse_exact = 0;
  int heads = 0, heads_over_1e3 = 0;
  std::vector<double> rel;  // per (row, head)
};

// The cache of one layer and the queries, on the host and the device.
struct Built {
  Recipe r;
  cache::PageLayout layout;
  int batch = 0, q_heads = 0, max_pages = 0, blocks = 0;
  long long stride = 0;
  std::vector<uint8_t> pool;
  std::vector<uint16_t> slots;
  std::vector<float> q, mu;
  std::vector<int32_t> block_table, seq, slot_of_row;
  std::vector<float> ref_out, ref_lse, exact_out, exact_lse;
};

inline Built build(const Case& c, HostStepPlan* plan) {
  Built B;
  B.r = parse_recipe(c.recipe);
  const Recipe& r = B.r;
  const int d = c.d, H = c.kv_heads, G = c.G;
  B.batch = int(c.lens.size());
  B.q_heads = H * G;
  B.layout = cache::PageLayout::make(r.kv, d);
  B.stride = (long long)B.layout.bytes * H;
  std::vector<int> pages(B.batch);
  for (int b = 0; b < B.batch; ++b) {
    pages[b] = cache::attended_pages(c.lens[b], r);
    B.max_pages = std::max(B.max_pages, std::max(1, pages[b]));
  }
  B.blocks = std::accumulate(pages.begin(), pages.end(), 0) + 3;  // a few unused blocks
  std::mt19937 rng(c.seed * 7919u + 17u);
  // Block ids: a random permutation; unused table entries point at block 0.
  std::vector<int> perm(B.blocks);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  B.block_table.assign(size_t(B.batch) * B.max_pages, 0);
  int next = 0;
  for (int b = 0; b < B.batch; ++b)
    for (int p = 0; p < pages[b]; ++p) B.block_table[size_t(b) * B.max_pages + p] = perm[next++];
  // Garbage everywhere the kernel must not read: random pool bytes, NaN slot rows.
  B.pool.resize(size_t(B.blocks) * B.stride);
  for (auto& x : B.pool) x = uint8_t(rng());
  const int nslots = B.batch + 1;
  B.slots.assign(size_t(nslots) * H * 2 * cache::kSlotRows * d, 0x7FC0);
  B.slot_of_row.resize(B.batch);
  std::vector<int> sp(nslots);
  std::iota(sp.begin(), sp.end(), 0);
  std::shuffle(sp.begin(), sp.end(), rng);
  for (int b = 0; b < B.batch; ++b) B.slot_of_row[b] = sp[b];
  B.seq.assign(c.lens.begin(), c.lens.end());
  B.q.assign(size_t(B.batch) * B.q_heads * d, 0.0f);
  B.mu.assign(size_t(H) * d, 0.0f);
  for (int h = 0; h < H; ++h) {
    const auto s = make_synthetic(64, d, 1, c.seed * 131u + h, c.logit_std);
    if (c.with_mu) std::copy(s.mu.begin(), s.mu.end(), B.mu.begin() + size_t(h) * d);
  }
  if (plan) plan->fill(std::vector<int>(c.lens.begin(), c.lens.end()), r, H, c.pages_per_split, B.slot_of_row, c.target_ctas);
  B.ref_out.assign(B.q.size(), 0.0f);
  B.ref_lse.assign(size_t(B.batch) * B.q_heads, 0.0f);
  B.exact_out = B.ref_out;
  B.exact_lse = B.ref_lse;

  fp4kv::parallel_for(B.batch * H, [&](int job) {
    const int b = job / H, h = job % H, n = c.lens[b];
    if (n <= 0) return;
    // Same bias structure per head (seeded by head), fresh tokens per row.
    const auto s = make_synthetic(n, d, G, c.seed * 131u + h + 1000u * (b + 1), c.logit_std);
    // The first tokens carry the head's bias (make_synthetic seeds its own bias): use the
    // head's mu only as the smoothing vector.
    const float* mu = (c.with_mu && r.smooth_keys) ? &B.mu[size_t(h) * d] : nullptr;
    float* qdst = &B.q[(size_t(b) * B.q_heads + size_t(h) * G) * d];
    std::copy(s.q.begin(), s.q.end(), qdst);
    if (c.round_q)
      for (int i = 0; i < G * d; ++i) qdst[i] = r.kv == KvFormat::bf16 ? round_bf16(qdst[i]) : round_fp16(qdst[i]);
    ref::HeadSequence seq(s.k.data(), s.v.data(), n, d, r, mu);
    ref::HeadSequence::View v;
    seq.view(n, v);
    const DecodeLayout& L = v.view.layout;
    const int32_t* bt = &B.block_table[size_t(b) * B.max_pages];
    if (r.kv == KvFormat::bf16) {
      std::vector<float> kr(size_t(n) * d), vr(size_t(n) * d);
      for (size_t i = 0; i < kr.size(); ++i) {
        kr[i] = round_bf16(s.k[i]);
        vr[i] = round_bf16(s.v[i]);
      }
      for (int p = 0; p < pages[b]; ++p) {
        const int tok = std::min(kPageTokens, n - p * kPageTokens);
        cache::pack_bf16_page(&kr[size_t(p) * kPageTokens * d], &vr[size_t(p) * kPageTokens * d], tok, B.layout,
                              &B.pool[size_t(bt[p]) * B.stride + size_t(h) * B.layout.bytes]);
      }
      if (c.run_exact) {
        const auto e = ref::exact_attention(qdst, G, kr.data(), vr.data(), n, d);
        for (int g = 0; g < G; ++g) {
          std::copy(e.out.begin() + g * d, e.out.begin() + (g + 1) * d, &B.exact_out[(size_t(b) * B.q_heads + h * G + g) * d]);
          B.exact_lse[size_t(b) * B.q_heads + h * G + g] = e.lse[g];
        }
      }
      return;  // the BF16 baseline is checked against exact attention only
    }
    for (int p = 0; p < L.quant_pages; ++p)
      cache::pack_page(*v.view.pages[p], B.layout, &B.pool[size_t(bt[p]) * B.stride + size_t(h) * B.layout.bytes]);
    if (attention::uses_slot_buffer(r)) {
      const int slot = B.slot_of_row[b];
      auto put = [&](int kv, int row, const float* x) {
        uint16_t* dst = &B.slots[cache::slot_row_offset(0, slot, h, kv, row, nslots, H, d)];
        for (int i = 0; i < d; ++i) dst[i] = float_to_bf16_bits(x[i]);
      };
      for (int i = 0; i < L.bf16_tokens(); ++i) {
        const int row = i < L.sink_tokens ? i : kSinkTokens + (L.recent_begin + i - L.sink_tokens) % kPageTokens;
        put(0, row, &v.bf16_k[size_t(i) * d]);
        put(1, row, &v.bf16_v[size_t(i) * d]);
      }
    }
    if (c.run_reference) {
      const ref::SplitBounds bounds = plan ? plan->bounds(b) : ref::SplitBounds{};
      const auto o = ref::quantized_attention(qdst, G, v.view, r, bounds);
      for (int g = 0; g < G; ++g) {
        std::copy(o.out.begin() + g * d, o.out.begin() + (g + 1) * d, &B.ref_out[(size_t(b) * B.q_heads + h * G + g) * d]);
        B.ref_lse[size_t(b) * B.q_heads + h * G + g] = o.lse[g];
      }
    }
    if (c.run_exact) {
      // Exact attention on what the cache holds: dequantized pages plus BF16 tokens, in
      // token order (a masked sink copy on page 0 is replaced by the BF16 sink).
      std::vector<float> kd(size_t(n) * d), vd(size_t(n) * d);
      for (int t = 0; t < n; ++t) {
        const int p = t / kPageTokens;
        const bool bf = t < L.sink_tokens || (t >= L.recent_begin && t < L.recent_end);
        for (int i = 0; i < d; ++i) {
          if (bf) {
            const int row = t < L.sink_tokens ? t : L.sink_tokens + (t - L.recent_begin);
            kd[size_t(t) * d + i] = v.bf16_k[size_t(row) * d + i];
            vd[size_t(t) * d + i] = v.bf16_v[size_t(row) * d + i];
          } else {
            kd[size_t(t) * d + i] = v.view.pages[p]->k_value(t % kPageTokens, i);
            vd[size_t(t) * d + i] = v.view.pages[p]->v_value(t % kPageTokens, i);
          }
        }
      }
      // Keys are stored transformed: attend with the transformed query, add back q.mu.
      std::vector<float> qt(size_t(G) * d);
      for (int g = 0; g < G; ++g) transform_query(qdst + size_t(g) * d, d, r.rotate_keys, &qt[size_t(g) * d]);
      const auto e = ref::exact_attention(qt.data(), G, kd.data(), vd.data(), n, d);
      for (int g = 0; g < G; ++g) {
        double shift = 0;
        if (mu)
          for (int i = 0; i < d; ++i) shift += double(qdst[g * d + i]) * mu[i];
        std::copy(e.out.begin() + g * d, e.out.begin() + (g + 1) * d, &B.exact_out[(size_t(b) * B.q_heads + h * G + g) * d]);
        B.exact_lse[size_t(b) * B.q_heads + h * G + g] = float(e.lse[g] + shift / std::sqrt(double(d)));
      }
    }
  });
  return B;
}

// Device copies of a built case, and what DecodeAttention is built and run with.
struct DeviceCase {
  DeviceBuffer<uint8_t> pool;
  DeviceBuffer<uint16_t> slots;
  DeviceBuffer<float> q, mu, out, lse;
  DeviceBuffer<int32_t> table, seq;
  attention::DecodeGeometry geometry;
  attention::DecodeLayerView layer;
  explicit DeviceCase(const Built& B, int d, int kv_heads)
      : pool(B.pool), slots(B.slots), q(B.q), mu(B.mu), out(B.q.size()), lse(B.ref_lse.size()), table(B.block_table),
        seq(B.seq) {
    geometry = attention::DecodeGeometry{B.q_heads, kv_heads, d};
    layer.format = B.r.kv;
    layer.pool = pool.get();
    layer.block_stride = B.stride;
    layer.slot_buffer = slots.get();
    layer.slots = B.batch + 1;
    layer.mu_k = mu.get();
  }
  // Capacity: the case's batch and block-table stride, `max_splits` splits per row.
  attention::DecodeCapacity capacity(const Built& B, int max_splits) const {
    return attention::DecodeCapacity{B.batch, B.max_pages, max_splits};
  }
  attention::DecodeStep step(const Built& B, const HostStepPlan& plan) const {
    attention::DecodeStep s;
    s.block_tables = table.get();
    s.seq_lens = seq.get();
    s.batch = B.batch;
    s.plan = plan.plan();
    return s;
  }
  void poison() {
    out.fill_bytes(0xFF);
    lse.fill_bytes(0xFF);
  }
};

inline void compare(const std::vector<float>& got, const std::vector<float>& got_lse, const std::vector<float>& want,
                    const std::vector<float>& want_lse, const std::vector<int32_t>& seq, int q_heads, int d,
                    double& max_rel, double& max_lse, Metrics* m) {
  for (size_t b = 0; b < seq.size(); ++b) {
    if (seq[b] <= 0) continue;
    for (int h = 0; h < q_heads; ++h) {
      const size_t base = (b * q_heads + h) * d;
      double num = 0, den = 0;
      for (int c = 0; c < d; ++c) {
        const double g = got[base + c], w = want[base + c];
        num = std::max(num, std::isfinite(g) ? std::fabs(g - w) : 1e30);
        den = std::max(den, std::fabs(w));
      }
      const double rel = num / std::max(den, 1e-30);
      max_rel = std::max(max_rel, rel);
      const double le = std::fabs(double(got_lse[b * q_heads + h]) - want_lse[b * q_heads + h]);
      max_lse = std::max(max_lse, std::isfinite(le) ? le : 1e30);
      if (m) {
        m->rel.push_back(rel);
        m->heads++;
        if (rel > 1e-3) m->heads_over_1e3++;
      }
    }
  }
}

// Builds, runs (float queries and output) and compares one case.
inline Metrics run_case(const Case& c, std::vector<float>* out_copy = nullptr) {
  HostStepPlan plan(int(c.lens.size()), c.max_splits);
  const Built B = build(c, &plan);
  DeviceCase D(B, c.d, c.kv_heads);
  attention::DecodeAttention attn(D.geometry, B.r, D.capacity(B, c.max_splits));
  D.poison();
  attn.run(D.step(B, plan), D.layer, D.q.get(), D.out.get(), D.lse.get());
  const auto out = D.out.download(), lse = D.lse.download();
  if (out_copy) *out_copy = out;
  Metrics m;
  if (c.run_reference && B.r.kv != KvFormat::bf16)
    compare(out, lse, B.ref_out, B.ref_lse, B.seq, B.q_heads, c.d, m.max_rel, m.max_lse, &m);
  if (c.run_exact) compare(out, lse, B.exact_out, B.exact_lse, B.seq, B.q_heads, c.d, m.max_rel_exact, m.max_lse_exact, nullptr);
  return m;
}

}  // namespace fp4kv::test
