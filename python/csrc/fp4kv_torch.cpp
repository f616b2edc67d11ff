// fp4kv's paged cache and decode attention as PyTorch operators (TORCH_LIBRARY(fp4kv)), the
// layer under the Python package (python/fp4kv): an engine calls them as torch ops, so they run
// on PyTorch's current CUDA stream, inside its CUDA graphs, and under torch.compile (the fake
// kernels are python/fp4kv/_fake.py).
//
// Objects: a cache (cache::KvCache) and a decode plan (attention::DecodeAttention) live in a
// registry and are named by an integer id in every op (an int is a constant to torch.compile).
// The cache's device memory is tensors of PyTorch's caching allocator (KvCache's
// DeviceMemorySource), kept by the registry; the block pools are returned as one uint8 tensor
// [layers][num_blocks][block_bytes] that every cache-writing op takes as its mutated argument
// (Tensor(a!)), which tells torch.compile and the functionalization pass that the op writes
// the cache (an op that returned nothing and mutated nothing could be dropped).
//
// Errors: every fp4kv::Error becomes a Python RuntimeError carrying its message (TORCH_CHECK).
// Ops check device, dtype, shape and contiguity of every tensor before any launch; the cache's
// device-side checks (bad block ids, lengths) raise its sticky flags (cache_errors()).
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "fp4kv/attention/decode.h"
#include "fp4kv/attention/kv_cache_adapter.h"
#include "fp4kv/attention/prefill.h"
#include "fp4kv/cache/host_page.h"
#include "fp4kv/cache/kv_cache.h"
#include "fp4kv/core/error.h"
#include "fp4kv/core/recipe.h"
#include "fp4kv/ref/quant_page.h"

namespace fp4kv::torch_ext {
namespace {

// One cache: the memory it lives in, the pool tensor, and the tensors of the current step
// (the decode kernels read the block tables and lengths begin_step was given).
struct CacheEntry {
  std::vector<at::Tensor> memory;
  std::unique_ptr<cache::KvCache> cache;
  at::Tensor pool;
  at::Tensor block_tables, seq_lens;
  int batch = 0;
  // The chunked-prefill attention, made at its first use and again for more query heads or
  // a longer chunk (it allocates its workspace: run one before capturing a graph).
  std::unique_ptr<attention::PrefillAttention> prefill;
};

struct DecodeEntry {
  std::unique_ptr<attention::DecodeAttention> attention;
  int64_t cache_id = 0;
};

// Objects by id. Ops of different caches may run on different threads.
class Registry {
 public:
  int64_t add_cache(std::unique_ptr<CacheEntry> e) {
    std::lock_guard<std::mutex> lock(mutex_);
    caches_[next_] = std::move(e);
    return next_++;
  }
  int64_t add_decode(std::unique_ptr<DecodeEntry> e) {
    std::lock_guard<std::mutex> lock(mutex_);
    decodes_[next_] = std::move(e);
    return next_++;
  }
  CacheEntry& cache(int64_t id) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = caches_.find(id);
    TORCH_CHECK(it != caches_.end(), "fp4kv: no cache with id ", id, " (destroyed, or never created)");
    return *it->second;
  }
  DecodeEntry& decode(int64_t id) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = decodes_.find(id);
    TORCH_CHECK(it != decodes_.end(), "fp4kv: no decode plan with id ", id, " (destroyed, or never planned)");
    return *it->second;
  }
  void remove(int64_t id) {
    std::lock_guard<std::mutex> lock(mutex_);
    caches_.erase(id);
    decodes_.erase(id);
  }

 private:
  std::mutex mutex_;
  int64_t next_ = 1;
  std::map<int64_t, std::unique_ptr<CacheEntry>> caches_;
  std::map<int64_t, std::unique_ptr<DecodeEntry>> decodes_;
};

Registry& registry() {
  static Registry r;
  return r;
}

// Runs `body`, turning fp4kv::Error into a Python exception with the same message.
template <class F>
auto checked(const char* op, F&& body) -> decltype(body()) {
  try {
    return body();
  } catch (const Error& e) {
    TORCH_CHECK(false, "fp4kv.", op, ": ", e.what());
  }
}

std::string text(c10::string_view s) { return std::string(s.data(), s.size()); }

void require_cuda(const at::Tensor& t, const char* name, at::ScalarType type, int64_t dims) {
  TORCH_CHECK(t.is_cuda(), "fp4kv: ", name, " must be a CUDA tensor");
  TORCH_CHECK(t.scalar_type() == type, "fp4kv: ", name, " must be ", c10::toString(type), ", got ",
              c10::toString(t.scalar_type()));
  TORCH_CHECK(t.dim() == dims, "fp4kv: ", name, " must have ", dims, " dimensions, got ", t.dim());
  TORCH_CHECK(t.is_contiguous(), "fp4kv: ", name, " must be contiguous");
}

// The cache's K/V input as contiguous float32 [n][kv_heads][head_dim] (the cache quantizes from
// float; BF16 and FP16 inputs convert exactly).
at::Tensor kv_input(const at::Tensor& t, const cache::KvCacheConfig& c, const char* name) {
  TORCH_CHECK(t.is_cuda(), "fp4kv: ", name, " must be a CUDA tensor");
  TORCH_CHECK(t.dim() == 3 && t.size(1) == c.kv_heads && t.size(2) == c.head_dim, "fp4kv: ", name,
              " must be [tokens][", c.kv_heads, "][", c.head_dim, "], got ", t.sizes());
  return t.to(at::kFloat).contiguous();
}

cudaStream_t current_stream(const at::Tensor& on) { return c10::cuda::getCurrentCUDAStream(on.get_device()).stream(); }

void require_pool(const CacheEntry& e, const at::Tensor& pool) {
  TORCH_CHECK(pool.data_ptr() == e.pool.data_ptr(), "fp4kv: the pool tensor does not belong to this cache");
}

// ---- cache ----

std::tuple<int64_t, at::Tensor> create_cache(int64_t layers, int64_t kv_heads, int64_t head_dim, int64_t num_blocks,
                                             c10::string_view preset, int64_t max_slots, int64_t max_batch,
                                             int64_t max_pages, const c10::optional<at::Tensor>& mu_k,
                                             c10::Device device) {
  return checked("KVCache", [&] {
    TORCH_CHECK(device.is_cuda(), "fp4kv.KVCache: the cache lives on a CUDA device, got ", device);
    c10::cuda::CUDAGuard guard(device);
    cache::KvCacheConfig c;
    c.layers = int(layers);
    c.kv_heads = int(kv_heads);
    c.head_dim = int(head_dim);
    c.num_blocks = int(num_blocks);
    c.max_slots = int(max_slots);
    c.max_batch = int(max_batch);
    c.max_pages = int(max_pages);
    const Recipe recipe = parse_recipe(text(preset));
    std::vector<float> mu;
    if (mu_k.has_value()) {
      const at::Tensor m = mu_k->to(at::kCPU, at::kFloat).contiguous();
      TORCH_CHECK(m.numel() == layers * kv_heads * head_dim, "fp4kv.KVCache: mu_k must hold layers x kv_heads x ",
                  "head_dim = ", layers * kv_heads * head_dim, " values, got ", m.numel());
      mu.assign(m.data_ptr<float>(), m.data_ptr<float>() + m.numel());
    }
    auto entry = std::make_unique<CacheEntry>();
    CacheEntry* e = entry.get();
    const cache::DeviceMemorySource source{[e, device](size_t bytes, const char*) {
      e->memory.push_back(at::empty({int64_t(bytes)}, at::TensorOptions().dtype(at::kByte).device(device)));
      return e->memory.back().data_ptr();
    }};
    e->cache = std::make_unique<cache::KvCache>(c, recipe, mu.empty() ? nullptr : mu.data(), &source);
    const void* pool_base = e->cache->pool(0);
    for (const at::Tensor& t : e->memory) {
      if (t.data_ptr() == pool_base) e->pool = t.view({layers, num_blocks, e->cache->block_stride()});
    }
    TORCH_CHECK(e->pool.defined(), "fp4kv.KVCache: the block pools are not among the cache's tensors");
    const at::Tensor pool = e->pool;
    return std::make_tuple(registry().add_cache(std::move(entry)), pool);
  });
}

void destroy(int64_t id) { registry().remove(id); }

void prefill(at::Tensor& pool, int64_t cache_id, int64_t layer, const at::Tensor& k, const at::Tensor& v,
             const at::Tensor& block_row, int64_t start) {
  checked("KVCache.prefill", [&] {
    CacheEntry& e = registry().cache(cache_id);
    require_pool(e, pool);
    const cache::KvCacheConfig& c = e.cache->config();
    const at::Tensor kf = kv_input(k, c, "k"), vf = kv_input(v, c, "v");
    TORCH_CHECK(kf.size(0) == vf.size(0), "fp4kv.KVCache.prefill: k and v hold different token counts");
    require_cuda(block_row, "block_row", at::kInt, 1);
    c10::cuda::CUDAGuard guard(pool.device());
    e.cache->prefill(int(layer), block_row.data_ptr<int32_t>(), int(start), int(kf.size(0)), kf.data_ptr<float>(),
                     vf.data_ptr<float>(), current_stream(pool));
  });
}

// A prompt chunk's attention: q [T][q_heads][d], k, v [T][kv_heads][d] BF16 attend to the
// request's cached prefix [0, start) and causally to themselves; the chunk is not written
// (KVCache.prefill does that afterwards). Returns out [T][q_heads][d] BF16 and the LSE [T][q_heads].
std::tuple<at::Tensor, at::Tensor> prefill_attention(at::Tensor& pool, int64_t cache_id, int64_t layer,
                                                     const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                                     const at::Tensor& block_row, int64_t start) {
  return checked("KVCache.prefill_attention", [&] {
    CacheEntry& e = registry().cache(cache_id);
    require_pool(e, pool);
    const cache::KvCacheConfig& c = e.cache->config();
    require_cuda(q, "q", at::kBFloat16, 3);
    require_cuda(k, "k", at::kBFloat16, 3);
    require_cuda(v, "v", at::kBFloat16, 3);
    require_cuda(block_row, "block_row", at::kInt, 1);
    const int64_t T = q.size(0), q_heads = q.size(1);
    TORCH_CHECK(q.size(2) == c.head_dim && k.sizes() == v.sizes() && k.size(0) == T && k.size(1) == c.kv_heads &&
                    k.size(2) == c.head_dim,
                "fp4kv.KVCache.prefill_attention: q must be [T][q_heads][", c.head_dim, "] and k, v [T][", c.kv_heads,
                "][", c.head_dim, "], got ", q.sizes(), ", ", k.sizes(), ", ", v.sizes());
    TORCH_CHECK(T >= 1 && block_row.size(0) >= (start + T + cache::kPage - 1) / cache::kPage,
                "fp4kv.KVCache.prefill_attention: block_row must cover tokens [0, ", start + T, ")");
    c10::cuda::CUDAGuard guard(pool.device());
    if (!e.prefill || e.prefill->config().q_heads != q_heads || e.prefill->config().max_chunk_tokens < T) {
      attention::PrefillConfig pc;
      pc.q_heads = int(q_heads);
      pc.max_chunk_tokens = int(std::max<int64_t>(T, e.prefill ? e.prefill->config().max_chunk_tokens : 0));
      e.prefill.reset();
      e.prefill = std::make_unique<attention::PrefillAttention>(*e.cache, pc);
    }
    at::Tensor out = at::empty_like(q);
    at::Tensor lse = at::empty({T, q_heads}, q.options().dtype(at::kFloat));
    const cudaStream_t stream = current_stream(pool);
    e.cache->begin_prefill(block_row.data_ptr<int32_t>(), int(start), int(T), stream);  // the request's slot
    auto bits = [](const at::Tensor& t) { return reinterpret_cast<const uint16_t*>(t.data_ptr()); };
    e.prefill->run(int(layer), block_row.data_ptr<int32_t>(), int(start), int(T), bits(q), bits(k), bits(v),
                   reinterpret_cast<uint16_t*>(out.data_ptr()), lse.data_ptr<float>(), stream);
    return std::make_tuple(out, lse);
  });
}

void begin_step(at::Tensor& pool, int64_t cache_id, const at::Tensor& block_tables, const at::Tensor& seq_lens) {
  checked("KVCache.begin_step", [&] {
    CacheEntry& e = registry().cache(cache_id);
    require_pool(e, pool);
    const cache::KvCacheConfig& c = e.cache->config();
    require_cuda(block_tables, "block_tables", at::kInt, 2);
    require_cuda(seq_lens, "seq_lens", at::kInt, 1);
    TORCH_CHECK(block_tables.size(1) == c.max_pages, "fp4kv.KVCache.begin_step: block_tables must be [batch][",
                c.max_pages, "] (max_pages), got ", block_tables.sizes());
    TORCH_CHECK(block_tables.size(0) == seq_lens.size(0), "fp4kv.KVCache.begin_step: ", block_tables.size(0),
                " block-table rows but ", seq_lens.size(0), " sequence lengths");
    c10::cuda::CUDAGuard guard(pool.device());
    const int batch = int(seq_lens.size(0));
    e.cache->begin_step(block_tables.data_ptr<int32_t>(), seq_lens.data_ptr<int32_t>(), batch, c.max_pages,
                        current_stream(pool));
    e.block_tables = block_tables;
    e.seq_lens = seq_lens;
    e.batch = batch;
  });
}

void append(at::Tensor& pool, int64_t cache_id, int64_t layer, const at::Tensor& k, const at::Tensor& v) {
  checked("KVCache.append", [&] {
    CacheEntry& e = registry().cache(cache_id);
    require_pool(e, pool);
    TORCH_CHECK(e.batch > 0, "fp4kv.KVCache.append: call begin_step first");
    const at::Tensor kf = kv_input(k, e.cache->config(), "k"), vf = kv_input(v, e.cache->config(), "v");
    TORCH_CHECK(kf.size(0) == e.batch && vf.size(0) == e.batch, "fp4kv.KVCache.append: k and v must have the step's ",
                e.batch, " rows");
    c10::cuda::CUDAGuard guard(pool.device());
    e.cache->append(int(layer), kf.data_ptr<float>(), vf.data_ptr<float>(), current_stream(pool));
  });
}

void end_step(at::Tensor& pool, int64_t cache_id) {
  checked("KVCache.end_step", [&] {
    CacheEntry& e = registry().cache(cache_id);
    require_pool(e, pool);
    c10::cuda::CUDAGuard guard(pool.device());
    e.cache->end_step(current_stream(pool));
  });
}

void release(at::Tensor& pool, int64_t cache_id, int64_t first_block) {
  checked("KVCache.release", [&] {
    CacheEntry& e = registry().cache(cache_id);
    require_pool(e, pool);
    c10::cuda::CUDAGuard guard(pool.device());
    e.cache->release(int32_t(first_block), current_stream(pool));
  });
}

// Sticky device-side error bits (cache/step_plan.h) and the count of non-finite inputs; these
// synchronize, so call them between steps.
std::tuple<int64_t, int64_t> cache_errors(int64_t cache_id) {
  return checked("KVCache.errors", [&] {
    CacheEntry& e = registry().cache(cache_id);
    return std::make_tuple(int64_t(e.cache->error_flags()), int64_t(e.cache->nonfinite_count()));
  });
}

// ---- decode ----

int64_t plan_decode(int64_t cache_id, int64_t q_heads) {
  return checked("DecodeWrapper.plan", [&] {
    CacheEntry& e = registry().cache(cache_id);
    c10::cuda::CUDAGuard guard(e.pool.device());
    auto d = std::make_unique<DecodeEntry>();
    d->cache_id = cache_id;
    d->attention = std::make_unique<attention::DecodeAttention>(attention::geometry_of(*e.cache, int(q_heads)),
                                                                e.cache->recipe(), attention::capacity_of(*e.cache));
    return registry().add_decode(std::move(d));
  });
}

// out [batch][q_heads][head_dim] BF16 and the LSE [batch][q_heads] float32 of one layer.
std::tuple<at::Tensor, at::Tensor> decode(const at::Tensor& q, const at::Tensor& pool, int64_t plan_id, int64_t layer) {
  return checked("DecodeWrapper.run", [&] {
    DecodeEntry& d = registry().decode(plan_id);
    CacheEntry& e = registry().cache(d.cache_id);
    require_pool(e, pool);
    TORCH_CHECK(e.batch > 0, "fp4kv.DecodeWrapper.run: call cache.begin_step first");
    const attention::DecodeGeometry& g = d.attention->geometry();
    require_cuda(q, "q", at::kBFloat16, 3);
    TORCH_CHECK(q.size(0) == e.batch && q.size(1) == g.q_heads && q.size(2) == g.head_dim,
                "fp4kv.DecodeWrapper.run: q must be [", e.batch, "][", g.q_heads, "][", g.head_dim, "] (the step's rows, ",
                "the plan's heads), got ", q.sizes());
    c10::cuda::CUDAGuard guard(q.device());
    at::Tensor out = at::empty_like(q);
    at::Tensor lse = at::empty({q.size(0), q.size(1)}, q.options().dtype(at::kFloat));
    const attention::DecodeStep step =
        attention::step_of(*e.cache, e.block_tables.data_ptr<int32_t>(), e.seq_lens.data_ptr<int32_t>(), e.batch);
    d.attention->run(step, attention::layer_view(*e.cache, int(layer)),
                     reinterpret_cast<const __nv_bfloat16*>(q.data_ptr()),
                     reinterpret_cast<__nv_bfloat16*>(out.data_ptr()), lse.data_ptr<float>(), current_stream(q));
    return std::make_tuple(out, lse);
  });
}

// ---- pages, for inspection (CPU) ----

cache::PageLayout layout_of(c10::string_view preset, int64_t head_dim) {
  const Recipe r = parse_recipe(text(preset));
  return cache::PageLayout::make(r.kv, int(head_dim));
}

int64_t page_bytes(c10::string_view preset, int64_t head_dim) {
  return checked("page_bytes", [&] { return int64_t(layout_of(preset, head_dim).bytes); });
}

// One KV head's page in the cache's byte layout from k, v [n <= 128][head_dim] float (k as the
// cache stores it: already transformed when the recipe smooths or rotates keys).
at::Tensor quantize_page(const at::Tensor& k, const at::Tensor& v, c10::string_view preset) {
  return checked("quantize_page", [&] {
    TORCH_CHECK(k.dim() == 2 && v.sizes() == k.sizes() && k.size(0) <= cache::kPage,
                "fp4kv.quantize_page: k and v must be the same [n <= 128][head_dim], got ", k.sizes(), " and ", v.sizes());
    const Recipe r = parse_recipe(text(preset));
    const int n = int(k.size(0)), d = int(k.size(1));
    const cache::PageLayout layout = cache::PageLayout::make(r.kv, d);
    const at::Tensor kf = k.to(at::kCPU, at::kFloat).contiguous(), vf = v.to(at::kCPU, at::kFloat).contiguous();
    at::Tensor out = at::zeros({int64_t(layout.bytes)}, at::TensorOptions().dtype(at::kByte));
    if (r.kv == KvFormat::bf16) {
      cache::pack_bf16_page(kf.data_ptr<float>(), vf.data_ptr<float>(), n, layout, out.data_ptr<uint8_t>());
    } else {
      const ref::QuantPage p = ref::quantize_page(kf.data_ptr<float>(), vf.data_ptr<float>(), n, d, r);
      cache::pack_page(p, layout, out.data_ptr<uint8_t>());
    }
    return out;
  });
}

// The page's values as the decode kernels see them: k, v [128][head_dim] float.
std::tuple<at::Tensor, at::Tensor> dequantize_page(const at::Tensor& page, c10::string_view preset, int64_t head_dim) {
  return checked("dequantize_page", [&] {
    const cache::PageLayout layout = layout_of(preset, head_dim);
    const at::Tensor bytes = page.to(at::kCPU).contiguous();
    TORCH_CHECK(bytes.scalar_type() == at::kByte && bytes.numel() == int64_t(layout.bytes),
                "fp4kv.dequantize_page: page must be ", layout.bytes, " uint8 bytes, got ", bytes.numel(), " of ",
                c10::toString(bytes.scalar_type()));
    const int d = int(head_dim);
    at::Tensor k = at::empty({cache::kPage, d}, at::TensorOptions().dtype(at::kFloat));
    at::Tensor v = at::empty({cache::kPage, d}, at::TensorOptions().dtype(at::kFloat));
    if (layout.format == KvFormat::bf16) {
      cache::unpack_bf16_page(bytes.data_ptr<uint8_t>(), layout, k.data_ptr<float>(), v.data_ptr<float>());
      return std::make_tuple(k, v);
    }
    const ref::QuantPage p = cache::unpack_page(bytes.data_ptr<uint8_t>(), layout);
    float* kp = k.data_ptr<float>();
    float* vp = v.data_ptr<float>();
    for (int t = 0; t < cache::kPage; ++t) {
      for (int c = 0; c < d; ++c) {
        kp[t * d + c] = p.k_value(t, c);
        vp[t * d + c] = p.v_value(t, c);
      }
    }
    return std::make_tuple(k, v);
  });
}

}  // namespace

TORCH_LIBRARY(fp4kv, m) {
  m.def("create_cache(int layers, int kv_heads, int head_dim, int num_blocks, str preset, int max_slots, "
        "int max_batch, int max_pages, Tensor? mu_k, Device device) -> (int, Tensor)",
        &create_cache);
  m.def("destroy(int id) -> ()", &destroy);
  m.def("prefill(Tensor(a!) pool, int cache, int layer, Tensor k, Tensor v, Tensor block_row, int start) -> ()");
  m.def("begin_step(Tensor(a!) pool, int cache, Tensor block_tables, Tensor seq_lens) -> ()");
  m.def("append(Tensor(a!) pool, int cache, int layer, Tensor k, Tensor v) -> ()");
  m.def("end_step(Tensor(a!) pool, int cache) -> ()");
  m.def("release(Tensor(a!) pool, int cache, int first_block) -> ()");
  m.def("prefill_attention(Tensor(a!) pool, int cache, int layer, Tensor q, Tensor k, Tensor v, Tensor block_row, "
        "int start) -> (Tensor, Tensor)");
  m.def("cache_errors(int cache) -> (int, int)", &cache_errors);
  m.def("plan_decode(int cache, int q_heads) -> int", &plan_decode);
  m.def("decode(Tensor q, Tensor pool, int plan, int layer) -> (Tensor, Tensor)");
  m.def("page_bytes(str preset, int head_dim) -> int", &page_bytes);
  m.def("quantize_page(Tensor k, Tensor v, str preset) -> Tensor");
  m.def("dequantize_page(Tensor page, str preset, int head_dim) -> (Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(fp4kv, CUDA, m) {
  m.impl("prefill", &prefill);
  m.impl("begin_step", &begin_step);
  m.impl("append", &append);
  m.impl("end_step", &end_step);
  m.impl("release", &release);
  m.impl("prefill_attention", &prefill_attention);
  m.impl("decode", &decode);
}

// The page codecs run on the CPU; a CUDA page or K/V is copied there first.
TORCH_LIBRARY_IMPL(fp4kv, CPU, m) {
  m.impl("quantize_page", &quantize_page);
  m.impl("dequantize_page", &dequantize_page);
}

TORCH_LIBRARY_IMPL(fp4kv, CUDA, m2) {
  m2.impl("quantize_page", &quantize_page);
  m2.impl("dequantize_page", &dequantize_page);
}

}  // namespace fp4kv::torch_ext
