// Page quantization: one CTA builds one KV head's K part or V part of one cache block
// (layout.h) from 128 tokens. The tokens come from the prefill input (transformed and
// rounded to BF16 here) or from the slot's BF16 recent rows; either way the quantizer
// sees the BF16 values, so every path produces the same bytes (docs/DESIGN.md, "Cache
// semantics"). The block quantizers are core/block_quant.h's (FP8) and their straight-line
// twins in page_block_quant.cuh (NVFP4, MXFP4), bit-exact with the CPU.
//
// Phases: (A) rows -> BF16 tile in shared memory (rows loaded ahead per warp), (B) slice
// amax -> page scale, (C) codes and scales into shared memory at their layout positions: FP4
// by one thread per row pair (rows r, r + 8 of a 16-row tile share their 32-bit code words)
// and block column, through page_block_quant.cuh's straight-line block quantizers; FP8 one
// byte per element, (D) everything written out with 16-byte stores.
#include <climits>

#include "fp4kv/cache/cuda_check.h"
#include "fp4kv/cache/once_per_device.h"
#include "fp4kv/cache/device_common.cuh"
#include "fp4kv/cache/page_block_quant.cuh"
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
  static constexpr int stage_bytes = fp4 ? kPage * D / 2 : kPage * D;  // the codes, as stored
  static constexpr int scale_bytes = fp4 ? kPage * D / B : 0;  // same for K and V
  static constexpr int smem_bytes = tile_bytes + stage_bytes + (scale_bytes + 15) / 16 * 16;
  // Resident CTAs per SM the registers are capped for (measured on the H200, 8192-token
  // chunks at d = 128): FP4 3 (80 registers; NVFP4 70.9 us per layer against 72.1 with 4
  // CTAs, which spill ~500 bytes, MXFP4 67.4 against 75.0 with 2), FP8 4 (64 registers, its
  // per-element chain of dependent float operations wants the warps).
  static constexpr int kMinBlocks = fp4 ? 3 : 4;
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

// The codes of one block of row r < 8 of a 16-row A tile at their places in the A operand's
// 32-bit words (layout.h, fp4_code_address): element i of the block (k-step i / 16, column
// c = i % 16) goes to the word of lane 4 r + (c % 8) / 2 of its k-step, at its fragment
// element's slot, in nibble form (fp4_stored_word turns it into the stored bytes). Row r + 8
// shares those words one nibble higher.
template <int B>
struct PairWords {
  uint32_t w[B / 16][4] = {};
  __device__ __forceinline__ void put(int i, uint32_t code) {
    const FragmentSlot f = fragment_slot(0, i % 16);  // lane = the word's q = (c % 8) / 2
    w[i / 16][f.lane] |= code << (4 * fp4_word_slot(f.j));
  }
  __device__ __forceinline__ void merge(const PairWords& o) {
#pragma unroll
    for (int k = 0; k < B / 16; ++k)
#pragma unroll
      for (int q = 0; q < 4; ++q) w[k][q] |= o.w[k][q];
  }
};

// Block j of A-operand row `row` from the BF16 tile [token][channel] (K: the row is a token,
// blocks run along channels; V^T: the row is a channel, blocks run along tokens). A tile with
// non-finite values (`finite` false: a finite input beyond BF16's range rounds to infinity)
// has them read as 0, the core quantizers' finite_or_zero.
template <int D, int B, bool kKey>
__device__ __forceinline__ Bf16Block<B> load_block(const uint16_t* tile, int row, int j, bool finite) {
  Bf16Block<B> x;
  if constexpr (kKey) {
    const uint4* src = reinterpret_cast<const uint4*>(tile + row * D + j * B);
#pragma unroll
    for (int v = 0; v < B / 8; ++v) {
      const uint4 w = src[v];
      x.w[4 * v] = w.x, x.w[4 * v + 1] = w.y, x.w[4 * v + 2] = w.z, x.w[4 * v + 3] = w.w;
    }
  } else {
#pragma unroll
    for (int k = 0; k < B / 2; ++k)
      x.w[k] = uint32_t(tile[(j * B + 2 * k) * D + row]) | (uint32_t(tile[(j * B + 2 * k + 1) * D + row]) << 16);
  }
  if (!finite) {
#pragma unroll
    for (int k = 0; k < B / 2; ++k) {
      if ((x.w[k] & 0x7F80u) == 0x7F80u) x.w[k] &= 0xFFFF0000u;
      if ((x.w[k] & 0x7F800000u) == 0x7F800000u) x.w[k] &= 0x0000FFFFu;
    }
  }
  return x;
}

// (C) of an FP4 part: one thread per (row pair, block column); K's rows are the tokens, V^T's
// the channels. Consecutive threads take consecutive blocks of a token row (K) or
// consecutive channels (V: conflict-free column reads of the tile). Codes go to `words` (the
// part's code array, as stored), each row pair's two E4M3/E8M0 scales to one 16-bit
// scale_offset pair.
template <int D, KvFormat F, bool kKey, bool kSearch>
__device__ void quantize_fp4_part(const uint16_t* tile, bool finite, float g, uint32_t* words, uint8_t* scales) {
  constexpr int B = PageTraits<D, F>::B;
  constexpr int rows = kKey ? kPage : D, cols = kKey ? D : kPage;
  constexpr int row_blocks = cols / B, pairs = rows / 2, ksteps = cols / 16;
  static_assert(ksteps % 4 == 0 && B % 16 == 0, "whole 16-byte lane groups of k-steps");
  uint16_t* scale_pairs = reinterpret_cast<uint16_t*>(scales);
  for (int u = threadIdx.x; u < pairs * row_blocks; u += kThreads) {
    const int p = kKey ? u / row_blocks : u % pairs;
    const int j = kKey ? u % row_blocks : u / pairs;
    const int row0 = 16 * (p / 8) + p % 8;  // and row0 + 8
    uint32_t w[B / 16][4] = {}, scale_pair = 0;
#pragma unroll 1
    for (int h = 0; h < 2; ++h) {  // rows row0, row0 + 8: one copy of the block code
      const Bf16Block<B> x = load_block<D, B, kKey>(tile, row0 + 8 * h, j, finite);
      PairWords<B> c;
      uint32_t s;
      if constexpr (F == KvFormat::nvfp4) s = nvfp4_block_fast<kSearch>(x, g, c);
      else s = mxfp4_block_fast<kSearch>(x, c);
#pragma unroll
      for (int k = 0; k < B / 16; ++k)
#pragma unroll
        for (int q = 0; q < 4; ++q) w[k][q] |= c.w[k][q] << (4 * h);
      scale_pair |= s << (8 * h);
    }
#pragma unroll
    for (int k = 0; k < B / 16; ++k) {
      const int ks = j * (B / 16) + k;
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        // fp4_code_address(row0, 16 ks + 2 q, cols).byte / 4: the word of lane 4 (row0 % 8) + q
        const int lane = (row0 % 8) * 4 + q;
        words[(((row0 / 16) * (ksteps / 4) + ks / 4) * 32 + lane) * 4 + ks % 4] = fp4_stored_word(w[k][q]);
      }
    }
    // scale_offset(row0, j, row_blocks) / 2: row0's scale, row0 + 8's in the next byte.
    scale_pairs[((row0 / 16) * 8 + row0 % 8) * row_blocks + j] = uint16_t(scale_pair);
  }
}

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

  // (A) rows: every warp loads kRowsInFlight input rows (at most 16 floats per lane) before it
  // transforms any; FP8 (64 registers) two at d <= 256 (measured at d = 128: 109.4 us per
  // layer for an 8192-token chunk, 114.1 with four).
  constexpr int kRowsInFlight = T::fp4 && E <= 4 ? 4 : (E <= 8 ? 2 : 1);
  static_assert(kPage % (kThreads / 32 * kRowsInFlight) == 0, "whole groups of rows per warp");
  const float* mu = is_key ? mu_row(dims, mem, task.layer, task.head) : nullptr;
  const uint16_t* recent = slot_row(dims, mem, task.layer, task.slot, task.head, task.kv, kSinkTokens);
  int bad = 0;
  for (int t0 = warp; t0 < kPage; t0 += warps * kRowsInFlight) {
    RowFrag<D> in[kRowsInFlight];
#pragma unroll
    for (int u = 0; u < kRowsInFlight; ++u) {
      const int t = t0 + u * warps, pos = task.page * kPage + t;
      if (t < task.n_present && pos >= task.input_first)
        load_row<D>(task.input + (pos - task.input_first) * task.input_stride, lane, in[u]);
    }
#pragma unroll
    for (int u = 0; u < kRowsInFlight; ++u) {
      const int t = t0 + u * warps, pos = task.page * kPage + t;
      uint16_t v[E];
      if (t >= task.n_present) {
#pragma unroll
        for (int i = 0; i < E; ++i) v[i] = 0;
      } else if (pos >= task.input_first) {
        cached_row<D>(in[u], mu, is_key, dims.smooth, dims.rotate, lane, v, bad);
      } else {
        load_bf16<E>(recent + (pos % kPage) * dims.slot_row_stride() + lane * E, v);
      }
      store_bf16<E>(tile + t * D + lane * E, v);
    }
  }
  flush_nonfinite(task.count, bad);
  __syncthreads();

  // (B) slice amax over the finite values (the padding zeros change nothing), and whether
  // the tile holds any other.
  float amax = 0.0f;
  bool nonfinite = false;
  for (int i = tid * 8; i < kPage * D; i += kThreads * 8) {
    const uint4 w = *reinterpret_cast<const uint4*>(tile + i);
    const uint32_t words[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
    for (int q = 0; q < 8; ++q) {
      const float x = bf16_bits_to_float_dev(uint16_t(words[q / 2] >> (16 * (q % 2))));
      if (is_finite(x)) amax = max_f(amax, abs_f(x));
      else nonfinite = true;
    }
  }
  amax = block_max(amax, scratch_f);
  const bool finite = !__syncthreads_or(nonfinite);

  // (C) codes and block scales.
  float page_scale = 1.0f;
  if constexpr (T::fp4) {
    const float g = F == KvFormat::nvfp4 ? nvfp4_global_scale(amax) : 1.0f;
    uint32_t* words = reinterpret_cast<uint32_t*>(stage);
    if (!is_key) quantize_fp4_part<D, F, false, false>(tile, finite, g, words, scales);
    else if (dims.search) quantize_fp4_part<D, F, true, true>(tile, finite, g, words, scales);
    else quantize_fp4_part<D, F, true, false>(tile, finite, g, words, scales);
    if (F == KvFormat::nvfp4) page_scale = g;
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
    for (int i = tid; i < T::stage_bytes / 16; i += kThreads)
      *reinterpret_cast<uint4*>(codes_dst + 16 * i) = *reinterpret_cast<const uint4*>(stage + 16 * i);
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

template <int D, KvFormat F>
cudaError_t set_page_kernel_smem() {
  return cudaFuncSetAttribute(page_kernel<D, F>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                              PageTraits<D, F>::smem_bytes);
}

// Raises the kernel's dynamic shared memory limit once per device (KvCache's constructor
// does it, so that no attribute call happens while a stream is being captured).
template <int D, KvFormat F>
void prepare_t() {
  cuda_check(once_per_device<set_page_kernel_smem<D, F>>(), "cache page kernel: reserve shared memory");
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
