// First timings of the decode attention (decode kernel + combine), Qwen3-4B shapes by
// default (32 query heads, 8 KV heads, d = 128). Pages hold valid quantized data (a few
// quantized random pages replicated over the pool); each timed run uses a different copy
// of the cache (block tables over disjoint blocks) so that the bytes read exceed L2.
// CUDA events around every run, median of many.
//
//   fp4kv_attention_bench [--recipes nvfp4,nvfp4-native,bf16] [--ctx 32768,131072] [--batch 1,64]
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "fp4kv/attention/decode.h"
#include "fp4kv/cache/host_page.h"
#include "fp4kv/core/half.h"
#include "fp4kv/ref/quant_page.h"

using namespace fp4kv;

#define CK(x)                                                                          \
  do {                                                                                 \
    cudaError_t e_ = (x);                                                              \
    if (e_ != cudaSuccess) {                                                           \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(1);                                                                    \
    }                                                                                  \
  } while (0)

static std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream in(s);
  std::string t;
  while (std::getline(in, t, ',')) out.push_back(t);
  return out;
}

int main(int argc, char** argv) {
  std::string recipes = "nvfp4,nvfp4-native,bf16", ctxs = "32768,131072", batches = "1,64";
  int kv_heads = 8, q_heads = 32, d = 128, runs = 50;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--recipes") recipes = v;
    else if (k == "--ctx") ctxs = v;
    else if (k == "--batch") batches = v;
    else if (k == "--runs") runs = std::stoi(v);
    else if (k == "--d") d = std::stoi(v);
  }
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device %s, %d SMs, L2 %d MB\n", prop.name, prop.multiProcessorCount, prop.l2CacheSize >> 20);
  std::printf("%-14s %7s %5s %9s %9s %9s %8s %6s\n", "recipe", "ctx", "batch", "median_us", "min_us", "KV_MB", "TB/s", "splits");
  const int max_splits = 64;
  for (const auto& rs : split_list(recipes)) {
    const Recipe r = parse_recipe(rs);
    const cache::PageLayout L = cache::PageLayout::make(r.kv, d);
    const long long stride = (long long)L.bytes * kv_heads;
    // A few distinct valid pages per head.
    constexpr int kPattern = 8;
    std::vector<uint8_t> pattern(size_t(kPattern) * stride);
    std::mt19937 rng(1);
    std::normal_distribution<float> nd(0.f, 1.f);
    for (int p = 0; p < kPattern; ++p)
      for (int h = 0; h < kv_heads; ++h) {
        std::vector<float> k(size_t(128) * d), v(size_t(128) * d);
        for (auto& x : k) x = nd(rng) * 2.0f;
        for (auto& x : v) x = nd(rng);
        uint8_t* dst = &pattern[size_t(p) * stride + size_t(h) * L.bytes];
        if (r.kv == KvFormat::bf16) {
          for (auto& x : k) x = round_bf16(x);
          for (auto& x : v) x = round_bf16(x);
          cache::pack_bf16_page(k.data(), v.data(), 128, L, dst);
        } else {
          cache::pack_page(ref::quantize_page(k.data(), v.data(), 128, d, r), L, dst);
        }
      }
    for (const auto& cs : split_list(ctxs))
      for (const auto& bs : split_list(batches)) {
        const int ctx = std::stoi(cs), batch = std::stoi(bs);
        const int pages = attention::attended_pages(ctx, r);
        const int per_copy = batch * std::max(1, pages);
        const double copy_bytes = double(per_copy) * stride;
        int copies = int(std::max(1.0, std::ceil(512e6 / copy_bytes)));
        copies = std::min(copies, 64);
        const long long nblocks = (long long)per_copy * copies;
        uint8_t* pool;
        CK(cudaMalloc(&pool, size_t(nblocks) * stride));
        CK(cudaMemcpy(pool, pattern.data(), pattern.size(), cudaMemcpyHostToDevice));
        for (long long have = kPattern; have < nblocks; have *= 2) {
          const long long n = std::min(have, nblocks - have);
          CK(cudaMemcpy(pool + size_t(have) * stride, pool, size_t(n) * stride, cudaMemcpyDeviceToDevice));
        }
        std::vector<int32_t> tables(size_t(copies) * batch * pages);
        for (size_t i = 0; i < tables.size(); ++i) tables[i] = int32_t(i);  // copy c uses blocks [c*per_copy, ...)
        int32_t* dtab;
        CK(cudaMalloc(&dtab, std::max<size_t>(1, tables.size()) * 4));
        CK(cudaMemcpy(dtab, tables.data(), tables.size() * 4, cudaMemcpyHostToDevice));
        std::vector<int32_t> lens(batch, ctx);
        int32_t* dlen;
        CK(cudaMalloc(&dlen, batch * 4));
        CK(cudaMemcpy(dlen, lens.data(), batch * 4, cudaMemcpyHostToDevice));
        std::vector<float> q(size_t(batch) * q_heads * d);
        for (auto& x : q) x = nd(rng) * 0.3f;
        float *dq, *dout, *dlse, *dmu;
        CK(cudaMalloc(&dq, q.size() * 4));
        CK(cudaMemcpy(dq, q.data(), q.size() * 4, cudaMemcpyHostToDevice));
        CK(cudaMalloc(&dout, q.size() * 4));
        CK(cudaMalloc(&dlse, size_t(batch) * q_heads * 4));
        CK(cudaMalloc(&dmu, size_t(kv_heads) * d * 4));
        CK(cudaMemset(dmu, 0, size_t(kv_heads) * d * 4));
        uint16_t* slots;
        const size_t slot_elems = size_t(batch) * kv_heads * 2 * cache::kSlotRows * d;
        CK(cudaMalloc(&slots, slot_elems * 2));
        CK(cudaMemset(slots, 0x3C, slot_elems * 2));
        attention::DecodeParams p;
        p.pool = pool;
        p.block_stride = stride;
        p.layout = L;
        p.kv_heads = kv_heads;
        p.q_heads = q_heads;
        p.head_dim = d;
        p.slot_buffer = slots;
        p.slots = batch;
        p.mu_k = dmu;
        attention::HostStepPlan plan(batch, max_splits);
        plan.fill(std::vector<int>(lens.begin(), lens.end()), r, kv_heads, 0, {}, 2 * prop.multiProcessorCount);
        attention::DecodeWorkspace ws(batch, q_heads, d, max_splits);
        auto run = [&](int i) {
          attention::decode_attention(p, r, dq, dtab + size_t(i % copies) * batch * pages, dlen, batch, std::max(1, pages),
                                      plan.plan(), ws, dout, dlse);
        };
        for (int i = 0; i < 5; ++i) run(i);
        CK(cudaDeviceSynchronize());
        std::vector<cudaEvent_t> ev(2 * runs);
        for (auto& e : ev) CK(cudaEventCreate(&e));
        for (int i = 0; i < runs; ++i) {
          CK(cudaEventRecord(ev[2 * i]));
          run(i + 1);
          CK(cudaEventRecord(ev[2 * i + 1]));
        }
        CK(cudaDeviceSynchronize());
        std::vector<float> t(runs);
        for (int i = 0; i < runs; ++i) CK(cudaEventElapsedTime(&t[i], ev[2 * i], ev[2 * i + 1]));
        for (auto& e : ev) cudaEventDestroy(e);
        std::sort(t.begin(), t.end());
        const double med = t[runs / 2] * 1e3, mn = t[0] * 1e3;
        const double kv_bytes = double(batch) * pages * stride;  // pool bytes read (BF16 slot rows not counted)
        std::printf("%-14s %7d %5d %9.1f %9.1f %9.1f %8.2f %6d\n", rs.c_str(), ctx, batch, med, mn, kv_bytes / 1e6,
                    kv_bytes / (med * 1e-6) / 1e12, plan.splits()[0]);
        std::fflush(stdout);
        cudaFree(pool);
        cudaFree(dtab);
        cudaFree(dlen);
        cudaFree(dq);
        cudaFree(dout);
        cudaFree(dlse);
        cudaFree(dmu);
        cudaFree(slots);
      }
  }
  CK(cudaGetLastError());
  return 0;
}
