// Chunked-prefill attention (prefill.h): the query transform, the prefix expansion from the
// cache's pages and slot rows into BF16 tiles, and the passes of prefill_flash.cuh.
#include "fp4kv/attention/prefill.h"

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <string>

#include "fp4kv/attention/prefill_flash.cuh"
#include "fp4kv/attention/prefill_wgmma.cuh"
#include "fp4kv/cache/cuda_check.h"
#include "fp4kv/cache/warp_hadamard.cuh"
#include "fp4kv/core/block_quant.h"
#include "fp4kv/core/decode_layout.h"
#include "fp4kv/core/error.h"
#include "fp4kv/core/minifloat.h"
#include "fp4kv/core/transform.h"

namespace fp4kv::attention {

namespace detail {

inline constexpr int kQueryRowsPerBlock = 4;    // prefill_query_kernel: a warp per (token, head) row
inline constexpr int kGatherThreads = 128;      // prefill_gather_kernel: one 64-key tile per CTA

// ---- Query transform -------------------------------------------------------------------
// Row (t, h) of the chunk's queries as the prefix's transformed keys need it: H q rounded to
// BF16 (rotate), and the logit shift q . mu_k in log2 units (smooth): k = H^T k' + mu_k, so
// q . k = (H q) . k' + q . mu_k. One warp per row.
struct QueryTransformArgs {
  const uint16_t* q = nullptr;  // [T][q_heads][D]
  const float* mu = nullptr;    // the layer's [kv_heads][D], or null
  uint16_t* q_t = nullptr;      // [T][q_heads][D]
  float* offset = nullptr;      // [T][q_heads]
  int rows = 0, q_heads = 0, group = 1;
  bool rotate = false;
  float scale_log2 = 0.0f;
};

template <int D>
__global__ void prefill_query_kernel(const QueryTransformArgs a) {
  const int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
  if (row >= a.rows) return;
  constexpr int E = D / 32;
  cache::detail::RowFrag<D> r;
  const uint16_t* src = a.q + size_t(row) * D + lane * E;
#pragma unroll
  for (int i = 0; i < E; ++i) r.x[i] = __uint_as_float(uint32_t(src[i]) << 16);
  float dot = 0.0f;
  if (a.mu) {
    const float* mu = a.mu + size_t((row % a.q_heads) / a.group) * D + lane * E;
#pragma unroll
    for (int i = 0; i < E; ++i) dot = fmaf(r.x[i], mu[i], dot);
    dot = warp_sum_xor(dot, 1);
  }
  if (a.rotate) cache::detail::warp_fwht<D>(r, lane);
  uint16_t* dst = a.q_t + size_t(row) * D + lane * E;
#pragma unroll
  for (int i = 0; i < E; ++i) dst[i] = uint16_t(bf16_bits(r.x[i]));
  if (lane == 0) a.offset[row] = dot * a.scale_log2;
}

// ---- Prefix expansion ------------------------------------------------------------------
// Rows of one window of the prefix for every KV head: pages [page_begin, page_end) of the
// pool (128 rows each, tile factors = the page's scales), then, in the last window, the BF16
// rows (sink, then recent; factor 1) padded to a whole tile. Every value is the exact BF16
// expansion of what the cache stores; keys the prefix does not attend are masked.
struct GatherArgs {
  const uint8_t* pool = nullptr;  // the layer's pool
  long long block_stride = 0;
  cache::PageLayout layout;
  const int32_t* block_row = nullptr;
  const uint16_t* slots = nullptr;  // slot buffer, or null (BF16 format)
  const int32_t* slot = nullptr;    // [1] the request's slot
  int layer = 0, slot_count = 0, kv_heads = 0;
  DecodeLayout prefix;              // what the prefix attends (quant_pages = pool pages)
  int page_begin = 0, page_end = 0;
  bool with_bf16_rows = false;
  int rows = 0;                     // rows of this window (multiple of 64)
  int row_stride_heads = 0;         // rows per KV head in the output arrays
  uint16_t* k = nullptr;            // [kv_heads][row_stride_heads][D]
  uint16_t* v = nullptr;
  float* k_factor = nullptr;        // [kv_heads][row_stride_heads / 64]
  float* v_factor = nullptr;
  uint32_t* mask = nullptr;         // [kv_heads][row_stride_heads / 32]
};

// The stored value of key (kKey) or value element (t, c) of a page as a float (exact in BF16).
template <KvFormat F, bool kKey>
__device__ __forceinline__ float page_element(const uint8_t* page, const cache::PageLayout& l, int t, int c) {
  if constexpr (F == KvFormat::nvfp4 || F == KvFormat::mxfp4) {
    const cache::CodeAddress n = kKey ? cache::k_code_address(l, t, c) : cache::v_code_address(l, t, c);
    const uint8_t code = cache::fp4_code_of_stored(page[n.byte], n.odd);
    const uint8_t scale = page[kKey ? cache::k_scale_offset(l, t, c) : cache::v_scale_offset(l, t, c)];
    return F == KvFormat::nvfp4 ? e2m1_value(code) * e4m3_value(scale) : mxfp4_value(code, scale);
  } else if constexpr (F == KvFormat::fp8) {
    return e4m3_value(page[kKey ? cache::k_fp8_offset(l, t, c) : cache::v_fp8_offset(l, t, c)]);
  } else {
    const int offset = kKey ? cache::bf16_k_offset(l, t, c) : cache::bf16_v_offset(l, t, c);
    return __uint_as_float(uint32_t(*reinterpret_cast<const uint16_t*>(page + offset)) << 16);
  }
}
// The page's K and V factors (NVFP4: the global scales; FP8: the slice scales; else 1).
template <KvFormat F>
__device__ __forceinline__ float2 page_factors(const uint8_t* page, const cache::PageLayout& l) {
  if constexpr (F == KvFormat::nvfp4 || F == KvFormat::fp8) {
    const float* s = reinterpret_cast<const float*>(page + l.page_scales);
    return make_float2(s[0], s[1]);
  } else {
    return make_float2(1.0f, 1.0f);
  }
}

// Grid (rows / 64, kv_heads), kGatherThreads threads: one tile of one KV head.
template <KvFormat F, int D>
__global__ void prefill_gather_kernel(const GatherArgs a) {
  const int tile = blockIdx.x, g = blockIdx.y;
  const int page_rows = (a.page_end - a.page_begin) * cache::kPage;
  uint16_t* kout = a.k + (size_t(g) * a.row_stride_heads + size_t(tile) * kFlashKeys) * D;
  uint16_t* vout = a.v + (size_t(g) * a.row_stride_heads + size_t(tile) * kFlashKeys) * D;
  const int row0 = tile * kFlashKeys;
  const int slot = a.slots ? *a.slot : -1;
  __shared__ uint32_t mask_bits[2];
  if (threadIdx.x < 2) mask_bits[threadIdx.x] = 0;
  __syncthreads();
  for (int i = threadIdx.x; i < kFlashKeys * D; i += blockDim.x) {
    const int r = i / D, c = i % D, row = row0 + r;
    float kv = 0.0f, vv = 0.0f;
    bool valid = false;
    if (row < page_rows) {
      const int p = a.page_begin + row / cache::kPage, t = row % cache::kPage;
      const uint8_t* page = a.pool + a.block_row[p] * a.block_stride + static_cast<long long>(g) * a.layout.bytes;
      const bool last = p == a.prefix.quant_pages - 1;
      valid = (!last || t < a.prefix.last_page_tokens) && !(p == 0 && t < a.prefix.masked_prefix);
      kv = page_element<F, true>(page, a.layout, t, c);
      vv = page_element<F, false>(page, a.layout, t, c);
    } else if (a.with_bf16_rows && slot >= 0) {
      const int idx = row - page_rows;
      const int recent = a.prefix.recent_end - a.prefix.recent_begin;
      int slot_row = -1;
      if (idx < a.prefix.sink_tokens) slot_row = idx;
      else if (idx - a.prefix.sink_tokens < recent)
        slot_row = kSinkTokens + (a.prefix.recent_begin + idx - a.prefix.sink_tokens) % cache::kPage;
      if (slot_row >= 0) {
        valid = true;
        kv = __uint_as_float(uint32_t(a.slots[cache::slot_row_offset(a.layer, slot, g, 0, slot_row, a.slot_count,
                                                                     a.kv_heads, D) + c]) << 16);
        vv = __uint_as_float(uint32_t(a.slots[cache::slot_row_offset(a.layer, slot, g, 1, slot_row, a.slot_count,
                                                                     a.kv_heads, D) + c]) << 16);
      }
    }
    kout[size_t(r) * D + c] = uint16_t(bf16_bits(valid ? kv : 0.0f));
    vout[size_t(r) * D + c] = uint16_t(bf16_bits(valid ? vv : 0.0f));
    if (c == 0 && valid) atomicOr(&mask_bits[r / 32], 1u << (r % 32));
  }
  __syncthreads();
  const int tiles_per_head = a.row_stride_heads / kFlashKeys;
  if (threadIdx.x < 2) a.mask[size_t(g) * (a.row_stride_heads / 32) + 2 * tile + threadIdx.x] = mask_bits[threadIdx.x];
  if (threadIdx.x == 0) {
    float2 f = make_float2(1.0f, 1.0f);
    if (row0 < page_rows) {
      const int p = a.page_begin + row0 / cache::kPage;
      f = page_factors<F>(a.pool + a.block_row[p] * a.block_stride + static_cast<long long>(g) * a.layout.bytes,
                          a.layout);
    }
    a.k_factor[size_t(g) * tiles_per_head + tile] = f.x;
    a.v_factor[size_t(g) * tiles_per_head + tile] = f.y;
  }
}

template <int D>
void launch_gather(KvFormat f, const GatherArgs& a, cudaStream_t stream) {
  const dim3 grid(a.rows / kFlashKeys, a.kv_heads);
  switch (f) {
    case KvFormat::nvfp4: prefill_gather_kernel<KvFormat::nvfp4, D><<<grid, kGatherThreads, 0, stream>>>(a); break;
    case KvFormat::mxfp4: prefill_gather_kernel<KvFormat::mxfp4, D><<<grid, kGatherThreads, 0, stream>>>(a); break;
    case KvFormat::fp8: prefill_gather_kernel<KvFormat::fp8, D><<<grid, kGatherThreads, 0, stream>>>(a); break;
    default: prefill_gather_kernel<KvFormat::bf16, D><<<grid, kGatherThreads, 0, stream>>>(a); break;
  }
}

template <int D, int M>
void launch_flash(const FlashArgs& a, cudaStream_t stream) {
  using Shape = FlashShape<D, M>;
  const dim3 grid((a.T + Shape::kRows - 1) / Shape::kRows, a.q_heads);
  prefill_flash_kernel<D, M><<<grid, kFlashThreads, Shape::kSmemBytes, stream>>>(a);
}

// The driver's tensor-map encoder, found once through the runtime (nothing links libcuda), in
// the CUDA 12.0 form its function-pointer type (the _v12000 typedef) describes.
PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  constexpr unsigned kEncoderCudaVersion = 12000;
  static const PFN_cuTensorMapEncodeTiled_v12000 encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found{};
    cache::cuda_check(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, kEncoderCudaVersion,
                                                       cudaEnableDefault, &found),
                      "PrefillAttention: cudaGetDriverEntryPointByVersion");
    require(found == cudaDriverEntryPointSuccess && fn != nullptr,
            "PrefillAttention: the CUDA driver has no cuTensorMapEncodeTiled");
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  }();
  return encode;
}

// The tensor map of `rows` BF16 rows of D channels per head: row r of head h at base + h *
// head_stride + r * row_stride (elements), read in boxes of kTmaBoxCols channels x kTmaBoxRows
// rows of one head in the 128-byte swizzle; rows at or past `rows` read as zeros.
template <int D>
CUtensorMap bf16_rows_map(const uint16_t* base, long rows, int heads, long row_stride, long head_stride) {
  const cuuint64_t dims[3] = {cuuint64_t(D), cuuint64_t(rows), cuuint64_t(heads)};
  const cuuint64_t strides[2] = {cuuint64_t(row_stride) * 2, cuuint64_t(head_stride) * 2};  // bytes
  const cuuint32_t box[3] = {kTmaBoxCols, kTmaBoxRows, 1};
  const cuuint32_t element_strides[3] = {1, 1, 1};
  CUtensorMap map;
  const CUresult r = tensor_map_encoder()(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, const_cast<uint16_t*>(base), dims,
                                          strides, box, element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
                                          CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                                          CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS)
    throw Error("PrefillAttention: cuTensorMapEncodeTiled failed (CUresult " + std::to_string(int(r)) +
                "): rows and the base address must be 16-byte aligned");
  return map;
}

template <int D>
void launch_wgmma(const FlashArgs& a, cudaStream_t stream) {
  using Shape = WgmmaShape<D>;
  const int kv_heads = a.q_heads / a.group;
  const WgmmaMaps maps{bf16_rows_map<D>(a.q, a.T, a.q_heads, a.q_row_stride, D),
                       bf16_rows_map<D>(a.k, a.n_keys, kv_heads, a.kv_row_stride, a.kv_head_stride),
                       bf16_rows_map<D>(a.v, a.n_keys, kv_heads, a.kv_row_stride, a.kv_head_stride)};
  const dim3 grid((a.T + Shape::kRows - 1) / Shape::kRows, a.q_heads);
  prefill_wgmma_kernel<D><<<grid, Shape::kThreads, Shape::kSmemBytes, stream>>>(a, maps);
}

template <int D>
void configure_wgmma() {
  cache::cuda_check(cudaFuncSetAttribute(prefill_wgmma_kernel<D>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         WgmmaShape<D>::kSmemBytes),
                    "PrefillAttention: cudaFuncSetAttribute");
}

template <int D, int M>
void configure_flash() {
  cache::cuda_check(cudaFuncSetAttribute(prefill_flash_kernel<D, M>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         FlashShape<D, M>::kSmemBytes),
                    "PrefillAttention: cudaFuncSetAttribute");
}

}  // namespace detail

namespace {

// What the prefix [0, start) attends, with the pool's pages as quant_pages (the BF16 format
// keeps every token in its pool pages, the unfinished one included).
DecodeLayout prefix_layout(const Recipe& recipe, int start) {
  if (start <= 0) return DecodeLayout{};
  if (recipe.kv == KvFormat::bf16) {
    DecodeLayout l;
    l.quant_pages = (start + kPageTokens - 1) / kPageTokens;
    l.last_page_tokens = start - (l.quant_pages - 1) * kPageTokens;
    return l;
  }
  // ref/prefill_attention.cpp: the decode view of start + 1 tokens without its last BF16 row
  // (pages are promoted when their 128th token arrives), or of `start` tokens when the open
  // page is quantized on write.
  if (recipe.bf16_recent) {
    DecodeLayout l = decode_layout(start + 1, true, recipe.bf16_sink, true);
    l.recent_end -= 1;
    return l;
  }
  return decode_layout(start, true, recipe.bf16_sink, false);
}

int round_up(int x, int m) { return (x + m - 1) / m * m; }

}  // namespace

PrefillAttention::PrefillAttention(const cache::KvCache& cache, const PrefillConfig& config)
    : cache_(cache), config_(config) {
  const cache::KvCacheConfig& c = cache.config();
  require(supports_head_dim(c.head_dim),
          "PrefillAttention: head_dim " + std::to_string(c.head_dim) + " (the prefill kernel supports 64 and 128)");
  require(config.q_heads >= c.kv_heads && config.q_heads % c.kv_heads == 0,
          "PrefillAttention: q_heads " + std::to_string(config.q_heads) + " is not a multiple of the cache's " +
              std::to_string(c.kv_heads) + " KV heads");
  require(config.max_chunk_tokens >= 1, "PrefillAttention: max_chunk_tokens " +
                                            std::to_string(config.max_chunk_tokens) + " must be at least 1");
  require(config.cta_rows == kNarrowCtaRows || config.cta_rows == kWideCtaRows,
          "PrefillAttention: cta_rows " + std::to_string(config.cta_rows) + " (64 or 128)");
  require(config.prefix_window >= kPageTokens && config.prefix_window % kPageTokens == 0,
          "PrefillAttention: prefix_window " + std::to_string(config.prefix_window) +
              " must be a positive multiple of 128");
  group_ = config.q_heads / c.kv_heads;
  const int d = c.head_dim;
  // The last window also holds the BF16 rows: sink + recent, at most 144, in whole tiles.
  window_rows_ = config.prefix_window + round_up(kSinkTokens + kPageTokens, detail::kFlashKeys);
  const size_t rows_q = size_t(config.max_chunk_tokens) * config.q_heads;
  const size_t rows_kv = size_t(c.kv_heads) * window_rows_;
  auto aligned = [](size_t b) { return (b + 255) / 256 * 256; };
  const size_t sizes[] = {aligned(rows_q * d * 2), aligned(rows_q * 4), aligned(rows_q * d * 4), aligned(rows_q * 4),
                          aligned(rows_kv * d * 2), aligned(rows_kv * d * 2),
                          aligned(rows_kv / detail::kFlashKeys * 4), aligned(rows_kv / detail::kFlashKeys * 4),
                          aligned(rows_kv / 32 * 4)};
  for (size_t s : sizes) workspace_bytes_ += s;
  cache::cuda_check(cudaMalloc(&workspace_, workspace_bytes_), "PrefillAttention: cudaMalloc of the workspace");
  uint8_t* p = static_cast<uint8_t*>(workspace_);
  void* parts[9];
  for (int i = 0; i < 9; ++i) {
    parts[i] = p;
    p += sizes[i];
  }
  query_t_ = static_cast<uint16_t*>(parts[0]);
  query_offset_ = static_cast<float*>(parts[1]);
  state_o_ = static_cast<float*>(parts[2]);
  state_lse_ = static_cast<float*>(parts[3]);
  prefix_k_ = static_cast<uint16_t*>(parts[4]);
  prefix_v_ = static_cast<uint16_t*>(parts[5]);
  tile_k_factor_ = static_cast<float*>(parts[6]);
  tile_v_factor_ = static_cast<float*>(parts[7]);
  key_mask_ = static_cast<uint32_t*>(parts[8]);
  const bool wide = config.cta_rows == kWideCtaRows;
  if (d == 64) {
    wide ? detail::configure_flash<64, 2>() : detail::configure_flash<64, 1>();
    return;
  }
  if (uses_warpgroup_mma()) detail::configure_wgmma<128>();
  else wide ? detail::configure_flash<128, 2>() : detail::configure_flash<128, 1>();
}

bool PrefillAttention::uses_warpgroup_mma() const {
  return cache_.config().head_dim == kWarpgroupHeadDim && config_.mma != PrefillMma::sync;
}

PrefillAttention::~PrefillAttention() { cudaFree(workspace_); }

namespace {

// The variant of the head size, instruction and CTA height (mma.sync with 64 rows: one m-tile
// per warp; 128: two).
void launch_flash_for(int d, int cta_rows, bool warpgroup, const detail::FlashArgs& a, cudaStream_t stream) {
  const bool wide = cta_rows == PrefillAttention::kWideCtaRows;
  if (d == 64) wide ? detail::launch_flash<64, 2>(a, stream) : detail::launch_flash<64, 1>(a, stream);
  else if (warpgroup) detail::launch_wgmma<128>(a, stream);
  else wide ? detail::launch_flash<128, 2>(a, stream) : detail::launch_flash<128, 1>(a, stream);
}

}  // namespace

// What both parts' passes share: the chunk's T query rows of q, the heads and the scale.
detail::FlashArgs PrefillAttention::pass_args(const uint16_t* q, int T) const {
  const int d = cache_.config().head_dim;
  detail::FlashArgs fa;
  fa.q = q;
  fa.q_row_stride = long(config_.q_heads) * d;
  fa.T = T;
  fa.q_heads = config_.q_heads;
  fa.group = group_;
  fa.scale_log2 = log2e_over_sqrt_d(d);
  return fa;
}

void PrefillAttention::transform_queries(int layer, int T, const uint16_t* q, cudaStream_t stream) const {
  const cache::KvCacheConfig& c = cache_.config();
  const Recipe& recipe = cache_.recipe();
  const int d = c.head_dim;
  detail::QueryTransformArgs qa;
  qa.q = q;
  qa.mu = recipe.smooth_keys && cache_.mu_k_device() ? cache_.mu_k_device() + size_t(layer) * c.kv_heads * d : nullptr;
  qa.q_t = query_t_;
  qa.offset = query_offset_;
  qa.rows = T * config_.q_heads;
  qa.q_heads = config_.q_heads;
  qa.group = group_;
  qa.rotate = recipe.rotate_keys;
  qa.scale_log2 = log2e_over_sqrt_d(d);
  const int blocks = (qa.rows + detail::kQueryRowsPerBlock - 1) / detail::kQueryRowsPerBlock;
  const int threads = detail::kQueryRowsPerBlock * 32;
  if (d == 64) detail::prefill_query_kernel<64><<<blocks, threads, 0, stream>>>(qa);
  else detail::prefill_query_kernel<128><<<blocks, threads, 0, stream>>>(qa);
}

void PrefillAttention::attend_prefix(int layer, const int32_t* block_row, int start, int T,
                                     cudaStream_t stream) const {
  const cache::KvCacheConfig& c = cache_.config();
  const int d = c.head_dim;
  const DecodeLayout prefix = prefix_layout(cache_.recipe(), start);
  const int pages_per_window = config_.prefix_window / kPageTokens;
  const int bf16_rows = round_up(prefix.bf16_tokens(), detail::kFlashKeys);
  const int windows = std::max(1, (prefix.quant_pages + pages_per_window - 1) / pages_per_window);
  // What every window shares: the cache's pages and slot rows in, the workspace out.
  detail::GatherArgs ga;
  ga.pool = cache_.pool(layer);
  ga.block_stride = cache_.block_stride();
  ga.layout = cache_.layout();
  ga.block_row = block_row;
  ga.slots = cache_.slot_buffer();
  ga.slot = cache_.prefill_slot();
  ga.layer = layer;
  ga.slot_count = c.max_slots;  // the slot buffer's `slots` dimension
  ga.kv_heads = c.kv_heads;
  ga.prefix = prefix;
  ga.row_stride_heads = window_rows_;
  ga.k = prefix_k_;
  ga.v = prefix_v_;
  ga.k_factor = tile_k_factor_;
  ga.v_factor = tile_v_factor_;
  ga.mask = key_mask_;
  detail::FlashArgs fa = pass_args(query_t_, T);
  fa.q_logit_offset = query_offset_;
  fa.k = prefix_k_;
  fa.v = prefix_v_;
  fa.kv_head_stride = long(window_rows_) * d;
  fa.kv_row_stride = d;
  fa.tile_k_factor = tile_k_factor_;
  fa.tile_v_factor = tile_v_factor_;
  fa.tile_stride = window_rows_ / detail::kFlashKeys;
  fa.key_mask = key_mask_;
  fa.mask_stride = window_rows_ / 32;
  fa.out_o = state_o_;
  fa.out_lse = state_lse_;
  for (int w = 0; w < windows; ++w) {
    ga.page_begin = w * pages_per_window;
    ga.page_end = std::min(prefix.quant_pages, ga.page_begin + pages_per_window);
    ga.with_bf16_rows = w == windows - 1 && bf16_rows > 0;
    ga.rows = (ga.page_end - ga.page_begin) * kPageTokens + (ga.with_bf16_rows ? bf16_rows : 0);
    if (ga.rows == 0) continue;
    if (d == 64) detail::launch_gather<64>(cache_.recipe().kv, ga, stream);
    else detail::launch_gather<128>(cache_.recipe().kv, ga, stream);
    fa.n_keys = ga.rows;
    fa.state_o = w > 0 ? state_o_ : nullptr;  // each thread rewrites only what it read: in place
    fa.state_lse = w > 0 ? state_lse_ : nullptr;
    launch_flash_for(d, config_.cta_rows, uses_warpgroup_mma(), fa, stream);
  }
}

void PrefillAttention::run(int layer, const int32_t* block_row, int start, int T, const uint16_t* q,
                           const uint16_t* k, const uint16_t* v, uint16_t* out, float* lse,
                           cudaStream_t stream) const {
  const cache::KvCacheConfig& c = cache_.config();
  // Per layer of every chunk: the messages are built only on failure.
  if (layer < 0 || layer >= c.layers)
    throw Error("PrefillAttention::run: layer " + std::to_string(layer) + " outside [0, " + std::to_string(c.layers) +
                ")");
  if (T < 1 || T > config_.max_chunk_tokens)
    throw Error("PrefillAttention::run: chunk of " + std::to_string(T) + " tokens outside [1, " +
                std::to_string(config_.max_chunk_tokens) + "]");
  if (start < 0 || long(start) + T > long(c.max_pages) * kPageTokens)
    throw Error("PrefillAttention::run: tokens [" + std::to_string(start) + ", " + std::to_string(start + T) +
                ") exceed the cache's " + std::to_string(c.max_pages) + " pages per request");
  if (!(q && k && v && out && block_row)) throw Error("PrefillAttention::run: null q, k, v, out or block_row");
  const int d = c.head_dim;
  if (start > 0) {
    transform_queries(layer, T, q, stream);
    attend_prefix(layer, block_row, start, T, stream);
  }
  // The chunk's own keys, causally, continuing the prefix's softmax.
  detail::FlashArgs fa = pass_args(q, T);
  fa.k = k;
  fa.v = v;
  fa.kv_head_stride = d;
  fa.kv_row_stride = long(c.kv_heads) * d;
  fa.n_keys = T;
  fa.causal = true;
  fa.state_o = start > 0 ? state_o_ : nullptr;
  fa.state_lse = start > 0 ? state_lse_ : nullptr;
  fa.out = out;
  fa.out_lse = lse;
  launch_flash_for(d, config_.cta_rows, uses_warpgroup_mma(), fa, stream);
  cache::cuda_check(cudaGetLastError(), "PrefillAttention::run: launch");
}

}  // namespace fp4kv::attention
