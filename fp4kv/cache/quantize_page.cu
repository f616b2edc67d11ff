// Page quantization: one CTA builds one KV head's K part or V part of one cache block
// (layout.h) from 128 tokens. The tokens come from the prefill input (transformed and
// rounded to BF16 here) or from the slot's BF16 recent rows; either way the quantizer
// sees the BF16 values, so every path produces the same bytes (docs/DESIGN.md, "Cache
// semantics"). The block quantizers are core/block_quant.h's, bit-exact with the CPU.
//
// Phases: (A) rows -> BF16 tile in shared memory, (B) slice amax -> page scale,
// (C) one thread per microscaling block -> codes (one per byte, at their layout position)
// and scales in shared memory, (D) codes packed two per byte and everything written out
// with 16-byte stores.
#include <climits>

#include "fp4kv/cache/cuda_check.h"
#include "fp4kv/cache/device_common.cuh"
#include "fp4kv/core/block_quant.h"
#include "fp4kv/core/error.h"

namespace fp4kv::cache::detail {
namespace {

constexpr int kThreads = 256;

template <int D, KvFormat F>
struct PageTraits {
  static constexpr bool fp4 = F == KvFormat::nvfp4 || F == KvFormat::mxfp4;
  static constexpr int B = F == KvFormat::nvfp4 ? kNvfp4Block : (F == KvFormat::mxfp4 ? kMxfp4Block : 1);
  static constexpr int tile_bytes = kPage * D * 2;          // BF16 values [128][D]
  static constexpr int stage_bytes = kPage * D;             // one code per byte, at layout positions
  static constexpr int scale_bytes = fp4 ? kPage * D / B : 0;  // same for K and V
  static constexpr int smem_bytes = tile_bytes + stage_bytes + (scale_bytes + 15) / 16 * 16;
  // Resident CTAs per SM the registers are capped for: the block quantizers are chains of
  // dependent float operations, so more warps hide more of their latency. NVFP4 and FP8 fit
  // 64 registers without spilling (4 CTAs at d = 128: 49 KB of shared memory each); MXFP4
  // fits 128 (2 CTAs; uncapped it took ~200 registers and one CTA per SM, capped at 80 it
  // spills 416 bytes).
  static constexpr int kMinBlocks = F == KvFormat::mxfp4 ? 2 : 4;
};

struct PageTask {
  int layer = 0, head = 0, kv = 0, block = 0, slot = 0;
  int page = 0;                  // page index within the sequence
  int n_present = 0;             // tokens present; the rest are zeros
  int input_first = INT_MAX;     // token position of input row 0 (INT_MAX: no input)
  const float* input = nullptr;  // this head's row of token input_first (K or V)
  long long input_stride = 0;    // floats between consecutive tokens of the input
  const float* rope_input = nullptr;  // latent caches: r of token input_first ([rope_dim] per token)
  unsigned long long* count = nullptr;  // where non-finite input elements are counted
};

template <int D, KvFormat F>
__device__ void build_page(const CacheDims& dims, const CacheMem& mem, const PageTask& task, uint8_t* smem) {
  using T = PageTraits<D, F>;
  constexpr int E = D / 32;
  __shared__ float scratch_f[32];
  __shared__ int scratch_i[32];
  uint16_t* tile = reinterpret_cast<uint16_t*>(smem);
  uint8_t* stage = smem + T::tile_bytes;
  uint8_t* scales = stage + T::stage_bytes;
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32, warps = kThreads / 32;
  const bool is_key = task.kv == 0;

  // (A) rows.
  const float* mu = is_key ? mu_row(dims, mem, task.layer, task.head) : nullptr;
  const uint16_t* recent = slot_row(dims, mem, task.layer, task.slot, task.head, task.kv, kSinkTokens);
  int bad = 0;
  for (int t = warp; t < kPage; t += warps) {
    uint16_t v[E];
    const int pos = task.page * kPage + t;
    if (t >= task.n_present) {
#pragma unroll
      for (int i = 0; i < E; ++i) v[i] = 0;
    } else if (pos >= task.input_first) {
      cache_row<D>(task.input + (pos - task.input_first) * task.input_stride, mu, is_key, dims.smooth, dims.rotate,
                   lane, v, bad);
    } else {
      load_bf16<E>(recent + (pos % kPage) * dims.slot_row_stride() + lane * E, v);
    }
    store_bf16<E>(tile + t * D + lane * E, v);
  }
  flush_nonfinite(task.count, bad);
  __syncthreads();

  // (B) slice amax over the finite values (the padding zeros change nothing).
  float amax = 0.0f;
  for (int i = tid * 8; i < kPage * D; i += kThreads * 8) {
    const uint4 w = *reinterpret_cast<const uint4*>(tile + i);
    const uint32_t words[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
    for (int q = 0; q < 8; ++q) {
      const float x = bf16_bits_to_float_dev(uint16_t(words[q / 2] >> (16 * (q % 2))));
      if (is_finite(x)) amax = max_f(amax, abs_f(x));
    }
  }
  amax = block_max(amax, scratch_f);

  // (C) codes and block scales.
  float page_scale = 1.0f;
  if constexpr (T::fp4) {
    constexpr int B = T::B;
    const bool nv = F == KvFormat::nvfp4;
    const float g = nv ? nvfp4_global_scale(amax) : 1.0f;
    const bool search = is_key && dims.search;
    const int rows = is_key ? kPage : D;        // A-operand rows: keys (K) or channels (V^T)
    const int cols = is_key ? D : kPage;        // A-operand columns: channels (K) or keys (V^T)
    const int row_blocks = cols / B;
    for (int blk = tid; blk < rows * row_blocks; blk += kThreads) {
      // K: consecutive threads take consecutive blocks of one token row. V: consecutive
      // threads take consecutive channels (conflict-free column reads of the tile).
      const int r = is_key ? blk / row_blocks : blk % D;
      const int j = is_key ? blk % row_blocks : blk / D;
      float x[B];
#pragma unroll
      for (int i = 0; i < B; ++i) {
        const int c = j * B + i;
        x[i] = bf16_bits_to_float_dev(is_key ? tile[r * D + c] : tile[c * D + r]);
      }
      uint8_t codes[B];
      uint8_t s;
      if constexpr (F == KvFormat::nvfp4) {
        s = nvfp4_quantize_block(x, 1, g, search, codes);
      } else {
        s = mxfp4_quantize_block(x, 1, search, codes);
      }
      scales[scale_offset(r, j, row_blocks)] = s;
#pragma unroll
      for (int i = 0; i < B; ++i) {
        const NibbleAddress a = fp4_code_address(r, j * B + i, cols);
        stage[a.byte * 2 + a.nibble] = codes[i];
      }
    }
    if (nv) page_scale = g;
  } else {  // FP8: one scale per slice
    page_scale = fp8_slice_scale(amax);
    for (int e = tid; e < kPage * D; e += kThreads) {
      const int t = e / D, c = e % D;
      const uint8_t code = fp8_encode(bf16_bits_to_float_dev(tile[e]), page_scale);
      stage[is_key ? fp8_code_offset(t, c, D) : fp8_code_offset(c, t, kPage)] = code;
    }
  }
  __syncthreads();

  // (D) write out.
  const PageLayout& L = dims.layout;
  uint8_t* dst = block_head(dims, mem, task.layer, task.block, task.head);
  uint8_t* codes_dst = dst + (is_key ? L.k_codes : L.v_codes);
  if constexpr (T::fp4) {
    constexpr int out_bytes = kPage * D / 2;
    for (int i = tid; i < out_bytes / 16; i += kThreads) {
      const uint4 a = *reinterpret_cast<const uint4*>(stage + 32 * i);
      const uint4 b = *reinterpret_cast<const uint4*>(stage + 32 * i + 16);
      const uint32_t in[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
      uint32_t out[4];
#pragma unroll
      for (int w = 0; w < 4; ++w) {
        // in[2w] holds codes of bytes 4w, 4w+1 (two codes each); in[2w + 1] of 4w+2, 4w+3.
        uint32_t o = 0;
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          const uint32_t src = in[2 * w + q / 2] >> (16 * (q % 2));
          o |= ((src & 0xFu) | ((src >> 4) & 0xF0u)) << (8 * q);
        }
        out[w] = o;
      }
      *reinterpret_cast<uint4*>(codes_dst + 16 * i) = make_uint4(out[0], out[1], out[2], out[3]);
    }
    uint8_t* scales_dst = dst + (is_key ? L.k_scales : L.v_scales);
    for (int i = tid; i < T::scale_bytes / 16; i += kThreads)
      *reinterpret_cast<uint4*>(scales_dst + 16 * i) = *reinterpret_cast<const uint4*>(scales + 16 * i);
    if constexpr (F == KvFormat::mxfp4) {
      // Page scale 2^(emax - 15), emax the largest block exponent (host_page.cpp).
      int m = 0;
      for (int i = tid; i < T::scale_bytes; i += kThreads) m = max(m, int(scales[i]));
      m = block_max(m, scratch_i);
      const int emax = m - kE8M0Bias;
      page_scale = pow2f(emax - 15 > -149 ? emax - 15 : -149);
    }
  } else {
    constexpr int out_bytes = kPage * D;
    for (int i = tid; i < out_bytes / 16; i += kThreads)
      *reinterpret_cast<uint4*>(codes_dst + 16 * i) = *reinterpret_cast<const uint4*>(stage + 16 * i);
  }
  if (tid == 0) reinterpret_cast<float*>(dst + L.page_scales)[task.kv] = page_scale;
  __syncthreads();  // shared memory is reused by the next task of this CTA
}

// Latent caches: the page's positional-key rows, BF16 and never quantized, from the prefill
// input (rounded here, non-finite elements counted and stored as 0) or from the slot's recent
// rows; rows past n_present are zero.
__device__ void copy_rope_rows(const CacheDims& dims, const CacheMem& mem, const PageTask& task) {
  const int W = dims.rope_dim;
  uint16_t* dst = reinterpret_cast<uint16_t*>(block_head(dims, mem, task.layer, task.block, 0) + dims.r_rows);
  const uint16_t* recent = slot_row(dims, mem, task.layer, task.slot, 0, 1, kSinkTokens);
  int bad = 0;
  for (int e = threadIdx.x; e < kPage * W; e += kThreads) {  // uniform trip count (kPage * W % kThreads == 0)
    const int t = e / W, c = e % W, pos = task.page * kPage + t;
    uint16_t v = 0;
    if (t < task.n_present && pos >= task.input_first) {
      const float x = task.rope_input[static_cast<long long>(pos - task.input_first) * W + c];
      if (is_finite(x)) v = __bfloat16_as_ushort(__float2bfloat16_rn(x));
      else ++bad;
    } else if (t < task.n_present) {
      v = recent[(pos % kPage) * dims.slot_row_stride() + c];
    }
    dst[e] = v;
  }
  flush_nonfinite(task.count, bad);
}

// One task: the page's K or V part; a latent cache's page: the latent, then its r rows.
template <int D, KvFormat F>
__device__ void build_task(const CacheDims& dims, const CacheMem& mem, const PageTask& task, uint8_t* smem) {
  build_page<D, F>(dims, mem, task, smem);
  if (dims.latent()) copy_rope_rows(dims, mem, task);
}

enum class PageMode { prefill, open_page, promote };

struct PageKernelArgs {
  CacheDims dims;
  CacheMem mem;
  PageMode mode = PageMode::prefill;
  PrefillArgs prefill;
  int page_lo = 0;  // prefill: first page quantized (grid.x counts from here)
  StepArgs step;
  StepPlan plan;
};

// Reads a device word once for the whole CTA (keeps early exits uniform).
__device__ __forceinline__ int cta_read(const int32_t* p) {
  __shared__ int value;
  __syncthreads();
  if (threadIdx.x == 0) value = *p;
  __syncthreads();
  return value;
}

template <int D, KvFormat F>
__global__ void __launch_bounds__(kThreads, (PageTraits<D, F>::kMinBlocks)) page_kernel(const PageKernelArgs a) {
  extern __shared__ __align__(16) uint8_t smem[];
  const CacheDims& dims = a.dims;
  PageTask task;
  task.kv = blockIdx.z;
  if (a.mode == PageMode::prefill) {
    const int slot = cta_read(a.mem.prefill_slot);
    if (slot < 0) return;
    const int page = a.page_lo + blockIdx.x;
    const int block = a.prefill.block_row[page];
    if (block < 0 || block >= dims.num_blocks) {
      if (threadIdx.x == 0) atomicOr(a.mem.error_flags, kErrorBadSequence);
      return;
    }
    task.layer = a.prefill.layer;
    task.head = blockIdx.y;
    task.block = block;
    task.slot = slot;
    task.page = page;
    task.n_present = min(kPage, a.prefill.end - page * kPage);
    task.input_first = a.prefill.first;
    task.input = (task.kv == 0 ? a.prefill.k : a.prefill.v) + static_cast<long long>(task.head) * D;
    task.input_stride = static_cast<long long>(dims.heads) * D;
    task.rope_input = a.prefill.v;
    task.count = a.mem.nonfinite;
    build_task<D, F>(dims, a.mem, task, smem);
  } else if (a.mode == PageMode::open_page) {
    if (cta_read(a.mem.error_flags) != 0) return;
    const int row = blockIdx.x;
    const int seq = a.step.seq_lens[row];
    task.layer = a.step.layer;
    task.head = blockIdx.y;
    task.page = (seq - 1) / kPage;
    task.n_present = (seq - 1) % kPage + 1;
    task.block = a.step.block_tables[static_cast<long long>(row) * a.step.max_pages + task.page];
    task.slot = a.plan.row_slot[row];
    build_task<D, F>(dims, a.mem, task, smem);
  } else {
    if (cta_read(a.mem.error_flags) != 0) return;
    const int n = cta_read(a.mem.promote_count);
    task.layer = blockIdx.x / dims.heads;
    task.head = blockIdx.x % dims.heads;
    task.n_present = kPage;
    for (int i = blockIdx.y; i < n; i += gridDim.y) {
      const int row = a.mem.promote_rows[i];
      task.block = a.plan.row_promote_block[row];
      task.slot = a.plan.row_slot[row];
      task.page = (a.step.seq_lens[row] - 1) / kPage;
      build_task<D, F>(dims, a.mem, task, smem);
    }
  }
}

// Raises the kernel's dynamic shared memory limit once per process (KvCache's constructor
// does it, so that no attribute call happens while a stream is being captured).
template <int D, KvFormat F>
void prepare_t() {
  static const cudaError_t attr = cudaFuncSetAttribute(page_kernel<D, F>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                       PageTraits<D, F>::smem_bytes);
  cuda_check(attr, "cache page kernel: reserve shared memory");
}

template <int D, KvFormat F>
void launch_t(const PageKernelArgs& a, dim3 grid, cudaStream_t stream) {
  if (grid.x == 0 || grid.y == 0) {
    prepare_t<D, F>();
    return;
  }
  constexpr int smem = PageTraits<D, F>::smem_bytes;
  prepare_t<D, F>();
  page_kernel<D, F><<<grid, kThreads, smem, stream>>>(a);
  cuda_check_launch("cache page kernel launch");
}

template <int D>
void launch_d(const PageKernelArgs& a, dim3 grid, cudaStream_t stream) {
  switch (a.dims.format) {
    case KvFormat::nvfp4: return launch_t<D, KvFormat::nvfp4>(a, grid, stream);
    case KvFormat::mxfp4: return launch_t<D, KvFormat::mxfp4>(a, grid, stream);
    case KvFormat::fp8: return launch_t<D, KvFormat::fp8>(a, grid, stream);
    default: throw Error("cache page kernel: format " + to_string(a.dims.format) + " has no quantized pages");
  }
}

void launch(const PageKernelArgs& a, dim3 grid, cudaStream_t stream) {
  switch (a.dims.d) {
    case 64: return launch_d<64>(a, grid, stream);
    case 128: return launch_d<128>(a, grid, stream);
    case 256: return launch_d<256>(a, grid, stream);
    case kMlaLatentDim:  // latent caches: NVFP4 or MXFP4 (kv_cache.cpp refuses FP8 latents)
      if (a.dims.format == KvFormat::nvfp4) return launch_t<kMlaLatentDim, KvFormat::nvfp4>(a, grid, stream);
      return launch_t<kMlaLatentDim, KvFormat::mxfp4>(a, grid, stream);
    default: throw Error("cache page kernel: unsupported head_dim " + std::to_string(a.dims.d));
  }
}

// Quantized parts per page: K and V; a latent page has one (its r rows ride along).
int kv_parts(const CacheDims& dims) { return dims.latent() ? 1 : 2; }

}  // namespace

void prepare_page_kernels(const CacheDims& dims) {
  if (!dims.quantized()) return;
  PageKernelArgs a;
  a.dims = dims;
  launch(a, dim3(0, 0, 0), nullptr);  // an empty grid only prepares the kernel
}

void launch_prefill_pages(const CacheDims& dims, const CacheMem& mem, const PrefillArgs& args, cudaStream_t stream) {
  // Pages whose last token arrives in this chunk; without BF16 recent (quantize on write)
  // also the unfinished last page, quantized as it stands.
  const int page_lo = args.first / kPage;
  const int page_hi = dims.recent ? args.end / kPage : (args.end + kPage - 1) / kPage;
  if (page_hi <= page_lo) return;
  PageKernelArgs a;
  a.dims = dims;
  a.mem = mem;
  a.mode = PageMode::prefill;
  a.prefill = args;
  a.page_lo = page_lo;
  launch(a, dim3(page_hi - page_lo, dims.heads, kv_parts(dims)), stream);
}

void launch_requantize_open_pages(const CacheDims& dims, const CacheMem& mem, const StepPlan& plan,
                                  const StepArgs& step, cudaStream_t stream) {
  PageKernelArgs a;
  a.dims = dims;
  a.mem = mem;
  a.mode = PageMode::open_page;
  a.step = step;
  a.plan = plan;
  launch(a, dim3(step.batch, dims.heads, kv_parts(dims)), stream);
}

void launch_promote(const CacheDims& dims, const CacheMem& mem, const StepPlan& plan, const StepArgs& step,
                    cudaStream_t stream) {
  PageKernelArgs a;
  a.dims = dims;
  a.mem = mem;
  a.mode = PageMode::promote;
  a.step = step;
  a.plan = plan;
  // One CTA per (layer, head, K/V) and up to 4 promoting rows in parallel; each CTA loops
  // over the step's promotion list (usually empty: the CTAs exit at once).
  const int per_slice = step.batch < 4 ? step.batch : 4;
  launch(a, dim3(dims.layers * dims.heads, per_slice, kv_parts(dims)), stream);
}

}  // namespace fp4kv::cache::detail
